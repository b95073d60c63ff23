"""Callback delivery: signature, retries with backoff, attempts recorded, URL rules."""

import dataclasses
import hashlib
import hmac
import json
from types import SimpleNamespace

import pytest
from django.utils import timezone

from evaluations import lifecycle, representation
from evaluations.models import Evaluation, Status
from evaluations.worker import callbacks
from tests.helpers.httpserver import TestHTTPServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver():
    state = SimpleNamespace(received=[], answers=[])

    def record(req):
        body = req.rfile.read(int(req.headers["Content-Length"]))
        state.received.append({"headers": dict(req.headers), "body": body})
        status = state.answers.pop(0) if state.answers else 200
        req.send_response(status)
        req.send_header("Content-Length", "0")
        req.end_headers()

    with TestHTTPServer() as server:
        server.routes["/hook"] = record
        state.server = server
        yield state


@pytest.fixture
def config(settings):
    return dataclasses.replace(settings.EXECUTOR, allowed_private_hosts=("127.0.0.1",), callback_secret="s3cret")


def finished(url):
    evaluation = Evaluation.objects.create(
        task_url="https://x/t.tgz", agent_code="x", callback_url=url, status=Status.RUNNING
    )
    assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: 1 of 1 tests failed (t)")
    return evaluation


def test_finish_marks_the_callback_pending_and_delivery_signs_the_json(receiver, config):
    evaluation = finished(receiver.server.url("/hook"))
    evaluation.refresh_from_db()
    assert evaluation.callback_state == "pending"
    assert callbacks.lease_due(10) == [evaluation.id]
    assert callbacks.lease_due(10) == []  # leased: a second dispatcher does not take it
    assert callbacks.deliver(evaluation.id, config) == "delivered"
    (got,) = receiver.received
    body = json.loads(got["body"])
    assert body["eval_id"] == str(evaluation.id) and body["status"] == "failed" and "test_results" in body
    expected = "sha256=" + hmac.new(b"s3cret", got["body"], hashlib.sha256).hexdigest()
    assert got["headers"]["X-Signature"] == expected
    attempt = evaluation.callback_attempts.get()
    assert (attempt.attempt, attempt.status_code, attempt.error) == (1, 200, "")


def test_a_failing_receiver_is_retried_with_backoff_five_times_then_failed(receiver, config):
    receiver.answers = [500, 503, 502, 500, 500]
    evaluation = finished(receiver.server.url("/hook"))
    gaps = []
    for expected_state in ["pending"] * 4 + ["failed"]:
        before = timezone.now()
        assert callbacks.deliver(evaluation.id, config) == expected_state
        evaluation.refresh_from_db()
        if evaluation.callback_next_at:
            gaps.append(round((evaluation.callback_next_at - before).total_seconds()))
    assert gaps == [1, 2, 4, 8]
    assert list(evaluation.callback_attempts.values_list("attempt", "status_code")) == [
        (i, code) for i, code in enumerate([500, 503, 502, 500, 500], 1)
    ]
    assert len(receiver.received) == 5
    assert all(r["headers"]["X-Callback-Attempt"] == str(i) for i, r in enumerate(receiver.received, 1))


def test_a_down_receiver_records_the_connection_error(config):
    from tests.helpers.service import free_port

    evaluation = finished(f"http://127.0.0.1:{free_port()}/hook")
    assert callbacks.deliver(evaluation.id, config) == "pending"
    attempt = evaluation.callback_attempts.get()
    assert attempt.status_code is None and "Connection" in attempt.error or "refused" in attempt.error


def test_a_refused_address_fails_at_once_and_posts_nothing(receiver, config):
    strict = dataclasses.replace(config, allowed_private_hosts=())
    evaluation = finished(receiver.server.url("/hook"))
    assert callbacks.deliver(evaluation.id, strict) == "failed"
    assert receiver.received == []
    assert "loopback" in evaluation.callback_attempts.get().error


def test_no_callback_url_means_no_delivery():
    evaluation = Evaluation.objects.create(task_url="https://x/t.tgz", agent_code="x", status=Status.RUNNING)
    lifecycle.finish(evaluation.id, Status.COMPLETED)
    evaluation.refresh_from_db()
    assert evaluation.callback_state == "" and callbacks.lease_due(10) == []


def ended_batch(url):
    from evaluations import lifecycle
    from evaluations.models import Batch

    batch = Batch.objects.create(agent_code="x", callback_url=url)
    evaluation = Evaluation.objects.create(
        batch=batch, task_url="https://x/t.tgz", agent_code="x", status=Status.RUNNING
    )
    assert lifecycle.finish(evaluation.id, Status.COMPLETED)
    lifecycle.settle(batch.id)  # after the commit lifecycle.finish's on_commit waits for (the test's transaction)
    batch.refresh_from_db()
    return batch, evaluation


def test_a_batch_is_called_back_by_the_same_sender_retried_and_recorded(receiver, config):

    receiver.answers = [500]
    batch, evaluation = ended_batch(receiver.server.url("/hook"))
    assert batch.callback_state == "pending"
    evaluation.refresh_from_db()
    assert evaluation.callback_state == ""  # the batch calls back, not its evaluations
    assert callbacks.lease_due(10) == [] and callbacks.lease_due(10, callbacks.BATCHES) == [batch.id]
    assert callbacks.deliver(batch.id, config, callbacks.BATCHES) == "pending"
    assert callbacks.deliver(batch.id, config, callbacks.BATCHES) == "delivered"
    first, second = receiver.received
    assert json.loads(second["body"]) == representation.batch_json(batch.id)
    assert json.loads(second["body"])["reward"] == 1.0
    assert second["headers"]["X-Batch-Id"] == str(batch.id) and "X-Eval-Id" not in second["headers"]
    assert (
        second["headers"]["X-Signature"] == "sha256=" + hmac.new(b"s3cret", second["body"], hashlib.sha256).hexdigest()
    )
    assert [h["headers"]["X-Callback-Attempt"] for h in (first, second)] == ["1", "2"]
    assert list(batch.callback_attempts.values_list("attempt", "status_code")) == [(1, 500), (2, 200)]
    assert not evaluation.callback_attempts.exists()
