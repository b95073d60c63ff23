"""error_kind from real causes the other end-to-end tests do not make: a task archive or a repository
that cannot be reached (infrastructure) against one that is wrong (task_invalid).

tests/pipeline/test_e2e.py asserts the kinds of the rest (tests_failed, a test over time,
agent_timeout, limit_exceeded, a failing install, a missing base_commit, no tests, DELETE);
tests/worker/test_fleet.py the worker lost and the shutdown.
"""

from __future__ import annotations

import dataclasses
import gzip
import socket
import threading
from contextlib import contextmanager

import pytest

from tests.helpers.archives import write_archive
from tests.helpers.tasks import SOLVER
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def silent_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers: a network that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_task_archive_on_a_closed_port_is_infrastructure(e2e_config, sandbox):
    evaluation = evaluate(f"http://127.0.0.1:{closed_port()}/task.tar.gz", SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed"
    assert evaluation.error.startswith("downloading_task: task_url http://127.0.0.1:"), evaluation.error
    assert evaluation.error_kind == "infrastructure"


def test_a_task_server_answering_5xx_is_infrastructure_and_404_is_task_invalid(tasks, http_server, e2e_config, sandbox):
    http_server.respond("/busy.tar.gz", status=503)
    busy = evaluate(f"{tasks.base_url}/busy.tar.gz", SOLVER, config=e2e_config, sandbox=sandbox)
    assert (busy.status, busy.error_kind) == ("failed", "infrastructure"), busy.error
    assert "answered HTTP 503" in busy.error
    missing = evaluate(f"{tasks.base_url}/no-such-task.tar.gz", SOLVER, config=e2e_config, sandbox=sandbox)
    assert (missing.status, missing.error_kind) == ("failed", "task_invalid"), missing.error
    assert "answered HTTP 404" in missing.error


def test_a_truncated_gzip_archive_is_task_invalid(tasks, e2e_config, sandbox):
    write_archive(tasks.www / "whole.tar.gz", {"workspace.yaml": "repo: x\n", "prompt.md": "p\n"}, "tar.gz")
    data = (tasks.www / "whole.tar.gz").read_bytes()
    (tasks.www / "cut.tar.gz").write_bytes(gzip.compress(gzip.decompress(data))[: len(data) // 2])
    evaluation = evaluate(f"{tasks.base_url}/cut.tar.gz", SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed" and "corrupt" in evaluation.error, evaluation.error
    assert evaluation.error_kind == "task_invalid"


def test_a_repository_on_a_closed_port_is_infrastructure(tasks, e2e_config, sandbox):
    url = tasks.task(workspace=f"repo: http://127.0.0.1:{closed_port()}/repo.git\nbase_commit: main\n")
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed" and evaluation.error.startswith("cloning_repo: "), evaluation.error
    assert evaluation.error_kind == "infrastructure", evaluation.error


def test_a_clone_that_times_out_on_the_network_is_infrastructure(tasks, e2e_config, sandbox):
    config = dataclasses.replace(e2e_config, clone_timeout_secs=2)
    with silent_server() as port:
        url = tasks.task(workspace=f"repo: http://127.0.0.1:{port}/repo.git\nbase_commit: main\n")
        evaluation = evaluate(url, SOLVER, config=config, sandbox=sandbox)
    assert evaluation.status == "failed" and "timed out after 2 s" in evaluation.error, evaluation.error
    assert evaluation.error_kind == "infrastructure"


def test_a_repository_that_does_not_exist_is_task_invalid(tasks, e2e_config, sandbox):
    url = tasks.task(workspace=f"repo: {tasks.base_url}/no-such-repo.git\nbase_commit: main\n")
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed" and evaluation.error.startswith("cloning_repo: "), evaluation.error
    assert evaluation.error_kind == "task_invalid", evaluation.error
