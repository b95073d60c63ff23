"""What the tests' reset puts in place, made while the agent runs (pipeline/steps.py ``_ready_for_tests``):
the workspace cache's HOME and venv as overlays attached nowhere (warm.py ``prepare_reset``) and an empty
/tmp of root's (``Session.prepare_tmp``). The agent cannot reach any of it, the tests get exactly what
the install step left, and where nothing could be made ahead the reset makes it, as before."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat

import pytest

from evaluations.cache import mounts, overlay
from evaluations.pipeline import session as session_module
from tests.helpers.archives import Exec
from tests.helpers.tasks import SOLVER
from tests.pipeline.test_cache_e2e import BASE, INSTALL, VANDAL, _passed, _tests
from tests.security.support import evaluate, kept_session

pytestmark = [pytest.mark.django_db(transaction=True)]

if os.geteuid() != 0:
    pytest.skip("the workspace cache and the tests' overlays need root", allow_module_level=True)

# The agent vandalises HOME, the venv and /tmp, then looks for what is made for the tests beside its
# repository: the session folder as its sandbox shows it, and a write where the tests' /tmp is made.
REACHING = (
    VANDAL
    + """
import json, os, pathlib
pathlib.Path('/tmp/left-by-the-agent').write_text('x')
session = pathlib.Path(os.environ['REPO_DIR']).parent
try:
    (session / '.tmp-tests' / 'planted').write_text('x')
    planted = True
except OSError:
    planted = False
print('REACH ' + json.dumps({'session': sorted(os.listdir(session)), 'planted': planted}))
"""
)
# The tests see an empty /tmp, theirs, but for the sandbox's mount points: the session's folders are
# bound at their own paths, which are below /tmp here, on folders of the host's root (nobody's here).
CLEAN_TMP = Exec(
    "#!/bin/bash\nset -e\n"
    "test ! -e /tmp/left-by-the-agent && test ! -e /tmp/planted\n"
    'test -z "$(find /tmp -mindepth 1 -maxdepth 2 \\( -not -type d -o -uid "$(id -u)" \\))"\n'
    'test "$(stat -c %u /tmp)" = "$(id -u)"\n'
    "echo tmp-clean\n"
)


def _detached_calls(monkeypatch) -> list[str]:
    """The layers of every overlay of the cache's made, in order."""
    calls: list[str] = []
    real = overlay.detached_folder

    def recording(entry, name, root, uid, *, layers, **more):
        calls.append(layers)
        return real(entry, name, root, uid, layers=layers, **more)

    monkeypatch.setattr(overlay, "detached_folder", recording)
    return calls


def test_the_tests_home_venv_and_tmp_are_made_while_the_agent_runs_and_out_of_its_reach(tasks, e2e_config, monkeypatch):
    calls = _detached_calls(monkeypatch)
    kept = dataclasses.replace(e2e_config, keep_workspaces=True)
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests(**{"pass_to_pass_tmp.sh": CLEAN_TMP}))
    evaluation = evaluate(url, REACHING, config=kept, sandbox="bwrap")
    _passed(evaluation)  # HOME and the venv as install left them (pass_to_pass_installed), /tmp empty
    assert "tmp-clean" in evaluation.test_output
    reach = json.loads(next(line[6:] for line in evaluation.agent_output.splitlines() if line.startswith("REACH ")))
    assert reach["planted"] is False
    assert ".tmp-tests" not in reach["session"] and ".layers" not in reach["session"], reach
    # Each folder mounted once for the agent (repo, venv, home: the miss's new entry), then the tests'
    # HOME and venv made ahead and swapped in: none made again after the agent's end.
    assert calls == ["repo", "venv", "home", "venv-tests", "home-tests"]
    session = kept_session(kept, evaluation)
    layers = sorted(p.name for p in (session / overlay.LAYERS).iterdir())
    made = [
        f"{name}.{part}" for name in ("home-tests", "repo", "tests-repo", "venv-tests") for part in ("upper", "work")
    ]
    assert layers == sorted([overlay.LOWER, *made])  # the agent's HOME and venv layers gone
    assert not (session / session_module.NEXT_TMP).exists()


def test_where_nothing_can_be_made_ahead_the_reset_makes_it(tasks, e2e_config, monkeypatch):
    calls = _detached_calls(monkeypatch)
    real = overlay.detached_folder

    def refusing(entry, name, root, uid, *, layers, **more):
        if layers.endswith("-tests"):
            raise mounts.MountError(errno.EINVAL, "refused")
        return real(entry, name, root, uid, layers=layers, **more)

    monkeypatch.setattr(overlay, "detached_folder", refusing)

    def no_tmp(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(session_module.Session, "prepare_tmp", no_tmp)
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests(**{"pass_to_pass_tmp.sh": CLEAN_TMP}))
    evaluation = evaluate(url, VANDAL + "\nimport pathlib; pathlib.Path('/tmp/left-by-the-agent').write_text('x')\n",
                          config=e2e_config, sandbox="bwrap")  # fmt: skip
    _passed(evaluation)
    assert "tmp-clean" in evaluation.test_output
    # The refused ones are not recorded (the refusal comes first); HOME and the venv are made again after
    # the agent's end, with the layers' usual names.
    assert calls == ["repo", "venv", "home", "venv", "home"], calls


def test_what_was_made_for_tests_that_never_run_is_let_go(tasks, e2e_config, monkeypatch):
    """The agent over its time: the tests do not run, and the overlays made for them, attached
    nowhere, go with their descriptors (each overlay has a device of its own: none is still open)."""
    made: list[tuple[int, int, int]] = []
    real = mounts.overlay_detached

    def recording(lower, upper, work):
        fd = real(lower, upper, work)
        st = os.fstat(fd)
        made.append((fd, st.st_dev, st.st_ino))
        return fd

    monkeypatch.setattr(mounts, "overlay_detached", recording)
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests())
    sleeper = SOLVER + "\nimport signal; signal.pause()\n"  # until the agent's timeout ends it
    evaluation = evaluate(url, sleeper, config=e2e_config, sandbox="bwrap", timeout_secs=3)
    assert evaluation.error_kind == "agent_timeout", evaluation.error
    assert len(made) == 5  # repo, venv and home for the agent; venv and home for the tests
    for fd, dev, ino in made:
        try:
            st = os.fstat(fd)
        except OSError as exc:
            assert exc.errno == errno.EBADF
            continue
        assert (st.st_dev, st.st_ino) != (dev, ino), "an overlay made for the tests is still open"


def test_reset_tmp_takes_the_prepared_folder_only_if_it_is_the_executors(tmp_path):
    uid = 65534
    session = session_module.Session.create(tmp_path / "base", "e1", uid)
    (session.tmp / "left").write_text("x")
    ready = session.prepare_tmp()
    (ready / "point").mkdir()  # a mount point made for the tests' sandbox, root's
    session.reset_tmp()
    assert sorted(os.listdir(session.tmp)) == ["point"] and not ready.exists()
    st = os.lstat(session.tmp)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700)
    with pytest.raises(FileExistsError):
        session.prepare_tmp() and session.prepare_tmp()
    os.chown(ready, uid, uid)  # not the executor's any more
    with pytest.raises(PermissionError):
        session.reset_tmp()
    # Without one, an empty folder made there and then.
    os.rmdir(ready)
    session.reset_tmp()
    assert os.listdir(session.tmp) == [] and os.lstat(session.tmp).st_uid == uid
