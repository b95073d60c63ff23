"""The workspace cache end to end (SPEC §13): whole evaluations through the pipeline, without and
with bubblewrap, against real repositories served over HTTP."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from django.db import OperationalError

from evaluations.cache.store import Store
from evaluations.models import Evaluation
from evaluations.pipeline.cancel import CancelState, Stop
from tests.helpers.archives import Exec
from tests.helpers.runtimes import REGISTRIES
from tests.helpers.tasks import ADD_TEST, BUGGY, FIXED, SOLVER
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_toolchains_e2e import PYPROJECT

pytestmark = pytest.mark.django_db(transaction=True)

if os.geteuid() != 0:
    pytest.skip("the workspace cache needs root (idmapped mounts)", allow_module_level=True)

# The install step leaves something in each of the three places a snapshot keeps, and says so in the log.
INSTALL_SH = """\
echo INSTALL-RAN-$RANDOM
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo 'FROM = "install"' > "$site/installed_mod.py"
echo from-install > "$HOME/install-note"
echo build-output > build.txt
"""
BASE = {"calc.py": BUGGY, "install.sh": INSTALL_SH, ".gitignore": "build.txt\n"}
INSTALL = ["bash install.sh"]
INSTALLED = Exec(
    "#!/bin/bash\nset -e\n"
    "python3 -c 'import installed_mod; assert installed_mod.FROM == \"install\"'\n"
    'test "$(cat "$HOME/install-note")" = from-install\n'
    "echo installed-ok\n"
)


def _tests(**more):
    return {"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_installed.sh": INSTALLED, **more}


def _store(config) -> Store:
    return Store(config.cache_root)


def _passed(evaluation) -> None:
    assert (evaluation.status, evaluation.error) == ("completed", ""), (
        evaluation.error + evaluation.test_output[-2000:] + evaluation.log[-3000:]
    )


def test_the_second_evaluation_of_a_task_starts_from_the_snapshot(tasks, e2e_config, sandbox):
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests())
    first = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    _passed(first)
    assert first.cache == "miss" and "INSTALL-RAN" in first.log
    second = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    _passed(second)
    assert second.cache == "hit"
    assert "INSTALL-RAN" not in second.log  # neither cloned nor installed: the snapshot's state
    steps = [t.step for t in second.transitions.all()]
    assert steps == ["queued", "downloading_task", "preparing_environment", "cloning_repo", "installing_deps", "installing_agent",
                     "running_agent", "running_tests", "cleanup", "done"]  # fmt: skip
    assert second.agent_patch == first.agent_patch  # the same diff, from the same base and install
    (entry,) = _store(e2e_config).all_entries()
    assert entry.hits()[0] == 1
    assert entry.meta["commit"] == tasks.last_shas[0]


def _repo_task(tasks, repo_url: str, base: str, *, install=("bash install.sh",), env: dict | None = None, more=""):
    """A task of an existing repository at ``base``: tasks built this way share a mirror and may share a key."""
    yaml = f"repo: {repo_url}\nbase_commit: {base}\ninstall:\n" + "".join(f"  - {c}\n" for c in install)
    if env:
        yaml += "env:\n" + "".join(f"  {name}: '{value}'\n" for name, value in env.items())
    return tasks.task(workspace=yaml + more, tests=_tests())


def test_the_key_is_the_commit_the_install_commands_the_env_and_the_environment(tasks, e2e_config):
    repo_url, (first_base, second_base, _fix) = tasks.repo(
        [BASE, {"notes.txt": "a second commit, still buggy\n"}, {"calc.py": FIXED}]
    )
    runs = [
        ("first", _repo_task(tasks, repo_url, first_base), "miss"),
        ("same task again", _repo_task(tasks, repo_url, first_base), "hit"),
        ("another base commit", _repo_task(tasks, repo_url, second_base), "miss"),
        (
            "other install commands",
            _repo_task(tasks, repo_url, first_base, install=["bash install.sh", "echo extra"]),
            "miss",
        ),
        ("another task env", _repo_task(tasks, repo_url, first_base, env={"MODE": "fast"}), "miss"),
        ("the env again", _repo_task(tasks, repo_url, first_base, env={"MODE": "fast"}), "hit"),
        ("the first again", _repo_task(tasks, repo_url, first_base), "hit"),
    ]
    seen = []
    for label, url, _ in runs:
        evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap")
        _passed(evaluation)
        seen.append((label, evaluation.cache))
    assert seen == [(label, expected) for label, _, expected in runs]
    store = _store(e2e_config)
    assert len(store.all_entries()) == 4
    assert len(store.mirror_names()) == 1  # one mirror for the repository, whatever the tasks


@pytest.fixture
def host_environments():
    """ENVIRONMENTS_ROOT with two environments made of the host's own /usr (bound read-only): cheap, real."""
    root = Path(tempfile.mkdtemp(prefix="te-cache-envs-", dir="/tmp"))
    os.chmod(root, 0o755)
    for name in ("alpha", "beta"):
        tree = root / name
        (tree / "usr").mkdir(parents=True)
        os.chmod(tree, 0o755)
        subprocess.run(["mount", "--bind", "-o", "ro", "/usr", str(tree / "usr")], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(tree / "usr")], check=True)
        for link in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink(f"/{link}"):
                (tree / link).symlink_to(f"usr/{link}")
        (tree / "etc").mkdir()
    try:
        yield root
    finally:
        for name in ("alpha", "beta"):
            subprocess.run(["umount", str(root / name / "usr")], check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_another_environment_or_a_rebuilt_one_is_another_key(tasks, e2e_config, host_environments):
    config = dataclasses.replace(e2e_config, environments_root=host_environments)
    repo_url, (base, _fix) = tasks.repo([BASE, {"calc.py": FIXED}])
    alpha = _repo_task(tasks, repo_url, base, more="environment: alpha\n")
    beta = _repo_task(tasks, repo_url, base, more="environment: beta\n")
    uses = [evaluate(url, SOLVER, config=config, sandbox="bwrap") for url in (alpha, alpha, beta)]
    for evaluation in uses:
        _passed(evaluation)
    assert [e.cache for e in uses] == ["miss", "hit", "miss"]
    # Rebuilt (make_environment writes a new stamp id): its identity changes, the snapshot is not reused.
    (host_environments / "alpha" / ".term-executor-environment").write_text(json.dumps({"id": "rebuilt"}))
    rebuilt = evaluate(alpha, SOLVER, config=config, sandbox="bwrap")
    _passed(rebuilt)
    assert rebuilt.cache == "miss"


# An agent that solves the task and then vandalises every place the snapshot came from.
VANDAL = (
    SOLVER
    + """
import os, pathlib, sysconfig
import subprocess  # the venv's site-packages, as the agent's commands see it (its own python is the executor's)
site = pathlib.Path(subprocess.run(['python3', '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                                   capture_output=True, text=True, check=True).stdout.strip())
(site / 'installed_mod.py').write_text('FROM = "agent"\\n')
(site / 'planted.pth').write_text('import sys; sys.exit(3)\\n')
(site / 'planted_mod.py').write_text('X = 1\\n')
home = pathlib.Path(os.environ['HOME'])
(home / 'planted').write_text('x')
(home / 'install-note').write_text('changed by the agent')
hooks = pathlib.Path('.git/hooks'); hooks.mkdir(exist_ok=True)
(hooks / 'pre-commit').write_text('#!/bin/sh\\nexit 1\\n'); (hooks / 'pre-commit').chmod(0o755)
pathlib.Path('build.txt').write_text('agent')
pathlib.Path('agent_file.py').write_text('x = 1\\n')
pathlib.Path('install.sh').unlink()
print('VANDALISED')
"""
)
# An agent that reports what it finds (before solving), the future included.
PROBE = """
import json, os, pathlib, subprocess, sysconfig
import subprocess  # the venv's site-packages, as the agent's commands see it (its own python is the executor's)
site = pathlib.Path(subprocess.run(['python3', '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                                   capture_output=True, text=True, check=True).stdout.strip())
home = pathlib.Path(os.environ['HOME'])
def git(*args):
    return subprocess.run(['git', *args], capture_output=True, text=True)
seen = {
    'calc': pathlib.Path('calc.py').read_text(),
    'site': sorted(p.name for p in site.iterdir()),
    'installed_mod': (site / 'installed_mod.py').read_text(),
    'home': sorted(p.name for p in home.iterdir()),
    'note': (home / 'install-note').read_text(),
    'hooks': os.path.exists('.git/hooks'),
    'build': pathlib.Path('build.txt').read_text(),
    'files': sorted(p.name for p in pathlib.Path('.').iterdir()),
    'all_commits': git('log', '--all', '--reflog', '--format=%H').stdout.split(),
    'fix_object': git('cat-file', '-e', os.environ['FIX']).returncode,
    'refs': git('for-each-ref').stdout,
    'uid': os.getuid(),
    'owners': sorted({p.lstat().st_uid for p in [pathlib.Path('calc.py'), site / 'installed_mod.py', home / 'install-note']}),
}
print('SEEN ' + json.dumps(seen))
f = pathlib.Path('calc.py'); f.write_text(f.read_text().replace('a - b', 'a + b'))
"""


def _seen(evaluation) -> dict:
    line = next(line for line in evaluation.agent_output.splitlines() if line.startswith("SEEN "))
    return json.loads(line[5:])


def test_what_an_agent_does_to_its_copy_never_reaches_the_next_evaluation(tasks, e2e_config, sandbox):
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests())
    base, fix = tasks.last_shas
    vandal = evaluate(url, VANDAL, config=e2e_config, sandbox=sandbox)
    _passed(vandal)  # its own tests got HOME and the venv back as install left them
    assert vandal.cache == "miss" and "VANDALISED" in vandal.agent_output
    probe = evaluate(url, PROBE, config=e2e_config, sandbox=sandbox, env={"FIX": fix})
    _passed(probe)
    assert probe.cache == "hit"
    seen = _seen(probe)
    assert seen["calc"] == BUGGY
    assert "planted.pth" not in seen["site"] and "planted_mod.py" not in seen["site"]
    assert seen["installed_mod"] == 'FROM = "install"\n'
    assert seen["home"] == ["install-note"] and seen["note"] == "from-install\n"
    assert seen["hooks"] is False
    assert seen["build"] == "build-output\n"
    assert "agent_file.py" not in seen["files"] and "install.sh" in seen["files"]
    # Its own writable copy: everything is its uid's.
    assert seen["owners"] == [seen["uid"]]
    # The future stays hidden on a hit, though the mirror it came from holds it.
    assert seen["all_commits"] == [base] and seen["fix_object"] != 0 and seen["refs"] == ""
    (mirror,) = _store(e2e_config).mirror_names()
    held = subprocess.run(["git", "cat-file", "-e", fix], cwd=_store(e2e_config).mirrors / mirror)
    assert held.returncode == 0
    (entry,) = _store(e2e_config).all_entries()
    assert _store(e2e_config).verify(entry) is None


def test_a_damaged_snapshot_is_rebuilt_not_served(tasks, e2e_config):
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests())
    _passed(evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap"))
    (entry,) = _store(e2e_config).all_entries()
    os.unlink(entry.path / "home" / "install-note")
    damaged = evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap")
    _passed(damaged)
    assert damaged.cache == "miss" and "INSTALL-RAN" in damaged.log
    again = evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap")
    _passed(again)
    assert again.cache == "hit"


@pytest.mark.parametrize("how", ["workspace.yaml", "WORKSPACE_CACHE=off"])
def test_opting_out(tasks, e2e_config, how):
    config = e2e_config
    if how == "workspace.yaml":
        repo_url, (base, _fix) = tasks.repo([BASE, {"calc.py": FIXED}])
        url = _repo_task(tasks, repo_url, base, more="cache: false\n")
    else:
        config = dataclasses.replace(e2e_config, workspace_cache="off")
        url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests())
    uses = [evaluate(url, SOLVER, config=config, sandbox="bwrap") for _ in range(2)]
    for evaluation in uses:
        _passed(evaluation)
        assert "INSTALL-RAN" in evaluation.log
    assert [e.cache for e in uses] == ["off", "off"]
    assert _store(config).all_entries() == [] and _store(config).mirror_names() == []


def test_an_unusable_cache_folder_means_cold_evaluations_not_failed_ones(tasks, e2e_config):
    e2e_config.cache_root.write_text("a file where the cache folder should be")
    url = tasks.task(base_files=BASE, install=INSTALL, tests=_tests())
    uses = [evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap") for _ in range(2)]
    for evaluation in uses:
        _passed(evaluation)
    assert [e.cache for e in uses] == ["miss", "miss"]
    e2e_config.cache_root.unlink()


BIG_INSTALL_SH = INSTALL_SH + 'head -c 3000000 /dev/urandom > "$HOME/big.bin"\n'


def test_a_full_cache_disk_means_cold_evaluations_not_failed_ones(tasks, e2e_config):
    """The cache on a 1 MiB tmpfs: the mirror fits, the snapshot (3 MB in HOME) does not."""
    e2e_config.cache_root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(e2e_config.cache_root)], check=True)
    try:
        url = tasks.task(base_files={**BASE, "install.sh": BIG_INSTALL_SH}, install=INSTALL, tests=_tests())
        uses = [evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap") for _ in range(2)]
        for evaluation in uses:
            _passed(evaluation)
            assert "INSTALL-RAN" in evaluation.log
        assert [e.cache for e in uses] == ["miss", "miss"]
        store = _store(e2e_config)
        assert store.all_entries() == [] and store.builds() == []
    finally:
        subprocess.run(["umount", str(e2e_config.cache_root)], check=True)


PACKAGE_TEST = """\
import os, sys, tcpkg, tomli

def test_add():
    assert tcpkg.add(2, 3) == 5

def test_paths_are_this_sessions():
    venv = os.environ['VIRTUAL_ENV']
    assert sys.prefix == venv and tomli.__file__.startswith(venv + '/lib/')
    assert tcpkg.__file__.startswith(os.path.dirname(venv) + '/repo/'), tcpkg.__file__
"""
PACKAGE_SOLVER = """\
import pathlib
f = pathlib.Path('tcpkg/__init__.py')
f.write_text(f.read_text().replace('a - b', 'a + b'))
"""


@pytest.mark.slow
def test_a_real_editable_install_from_pypi_runs_from_the_snapshot_in_another_session(tasks, e2e_config, sandbox):
    """`pip install -e .` writes the session's path into the venv (launchers, the editable finder):
    on a hit they name the new session's repository and venv, where the agent's fix is."""
    config = dataclasses.replace(e2e_config, install_timeout_secs=300, egress_allow=REGISTRIES)  # PyPI, by name
    url = tasks.task(
        base_files={"pyproject.toml": PYPROJECT, "tcpkg/__init__.py": BUGGY},
        future={"tcpkg/__init__.py": FIXED},
        install=["pip install -e .", "pip install pytest"],
        tests={"fail_to_pass_add.sh": "pytest -q -p no:cacheprovider test_tcpkg.py\n", "test_tcpkg.py": PACKAGE_TEST},
    )
    uses = [evaluate(url, PACKAGE_SOLVER, config=config, sandbox=sandbox) for _ in range(2)]
    for evaluation in uses:
        _passed(evaluation)
        assert "2 passed" in evaluation.test_output
    assert [e.cache for e in uses] == ["miss", "hit"]
    (entry,) = _store(config).all_entries()
    rewritten = _store(config).manifest(entry)["rewrite"]
    assert "venv/bin/pytest" in rewritten and any("__editable__" in p for p in rewritten), rewritten


def _nothing_stored(config) -> None:
    store = _store(config)
    assert store.all_entries() == [] and store.builds() == []
    for lock in store.locks.iterdir():  # every build lock free again
        fd = store.try_build_lock(lock.stem)
        assert fd is not None, lock
        os.close(fd)


def test_a_failed_install_stores_nothing(tasks, e2e_config):
    url = tasks.task(base_files=BASE, install=["bash install.sh", "test -f no-such-file"], tests=_tests())
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap")
    assert evaluation.status == "failed" and evaluation.error.startswith("installing_deps: install command")
    assert evaluation.cache == "miss"
    _nothing_stored(e2e_config)


def test_a_cancelled_install_stores_nothing(tasks, e2e_config):
    cancel = CancelState()
    url = tasks.task(base_files=BASE, install=["bash install.sh", "sleep 60"], tests=_tests())

    def cancel_when_installing():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                row = Evaluation.objects.filter(task_url=url).values("step").first()
            except OperationalError:
                continue  # the in-memory test database locks whole tables between threads
            if row and row["step"] == "installing_deps":
                time.sleep(0.5)  # into the sleep
                cancel.set(Stop.CANCELLED, "cancelled by DELETE")
                return

    thread = threading.Thread(target=cancel_when_installing)
    thread.start()
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap", cancel=cancel)
    thread.join()
    assert (evaluation.status, evaluation.error) == ("cancelled", "installing_deps: cancelled by DELETE")
    _nothing_stored(e2e_config)
