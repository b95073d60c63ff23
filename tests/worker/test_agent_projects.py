"""Agent projects (SPEC §14) through gunicorn and run_worker: archives POSTed as base64, their
packages installed from the real registries in installing_agent, what a platform reads back."""

from __future__ import annotations

import base64
import hashlib

import pytest

from tests.helpers.archives import archive_bytes
from tests.helpers.http import request
from tests.helpers.polling import wait_terminal
from tests.helpers.runtimes import REGISTRIES
from tests.helpers.tasks import ADD_TEST
from tests.pipeline.test_agent_projects_e2e import NODE_PROJECT, NOT_VISIBLE, PYTHON_PROJECT, STEPS

pytestmark = pytest.mark.slow


def submit_archive(service, task_url: str, data: bytes, **fields) -> str:
    body = {"task_url": task_url, "agent_archive": base64.b64encode(data).decode(), **fields}
    reply = request("POST", service.url("/evaluate"), json_body=body)
    assert reply.status == 202, reply.body
    return reply.json()["eval_id"]


def test_python_and_node_projects_solve_tasks_and_a_broken_install_fails(worker_service, tasks):
    service = worker_service(EGRESS_ALLOW=",".join(REGISTRIES), INSTALL_TIMEOUT_SECS=300, MAX_CONCURRENT_EVALS=3)
    task_url = tasks.task(tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_hidden.sh": NOT_VISIBLE})
    python_data = archive_bytes(PYTHON_PROJECT, "tar.gz", top="agent")
    node_data = archive_bytes(NODE_PROJECT, "zip")
    broken_data = archive_bytes({**PYTHON_PROJECT, "requirements.txt": "te17-no-such-package-anywhere==1.0\n"})
    python_id = submit_archive(service, task_url, python_data)
    node_id = submit_archive(service, task_url, node_data, agent_language="node")
    broken_id = submit_archive(service, task_url, broken_data)

    python = wait_terminal(service, python_id, timeout=300)
    assert (python["status"], python["passed"], python["error"]) == ("completed", True, None), python["error"]
    assert 'fixed = "Make add() add."' in python["agent_output"]
    assert "agent-package-hidden" in python["test_output"]  # the tests do not see the agent's tomli_w
    assert [t["step"] for t in python["transitions"]][-len(STEPS[2:]) :] == STEPS[2:]
    assert python["agent_sha256"] == hashlib.sha256(python_data).hexdigest()
    assert "agent_archive" not in python and "agent_code" not in python

    node = wait_terminal(service, node_id, timeout=300)
    assert (node["status"], node["passed"]) == ("completed", True), node["error"]
    assert "node agent: is-number ok" in node["agent_output"]
    assert node["agent_sha256"] == hashlib.sha256(node_data).hexdigest()

    broken = wait_terminal(service, broken_id, timeout=300)
    assert (broken["status"], broken["passed"]) == ("failed", False)
    assert broken["error"].startswith("installing_agent: pip install -r requirements.txt exited with code 1: ")
    assert "te17-no-such-package-anywhere" in broken["error"]

    metrics = request("GET", service.url("/metrics")).body.decode()
    assert 'term_executor_step_duration_seconds_count{step="installing_agent"} 3.0' in metrics
    assert broken.get("error_kind") == "agent_invalid"
