"""Running whole evaluations in this process, and the check every attack test ends with."""

from __future__ import annotations

import stat
from pathlib import Path

from evaluations import lifecycle
from evaluations.models import Evaluation, Status
from evaluations.runtime.killer import tagged
from tests.helpers.http import request
from tests.helpers.polling import submit, wait_terminal
from tests.helpers.runtimes import run_evaluation
from tests.helpers.tasks import SOLVER


def evaluate(task_url, agent_code, *, config, sandbox, language="python", env=None, timeout_secs=None):
    """One evaluation through the real pipeline; nothing of it may outlive it."""
    evaluation = Evaluation.objects.create(
        task_url=task_url, agent_code=agent_code, language=language, env=env or {}, timeout_secs=timeout_secs
    )
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(str(evaluation.id), config, sandbox)
    evaluation.refresh_from_db()
    assert not tagged(str(evaluation.id)), "a process of the evaluation outlived it"
    if not config.keep_workspaces:
        assert not (config.workspace_base / str(evaluation.id)).exists(), "its session folder outlived it"
    return evaluation


def still_works(tasks, config, sandbox) -> None:
    """After an attack: an ordinary evaluation of a fresh task passes."""
    evaluation = evaluate(tasks.task(), SOLVER, config=config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)


def live_still_works(service, tasks) -> None:
    """After an attack on a live service: /health is ok and a solving evaluation passes."""
    assert request("GET", service.url("/health")).json() == {"status": "ok"}
    body = wait_terminal(service, submit(service, tasks.task(), SOLVER))
    assert (body["status"], body["passed"]) == ("completed", True), body["error"]


def kept_session(config, evaluation) -> Path:
    """The session folder of an evaluation run with keep_workspaces=True."""
    return config.workspace_base / str(evaluation.id)


def assert_executor_entries_intact(session: Path, agent_code: str) -> None:
    """What the service wrote itself is still its own: real folders and files, root's."""
    # saved/ holds HOME and the venv for the tests unless the workspace cache's layers do.
    for folder in ("tests", "agent", *(("saved",) if (session / "saved").exists() else ())):
        st = (session / folder).lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0, folder
    for script in (session / "tests").iterdir():
        assert script.is_file() and not script.is_symlink() and script.lstat().st_uid == 0
    assert (session / "agent" / "prompt.md").read_text() == "Make add() add.\n"
    assert (session / "agent" / "agent.py").read_text() == agent_code
