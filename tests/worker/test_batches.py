"""Batches through gunicorn and run_worker (SPEC §14): the reward, the one signed callback, DELETE of a running batch."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime

import pytest

from tests.helpers.http import request
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import evaluation, submit, wait_for, wait_terminal
from tests.helpers.tasks import SOLVER
from tests.worker.test_worker import tagged_processes

pytestmark = pytest.mark.slow

SECRET = "batch-secret"
UNSOLVABLE = {"calc.py": "def add(a, b):\n    return a * b\n"}  # SOLVER's replacement finds nothing to fix


def batch(service, batch_id: str) -> dict:
    return request("GET", service.url(f"/batches/{batch_id}")).json()


def wait_batch_ended(service, batch_id: str, timeout: float = 120) -> dict:
    return wait_for(
        lambda: (body := batch(service, batch_id))["finished_at"] and body, timeout, what=f"batch {batch_id} to end"
    )


def test_a_batch_of_three_with_two_solvable_earns_two_thirds_and_calls_back_once(worker_service, tasks):
    hits = []

    def record(req):
        hits.append({"headers": dict(req.headers), "body": req.rfile.read(int(req.headers["Content-Length"]))})
        req.send_response(200)
        req.send_header("Content-Length", "0")
        req.end_headers()

    with TestHTTPServer() as receiver:
        receiver.routes["/hook"] = record
        service = worker_service(CALLBACK_SECRET=SECRET)
        urls = [tasks.task(), tasks.task(base_files=UNSOLVABLE), tasks.task()]
        reply = request(
            "POST",
            service.url("/batches"),
            json_body={"agent_code": SOLVER, "task_urls": urls, "callback_url": receiver.url("/hook")},
        )
        assert reply.status == 202, reply.body
        batch_id, eval_ids = reply.json()["batch_id"], reply.json()["eval_ids"]
        done = wait_batch_ended(service, batch_id)
        assert done["status"] == "completed"
        assert (done["total"], done["finished"], done["passed"], done["failed"]) == (3, 3, 2, 1)
        assert done["reward"] == pytest.approx(2 / 3)
        assert [e["eval_id"] for e in done["evaluations"]] == eval_ids
        assert [e["passed"] for e in done["evaluations"]] == [True, False, True]
        assert [e["task_url"] for e in done["evaluations"]] == urls
        assert done["evaluations"][0]["error_kind"] is None
        for eval_id in eval_ids:  # each is an evaluation like any other
            assert evaluation(service, eval_id)["status"] in ("completed", "failed")

        wait_for(lambda: hits, 20, what="the batch callback")
        # The worker has ticked many times by the end of another evaluation: no second callback came.
        assert wait_terminal(service, submit(service, tasks.task(), SOLVER))["passed"]
        assert len(hits) == 1
        sent = hits[0]
        expected = "sha256=" + hmac.new(SECRET.encode(), sent["body"], hashlib.sha256).hexdigest()
        assert sent["headers"]["X-Signature"] == expected
        assert (sent["headers"]["X-Batch-Id"], sent["headers"]["X-Callback-Attempt"]) == (batch_id, "1")
        assert json.loads(sent["body"]) == batch(service, batch_id)


def test_delete_of_a_running_batch_cancels_the_running_and_the_queued(worker_service, tasks):
    service = worker_service(MAX_CONCURRENT_EVALS=2)
    sleeper = "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)"
    urls = [tasks.task() for _ in range(3)]
    reply = request("POST", service.url("/batches"), json_body={"agent_code": sleeper, "task_urls": urls})
    assert reply.status == 202, reply.body
    batch_id, eval_ids = reply.json()["batch_id"], reply.json()["eval_ids"]
    running = eval_ids[:2]  # oldest first: the batch's first two take the worker's two slots
    for eval_id in running:
        wait_for(lambda e=eval_id: evaluation(service, e)["step"] == "running_agent", 60, what="running_agent")
    assert batch(service, batch_id)["status"] == "running"
    assert evaluation(service, eval_ids[2])["status"] == "pending"

    cancelled = request("DELETE", service.url(f"/batches/{batch_id}"))
    assert cancelled.status == 202 and cancelled.json() == {"batch_id": batch_id, "status": "cancelled"}
    done = wait_batch_ended(service, batch_id, timeout=30)
    assert (done["status"], done["cancelled"], done["reward"]) == ("cancelled", 3, 0)
    assert [e["status"] for e in done["evaluations"]] == ["cancelled"] * 3
    for eval_id in running:
        assert evaluation(service, eval_id)["error"] == "running_agent: batch cancelled by DELETE"
        wait_for(lambda e=eval_id: not tagged_processes(e), 10, what="the agent's processes to die")
    assert request("DELETE", service.url(f"/batches/{batch_id}")).status == 409
    listed = request("GET", service.url("/batches?status=cancelled")).json()
    assert [row["batch_id"] for row in listed] == [batch_id]


def test_attempts_run_by_round_and_give_pass_at_k(worker_service, tasks):
    """SPEC §17: two tasks, two attempts each, on one worker slot: every first attempt runs before any
    second; the solvable task's attempts both pass, the other's neither."""
    service = worker_service(MAX_CONCURRENT_EVALS=1)
    urls = [tasks.task(), tasks.task(base_files=UNSOLVABLE)]
    reply = request("POST", service.url("/batches"), json_body={"agent_code": SOLVER, "task_urls": urls, "attempts": 2})
    assert reply.status == 202, reply.body
    batch_id, eval_ids = reply.json()["batch_id"], reply.json()["eval_ids"]
    done = wait_batch_ended(service, batch_id, timeout=240)
    assert [(e["task_url"], e["attempt"], e["passed"], e["reward"]) for e in done["evaluations"]] == [
        (urls[0], 1, True, 1.0), (urls[1], 1, False, 0.0), (urls[0], 2, True, 1.0), (urls[1], 2, False, 0.0),
    ]  # fmt: skip
    started = [datetime.fromisoformat(evaluation(service, i)["started_at"].replace("Z", "+00:00")) for i in eval_ids]
    assert started == sorted(started)  # the queue's order is eval_ids'
    assert (done["attempts"], done["reward"], done["mean_reward"], done["pass_at_k"]) == (2, 0.5, 0.5, 0.5)
    assert done["tasks"] == [
        {"task_url": urls[0], "attempts": 2, "passes": 2, "pass_at_k": 1.0, "mean_reward": 1.0},
        {"task_url": urls[1], "attempts": 2, "passes": 0, "pass_at_k": 0.0, "mean_reward": 0.0},
    ]
    (row,) = [r for r in request("GET", service.url("/batches")).json() if r["batch_id"] == batch_id]
    # A list row has no tasks nor evaluations, so nothing in it could verify: it carries no signature.
    assert row == {name: value for name, value in done.items() if name not in ("tasks", "evaluations", "signature")}
