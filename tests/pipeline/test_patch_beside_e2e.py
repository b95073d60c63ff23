"""The agent's patch made beside the tests (SPEC §25, pipeline/agentpatch.py, pipeline/repoview.py): the
tests write in a view of the repository of their own, the patch reads the repository as the agent left
it, and whatever the tests do the patch is the agent's; where no view can be made, the patch is made
before the tests, as before."""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import threading

import pytest

from evaluations.cache import mounts
from evaluations.pipeline import agentpatch, patch, repoview
from evaluations.pipeline.cancel import CancelState, Stop
from evaluations.safefs import remove_tree_nofollow
from tests.helpers.archives import Exec
from tests.helpers.polling import wait_for
from tests.helpers.tasks import BUGGY, SOLVER
from tests.pipeline.test_e2e import evaluate
from tests.security.support import evaluate as evaluate_kept
from tests.security.support import kept_session

pytestmark = [pytest.mark.django_db(transaction=True)]

BASE = {"calc.py": BUGGY, "README.md": "read me\n", "data/keep.txt": "kept\n"}
NOTES = "pathlib.Path('notes.txt').write_text('the agent was here\\n')\n"
# The tests see the agent's work, then change the repository every way they can.
MESSY_TEST = Exec(
    "#!/bin/bash\nset -e\n"
    "grep -q 'a + b' calc.py && test -f notes.txt\n"
    "echo '# edited by the tests' >> calc.py\n"
    "rm README.md data/keep.txt\n"
    "echo made > made_by_tests.txt\n"
    "mkdir -p .pytest_cache && echo cache > .pytest_cache/v\n"
    "python3 -c 'from calc import add; assert add(2, 3) == 5' && echo add-ok\n"
)


def _agent_patch_only(text: str) -> None:
    assert "+    return a + b" in text and "b/notes.txt" in text, text
    for theirs in ("edited by the tests", "made_by_tests", "README.md", "keep.txt", ".pytest_cache"):
        assert theirs not in text, text


def _refuse_the_view(monkeypatch) -> None:
    """The kernel refuses the view's mount (EINVAL, as for overlays stacked too deep); every other
    overlay is mounted as before."""
    real = mounts.mount_overlay

    def refusing(lower, upper, work, target):
        if target.name == repoview.VIEW:
            raise mounts.MountError(errno.EINVAL, f"overlay at {target}: {os.strerror(errno.EINVAL)}")
        real(lower, upper, work, target)

    monkeypatch.setattr(mounts, "mount_overlay", refusing)


def _messy_tests_kept(tasks, e2e_config):
    """The messy tests' evaluation, its session folder kept: (the evaluation, that folder)."""
    kept = dataclasses.replace(e2e_config, keep_workspaces=True)
    url = tasks.task(base_files=BASE, tests={"fail_to_pass_add.sh": MESSY_TEST})
    evaluation = evaluate_kept(url, SOLVER + NOTES, config=kept, sandbox="bwrap")
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    _agent_patch_only(evaluation.agent_patch)
    return evaluation, kept_session(kept, evaluation)


def test_the_tests_write_in_a_view_of_their_own_while_the_patch_reads_what_the_agent_left(tasks, e2e_config):
    evaluation, session = _messy_tests_kept(tasks, e2e_config)
    try:
        assert mounts.mount_points_below(session) == []  # the view went at cleanup, with the rest
        upper = session / ".layers" / f"{repoview.VIEW}.upper"  # what the tests wrote, and only there
        assert (upper / "made_by_tests.txt").read_text() == "made\n"
        assert (upper / "calc.py").read_text().endswith("# edited by the tests\n")
        whiteout = (upper / "README.md").lstat()
        assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0  # overlayfs's mark of a removal
        assert upper.stat().st_uid == (upper / "made_by_tests.txt").stat().st_uid != 0  # the repository's owner's
    finally:
        remove_tree_nofollow(session)


def test_where_no_view_can_be_mounted_the_patch_is_made_before_the_tests(tasks, e2e_config, monkeypatch):
    """Not root, a session folder on an overlay (in a container): the kernel refuses the view's mount,
    and the tests run in the repository once the patch is made, as before."""
    _refuse_the_view(monkeypatch)
    evaluation, session = _messy_tests_kept(tasks, e2e_config)
    try:
        assert not (session / repoview.VIEW).exists() and not (session / ".layers" / repoview.VIEW).exists()
    finally:
        remove_tree_nofollow(session)


def test_the_view_counts_against_the_disk_limits_what_the_tests_write_not_the_repository_again(
    tasks, e2e_config, monkeypatch
):
    """The session's disk walk does not enter the view (a mount: safefs.walk_nofollow stays on one file
    system): the repository's 2000 files count as when the tests ran in it, and what the tests write
    counts in the view's upper layer, a folder of the session."""
    many = {f"many/f{i}.txt": f"{i}\n" for i in range(2000)}
    url = tasks.task(base_files={**BASE, **many}, tests={"fail_to_pass_add.sh": MESSY_TEST})
    evaluate(url, SOLVER + NOTES, config=e2e_config, sandbox="bwrap")  # the workspace cache's entry made
    beside = evaluate(url, SOLVER + NOTES, config=e2e_config, sandbox="bwrap")
    _refuse_the_view(monkeypatch)
    before = evaluate(url, SOLVER + NOTES, config=e2e_config, sandbox="bwrap")
    assert beside.passed and before.passed, (beside.error, before.error)
    files = beside.resources["peak_files"], before.resources["peak_files"]
    # Walked, the view would add the repository's 2000 files; the peaks differ by a few hundred files
    # either way from run to run (which command's end saw the most of the patch's scratch folder).
    assert files[0] - files[1] < 1000, (beside.resources, before.resources)


def test_a_patch_that_fails_beside_the_tests_is_made_again_and_reported_as_before(tasks, e2e_config, monkeypatch):
    """An agent's patch over its size limit: refused beside the tests, then made again in the patch's
    phase, which says why, as when it was made before them. The tests pass all the same."""
    calls = []
    real = patch.repo_patch

    def counted(*args, **kwargs):
        calls.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(patch, "repo_patch", counted)
    config = dataclasses.replace(e2e_config, max_output_bytes=1000)  # a patch of 8000 bytes at most
    big = "pathlib.Path('big.txt').write_text(''.join(f'line {i}\\n' for i in range(2000)))\n"
    evaluation = evaluate(tasks.task(), SOLVER + big, config=config, sandbox="bwrap")
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    assert evaluation.agent_patch.startswith("(no patch: agent patch is "), evaluation.agent_patch[:200]
    assert evaluation.agent_patch.endswith("bytes, over the limit of 8000 bytes)")
    assert calls == ["phase-beside", "MainThread"], calls


def test_a_cancel_during_the_tests_keeps_the_patch_made_beside_them(tasks, e2e_config):
    cancel, seen = CancelState(), {}
    sleeper = Exec("#!/bin/bash\ntouch started-tests\nsleep 600\n")
    url = tasks.task(base_files=BASE, tests={"fail_to_pass_add.sh": sleeper})

    def cancel_once_the_tests_run():
        def state():
            for view in e2e_config.workspace_base.glob(f"*/{repoview.VIEW}"):
                # the patch's scratch folder goes once the patch is made
                if (view / "started-tests").exists() and not any(view.parent.glob(".agent-patch-*")):
                    return True
            return False

        try:
            wait_for(state, 60, what="the tests to start, the patch made beside them")
        except AssertionError as exc:
            seen["waited"] = str(exc)
        cancel.set(Stop.CANCELLED, "cancelled by DELETE")

    thread = threading.Thread(target=cancel_once_the_tests_run)
    thread.start()
    evaluation = evaluate(url, SOLVER + NOTES, config=e2e_config, sandbox="bwrap", cancel=cancel)
    thread.join()
    assert seen == {}
    assert (evaluation.status, evaluation.error) == ("cancelled", "running_tests: cancelled by DELETE")
    _agent_patch_only(evaluation.agent_patch)
    assert evaluation.agent_patch != agentpatch.UNFINISHED
