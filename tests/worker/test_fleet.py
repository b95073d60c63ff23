"""Losing nothing and running nothing twice: callbacks, a killed worker, SIGTERM, the reaper."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
import uuid

import pytest

from tests.helpers.http import request
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import evaluation, submit, wait_for, wait_terminal
from tests.helpers.tasks import SOLVER
from tests.worker.test_worker import tagged_processes

pytestmark = pytest.mark.slow


def test_a_slow_callback_receiver_blocks_no_evaluation(worker_service, tasks):
    """The second evaluation is claimed while the first one's callback is still unanswered and not
    given up on (the worker closes the connection when it stops waiting, TIMEOUT_SECS)."""
    hits, release, given_up = [], threading.Event(), threading.Event()

    def slow(req):
        hits.append(req.rfile.read(int(req.headers["Content-Length"])))
        sock = req.connection
        while not release.is_set():  # until released, notice at once when the sender hangs up
            if select.select([sock], [], [], 0.05)[0] and not sock.recv(1, socket.MSG_PEEK):
                given_up.set()
                return
        req.send_response(200)
        req.send_header("Content-Length", "0")
        req.end_headers()

    with TestHTTPServer() as receiver:
        receiver.routes["/hook"] = slow
        try:
            service = worker_service(MAX_CONCURRENT_EVALS=1, CALLBACK_SECRET="k")
            first = submit(service, tasks.task(), SOLVER, callback_url=receiver.url("/hook"))
            assert wait_terminal(service, first)["passed"]
            wait_for(lambda: hits, 10, what="the callback POST")
            second = submit(service, tasks.task(), SOLVER)
            # A worker that waited on the callback claims the second only once it gave up on it.
            wait_for(lambda: evaluation(service, second)["status"] != "pending", 60, what="the second claimed")
            assert not given_up.is_set(), "the second evaluation waited on the first one's callback"
            assert wait_terminal(service, second, timeout=60)["passed"]
            assert b'"eval_id":"%s"' % first.encode() in hits[0]
        finally:
            release.set()


def test_a_worker_killed_mid_evaluation_leaves_nothing_behind(worker_service, tasks, workspace_base):
    service = worker_service()
    eval_id = submit(
        service, tasks.task(), "import subprocess, time\nsubprocess.Popen(['setsid', 'sleep', '300'])\ntime.sleep(300)"
    )
    wait_for(lambda: evaluation(service, eval_id)["step"] == "running_agent", 30, what="running_agent")
    wait_for(lambda: len(tagged_processes(eval_id)) >= 2, 10, what="agent processes")
    service.worker.send_signal(signal.SIGKILL)
    service.worker.wait()
    body = wait_terminal(service, eval_id, timeout=20)
    assert (body["status"], body["error"]) == ("failed", "running_agent: executor worker lost")
    assert body["error_kind"] == "infrastructure"
    wait_for(lambda: not tagged_processes(eval_id), 10, what="the lost evaluation's processes to die")
    reaped = service.manage("reap_sessions")
    assert reaped.stdout.startswith("reap_sessions:")
    assert not (workspace_base / eval_id).exists()


def test_a_worker_lost_without_notice_is_failed_by_the_reaper(worker_service, tasks, workspace_base):
    # SIGSTOP the worker and its evaluation process: nothing beats, nothing cleans up by itself.
    service = worker_service(WORKER_STALE_SECS=2)
    eval_id = submit(service, tasks.task(), "import time; time.sleep(300)")
    wait_for(lambda: evaluation(service, eval_id)["step"] == "running_agent", 30, what="running_agent")
    frozen = [service.worker.pid]
    os.kill(service.worker.pid, signal.SIGSTOP)
    try:
        time.sleep(3)
        out = service.manage("reap_sessions").stdout
        assert "lost=1" in out and "folders_removed=1" in out
        body = evaluation(service, eval_id)
        assert (body["status"], body["error"]) == ("failed", "running_agent: executor worker lost")
        assert body["error_kind"] == "infrastructure"
        assert not tagged_processes(eval_id)
        assert not (workspace_base / eval_id).exists()
        # The evaluation process itself is alive (only its worker is frozen): it must notice its
        # row ended and stop, not go on into the next step with new commands.
        time.sleep(2.5)
        assert not tagged_processes(eval_id)
        assert not (workspace_base / eval_id).exists()
        assert evaluation(service, eval_id)["error"] == "running_agent: executor worker lost"
        assert "lost=0" in service.manage("reap_sessions").stdout  # idempotent
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)


def test_sigterm_stops_claiming_finishes_running_work_then_cancels_the_rest(worker_service, tasks):
    service = worker_service(MAX_CONCURRENT_EVALS=2, SHUTDOWN_GRACE_SECS=3)
    quick = submit(service, tasks.task(), "import time; time.sleep(1)\n" + SOLVER)
    slow = submit(service, tasks.task(), "import time; time.sleep(120)")
    for eval_id in (quick, slow):
        wait_for(lambda e=eval_id: evaluation(service, e)["step"] == "running_agent", 30, what="running_agent")
    service.worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    queued = submit(service, tasks.task(), SOLVER)
    assert wait_terminal(service, quick)["passed"] is True
    body = wait_terminal(service, slow, timeout=20)
    assert (body["status"], body["error"]) == ("cancelled", "running_agent: executor shutting down")
    assert body["error_kind"] == "infrastructure"  # neither the agent's nor the task's: retry it
    assert service.worker.wait(timeout=20) == 0
    assert evaluation(service, queued)["status"] == "pending"  # not claimed by a stopping worker
    service.start_worker()
    assert wait_terminal(service, queued)["passed"] is True


def test_reap_sessions_cleans_only_what_is_dead_and_only_inside_the_base(live_service, workspace_base, tmp_path):
    service = live_service(env={"WORKSPACE_BASE": str(workspace_base), "SESSION_TTL_SECS": "1"}, web_workers=1)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    orphan = workspace_base / str(uuid.uuid4())
    (orphan / "repo").mkdir(parents=True)
    link = workspace_base / str(uuid.uuid4())
    link.symlink_to(outside)
    stranger = workspace_base / "not-an-eval-id"
    stranger.mkdir()
    pending = request(
        "POST", service.url("/evaluate"), json_body={"task_url": "https://example.com/t.tgz", "agent_code": "x"}
    ).json()["eval_id"]
    live = workspace_base / pending
    live.mkdir()
    dry = service.manage("reap_sessions", "--dry-run").stdout.strip()
    assert dry.startswith("reap_sessions (dry run):") and "folders_removed=2" in dry
    assert orphan.exists() and link.is_symlink() and evaluation(service, pending)["status"] == "pending"
    time.sleep(1.5)  # the pending one passes SESSION_TTL_SECS
    out = service.manage("reap_sessions").stdout.strip().splitlines()
    # One pass: the pending one expires, then its folder is no longer live and goes too.
    assert len(out) == 1 and "expired=1" in out[0] and "folders_removed=3" in out[0]
    assert not orphan.exists() and not link.exists() and not live.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    assert stranger.exists()
    body = evaluation(service, pending)
    assert (body["status"], body["error"]) == ("cancelled", "queued: session TTL expired")
    again = service.manage("reap_sessions").stdout.strip()
    assert "expired=0" in again and "folders_removed=0" in again  # idempotent


@pytest.mark.skipif(
    not __import__("tests.helpers.service", fromlist=["x"]).using_postgres(),
    reason="PostgreSQL-only: terminates the worker's backends",
)
def test_the_worker_survives_its_database_connections_being_killed(worker_service, tasks):
    import psycopg

    service = worker_service()
    assert wait_terminal(service, submit(service, tasks.task(), SOLVER))["passed"]
    with psycopg.connect(service.database.url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [service.database.name],
        ).fetchone()[0]
    assert killed >= 1
    after = submit(service, tasks.task(), SOLVER)
    assert wait_terminal(service, after, timeout=30)["passed"]
    assert service.worker.poll() is None
    log = (service.folder / "worker.log").read_text()
    assert "worker tick failed; retrying in 1 s" in log  # the LISTEN connection broke and came back
