"""Waiting on a live service without sleeping longer than needed."""

from __future__ import annotations

import time

from tests.helpers.http import request

TERMINAL = {"completed", "failed", "cancelled"}


def wait_for(predicate, timeout: float = 60, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def evaluation(service, eval_id: str) -> dict:
    return request("GET", service.url(f"/evaluate/{eval_id}")).json()


def wait_terminal(service, eval_id: str, timeout: float = 90) -> dict:
    def done():
        body = evaluation(service, eval_id)
        return body if body["status"] in TERMINAL else None

    return wait_for(done, timeout, what=f"evaluation {eval_id} to end")


def submit(service, task_url: str, agent_code: str, **fields) -> str:
    reply = request(
        "POST", service.url("/evaluate"), json_body={"task_url": task_url, "agent_code": agent_code, **fields}
    )
    assert reply.status == 202, reply.body
    return reply.json()["eval_id"]
