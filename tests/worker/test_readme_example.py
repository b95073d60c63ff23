"""The README's curl example, as written: build the calc example, serve it, POST its request body."""

import json
import subprocess
import sys

import pytest

from tests.helpers.http import request
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import wait_for, wait_terminal
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow


def test_the_calc_example_passes_end_to_end(worker_service, tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    with TestHTTPServer(build) as server:
        base_url = server.url("").rstrip("/")
        subprocess.run([sys.executable, "examples/build.py", base_url, str(build)], cwd=PROJECT, check=True)
        service = worker_service()
        body = json.loads((build / "calc-request.json").read_text())
        reply = request("POST", service.url("/evaluate"), data=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert reply.status == 202
        result = wait_terminal(service, reply.json()["eval_id"])
    assert (result["status"], result["passed"]) == ("completed", True), (result["agent_output"], result["test_output"])
    names = [(r["name"], r["kind"], r["passed"]) for r in result["test_results"]]
    assert names == [
        ("fail_to_pass_add", "fail_to_pass", True),
        ("pass_to_pass_sub", "pass_to_pass", True),
        ("check_1", "check", True),
    ]
    assert "+    return a + b" in result["agent_patch"]


def test_the_readme_batch_example_earns_half(worker_service, tmp_path):
    """The README's batch body, made by its own one-liner: calc's solver on calc (passes) and textkit (fails)."""
    import re

    readme = (PROJECT / "README.md").read_text()
    snippet = re.search(r"\.venv/bin/python -c '(.*?)' > examples/build/batch-request\.json", readme, re.S).group(1)
    build = tmp_path / "examples" / "build"
    build.mkdir(parents=True)
    with TestHTTPServer(build) as server:
        base_url = server.url("").rstrip("/")
        subprocess.run([sys.executable, "examples/build.py", base_url, str(build)], cwd=PROJECT, check=True)
        made = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, check=True)
        service = worker_service()
        reply = request("POST", service.url("/batches"), data=made.stdout.encode(),
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert reply.status == 202, reply.body
        batch_id = reply.json()["batch_id"]
        shown = wait_for(
            lambda: (body := request("GET", service.url(f"/batches/{batch_id}")).json())["finished_at"] and body,
            180,
            what="the batch to end",
        )
    assert (shown["status"], shown["total"], shown["passed"], shown["reward"]) == ("completed", 2, 1, 0.5)
    assert [e["passed"] for e in shown["evaluations"]] == [True, False]
    assert [e["reward"] for e in shown["evaluations"]] == [1.0, 0.0]  # the exit_code grader's (SPEC §17)
    assert (shown["attempts"], shown["mean_reward"], shown["pass_at_k"]) == (1, 0.5, 0.5)
    assert [(t["passes"], t["pass_at_k"], t["mean_reward"]) for t in shown["tasks"]] == [(1, 1.0, 1.0), (0, 0.0, 0.0)]
    assert shown["evaluations"][1]["task_url"].endswith("/textkit-task.tar.gz")
