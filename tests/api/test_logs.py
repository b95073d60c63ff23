"""GET /evaluate/{eval_id}/logs?offset=N: the live log from a byte offset, then the final one."""

import os
import uuid

import pytest

from evaluations import lifecycle
from evaluations.models import Evaluation, Status, TestResult

pytestmark = pytest.mark.django_db


@pytest.fixture
def workspace(executor_config, tmp_path):
    return executor_config(workspace_base=tmp_path / "sessions").workspace_base


def running_with_log(workspace, content: bytes) -> Evaluation:
    evaluation = Evaluation.objects.create(task_url="https://t.example/t.tgz", agent_code="x", status=Status.RUNNING)
    (workspace / str(evaluation.id)).mkdir(parents=True)
    (workspace / str(evaluation.id) / "log.txt").write_bytes(content)
    return evaluation


def get_log(api, eval_id, offset=None, **headers):
    query = "" if offset is None else f"?offset={offset}"
    return api.get(f"/evaluate/{eval_id}/logs{query}", **headers)


def test_the_live_log_is_served_from_an_offset(api, workspace):
    evaluation = running_with_log(workspace, b"=== running_agent ===\ntick 1\n")
    reply = get_log(api, evaluation.id)
    assert reply.status_code == 200
    assert reply["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.content == b"=== running_agent ===\ntick 1\n"
    assert (reply["X-Log-Offset"], reply["X-Log-Complete"]) == ("29", "false")
    with open(workspace / str(evaluation.id) / "log.txt", "ab") as log:
        log.write(b"tick 2\n")
    reply = get_log(api, evaluation.id, 29)
    assert (reply.content, reply["X-Log-Offset"], reply["X-Log-Complete"]) == (b"tick 2\n", "36", "false")
    reply = get_log(api, evaluation.id, 500)  # past the end: nothing yet, same offset
    assert (reply.content, reply["X-Log-Offset"], reply["X-Log-Complete"]) == (b"", "500", "false")


def test_no_log_yet_is_empty_and_not_complete(api, workspace):
    evaluation = Evaluation.objects.create(task_url="https://t.example/t.tgz", agent_code="x")
    reply = get_log(api, evaluation.id, 0)
    assert (reply.status_code, reply.content, reply["X-Log-Offset"], reply["X-Log-Complete"]) == (
        200,
        b"",
        "0",
        "false",
    )


def test_an_ended_evaluation_serves_its_final_log_and_is_complete(api, workspace):
    evaluation = running_with_log(workspace, b"live\n")
    Evaluation.objects.filter(id=evaluation.id).update(
        agent_output="fixed it\n", agent_exit_code=0, test_output="=== t (exit 1) ===\nboom"
    )
    TestResult.objects.create(evaluation_id=evaluation.id, position=0, name="t", kind="test", passed=False,
                              exit_code=1, output="boom")  # fmt: skip
    lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: 1 of 1 tests failed (t)")
    expected = (
        "␞ === running_agent (exit 0) ===\nfixed it\n"
        "␞ === running_tests ===\n␞ === t ===\nboom\n␞ --- t: failed (exit 1) ---\n"
        "␞ === failed ===\n␞ running_tests: 1 of 1 tests failed (t)\n"
    ).encode()
    reply = get_log(api, evaluation.id)
    assert (reply.content, reply["X-Log-Offset"], reply["X-Log-Complete"]) == (expected, str(len(expected)), "true")
    reply = get_log(api, evaluation.id, 10)
    assert reply.content == expected[10:] and reply["X-Log-Complete"] == "true"


def test_a_chunk_that_does_not_reach_the_end_of_the_final_log_is_not_complete(api, workspace, monkeypatch):
    from evaluations import livelog

    monkeypatch.setattr(livelog, "MAX_CHUNK_BYTES", 4)
    evaluation = Evaluation.objects.create(
        task_url="https://t.example/t.tgz", agent_code="x", agent_output="0123456789"
    )
    lifecycle.finish(evaluation.id, Status.COMPLETED)
    reply = get_log(api, evaluation.id, 0)
    assert (len(reply.content), reply["X-Log-Offset"], reply["X-Log-Complete"]) == (4, "4", "false")


@pytest.mark.parametrize("offset", ["-1", "abc", "1.5", "99999999999999999", "%20"])
def test_a_bad_offset_is_400_in_the_envelope(api, workspace, offset):
    evaluation = running_with_log(workspace, b"x")
    reply = get_log(api, evaluation.id, offset, HTTP_ACCEPT="text/plain")
    assert reply.status_code == 400
    assert reply["Content-Type"] == "application/json"
    body = reply.json()
    assert body["error"] == "invalid_request" and list(body["fields"]) == ["offset"]


def test_unknown_evaluations_are_404(api, workspace):
    assert get_log(api, uuid.uuid4()).json()["error"] == "not_found"
    assert get_log(api, "not-a-uuid").status_code == 404


def test_the_log_needs_the_token(api, workspace, executor_config):
    executor_config(auth_tokens=("s3cret",))
    evaluation = running_with_log(workspace, b"secret log")
    assert get_log(api, evaluation.id).status_code == 401
    assert get_log(api, evaluation.id, HTTP_AUTHORIZATION="Bearer s3cret").content == b"secret log"


def test_a_log_replaced_by_a_link_is_not_followed(api, workspace, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the service's secret")
    evaluation = running_with_log(workspace, b"")
    log = workspace / str(evaluation.id) / "log.txt"
    log.unlink()
    os.symlink(secret, log)
    reply = get_log(api, evaluation.id)
    assert (reply.status_code, reply.content) == (200, b"")
    os.unlink(log)
    os.mkfifo(log)  # a FIFO must not hang the request either
    assert get_log(api, evaluation.id).content == b""
