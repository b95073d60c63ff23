"""POST /evaluate/{id}/retry through gunicorn and run_worker: an infrastructure failure, retried, passes."""

from __future__ import annotations

import pytest

from tests.helpers.http import request
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import evaluation, submit, wait_terminal
from tests.helpers.tasks import SOLVER

pytestmark = pytest.mark.slow


def test_an_evaluation_failed_by_the_task_host_is_retried_and_passes(worker_service, tasks):
    archive = request("GET", tasks.task()).body
    answers = [503]  # the task's host is down for the first fetch, up for every later one

    def flaky_host(req):
        status = answers.pop(0) if answers else 200
        body = archive if status == 200 else b"down for maintenance"
        req.send_response(status)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    with TestHTTPServer() as host:
        host.routes["/task.tar.gz"] = flaky_host
        service = worker_service()
        first = submit(service, host.url("/task.tar.gz"), SOLVER)
        failed = wait_terminal(service, first)
        assert (failed["status"], failed["error_kind"]) == ("failed", "infrastructure"), failed["error"]

        reply = request("POST", service.url(f"/evaluate/{first}/retry"))
        assert reply.status == 202, reply.body
        assert reply.headers["Location"] == f"/evaluate/{reply.json()['eval_id']}"
        again = reply.json()["eval_id"]
        assert reply.json() == {"eval_id": again, "status": "pending", "retry_of": first}
        passed = wait_terminal(service, again)
        assert (passed["status"], passed["passed"], passed["error_kind"]) == ("completed", True, None)
        assert passed["retry_of"] == first
        assert passed["agent_sha256"] == failed["agent_sha256"]  # the same request, run again
        assert evaluation(service, first)["status"] == "failed"  # the original is left as it ended
