"""The lifecycle bugs found by reading (issue 13), each with the test that would have caught it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from evaluations import lifecycle
from evaluations.models import TTL_EXPIRED, Evaluation, Status
from evaluations.pipeline.cancel import CancelState, Stop, watch_row
from evaluations.worker.claim import claim
from evaluations.worker.loop import Worker
from evaluations.worker.pool import Running
from tests.helpers.polling import evaluation, submit, wait_for, wait_terminal
from tests.helpers.runtimes import run_evaluation
from tests.helpers.tasks import SOLVER

pytestmark = pytest.mark.django_db(transaction=True)


class PoolThatCannotStart:
    """The pool's start as it fails when the forkserver is gone or the host is out of processes."""

    capacity = free = 2
    running: dict = {}

    def start(self, eval_id):
        raise OSError(11, "Resource temporarily unavailable")


def worker_command(pool) -> Worker:
    return Worker(settings.EXECUTOR, pool, worker_id="test-worker")


def test_an_evaluation_whose_process_cannot_start_fails_at_once_with_the_cause():
    ids = [Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x").id for _ in range(2)]
    claimed = claim("test-worker", 2)
    assert sorted(map(str, claimed)) == sorted(map(str, ids))
    worker_command(PoolThatCannotStart()).start_claimed(claimed)
    for row in Evaluation.objects.filter(id__in=ids):
        # Not left running under a live worker, where nothing would ever end it.
        assert row.status == Status.FAILED
        assert row.error == (
            "queued: could not start the evaluation process: BlockingIOError: [Errno 11] Resource temporarily unavailable"
        )


def test_the_ttl_keeps_the_reason_of_a_cancel_already_asked_for():
    deleted = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    expired = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    claim("test-worker", 2)
    lifecycle.cancel(deleted.id, "cancelled by DELETE")
    long_ago = time.monotonic() - settings.EXECUTOR.session_ttl_secs - 5
    pool = PoolThatCannotStart()
    pool.running = {str(row.id): Running(str(row.id), None, None, started=long_ago) for row in (deleted, expired)}
    worker_command(pool).expire_sessions()
    reasons = dict(Evaluation.objects.values_list("id", "cancel_reason"))
    assert reasons == {deleted.id: "cancelled by DELETE", expired.id: TTL_EXPIRED}


def test_the_row_watcher_turns_the_row_into_the_cancel_state(monkeypatch):
    monkeypatch.setattr("evaluations.pipeline.cancel.WATCH_SECS", 0.01)
    row = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    claim("test-worker", 1)

    def watched() -> CancelState:
        state, done = CancelState(), _SetAfter(3)
        watch_row(str(row.id), state, done)
        return state

    assert not watched().is_set()
    lifecycle.cancel(row.id, "cancelled by DELETE")
    state = watched()
    assert (state.stop, state.reason) == (Stop.CANCELLED, "cancelled by DELETE")
    lifecycle.finish(row.id, Status.FAILED, error="cloning_repo: executor worker lost")
    assert watched().stop is Stop.ENDED_ELSEWHERE


class _SetAfter:
    """A done event that lets the watcher look ``n`` times."""

    def __init__(self, n: int):
        self.left = n

    def wait(self, timeout):
        self.left -= 1
        return self.left < 0


def test_a_failure_while_preparing_fails_the_evaluation_with_its_cause(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="te-not-ours-", dir="/tmp"))
    try:
        if os.geteuid() == 0:
            os.chown(base, 65534, 65534)  # WORKSPACE_BASE made by another user: no session is made in it
        else:
            os.chmod(base, 0o500)
        config = dataclasses.replace(settings.EXECUTOR, workspace_base=base)
        row = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
        claim("test-worker", 1)
        run_evaluation(str(row.id), config, "none")
        row.refresh_from_db()
        assert row.status == Status.FAILED
        assert row.error.startswith("queued: could not prepare the session: PermissionError: "), row.error
        assert "executor process died" not in row.error
        assert not list(base.iterdir())
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_the_forkserver_dying_alone_loses_no_running_evaluation(worker_service, tasks):
    service = worker_service()
    eval_id = submit(service, tasks.task(), "import time; time.sleep(4)\n" + SOLVER)
    wait_for(lambda: evaluation(service, eval_id)["step"] == "running_agent", 30, what="running_agent")
    forkservers = [proc for proc in psutil.Process(service.worker.pid).children() if proc.name() == "te-forkserver"]
    assert len(forkservers) == 1
    forkservers[0].kill()  # the evaluation's parent: the worker, a subreaper, adopts it
    body = wait_terminal(service, eval_id, timeout=60)
    assert (body["status"], body["passed"], body["error"]) == ("completed", True, None)
    # And the worker goes on: a new evaluation still runs (multiprocessing starts a forkserver again).
    after = wait_terminal(service, submit(service, tasks.task(), SOLVER), timeout=90)
    assert (after["status"], after["passed"]) == ("completed", True), after["error"]
