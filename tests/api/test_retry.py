"""POST /evaluate/{id}/retry: a new pending evaluation with an ended one's request, or a refusal that creates nothing."""

import json
import uuid

import pytest

from evaluations import agents, lifecycle
from evaluations.models import ErrorKind, Evaluation, Status

pytestmark = pytest.mark.django_db

REQUEST = {
    "agent_code": "print('hi')",
    "agent_language": "bash",
    "task_url": "https://example.com/task.tar.gz",
    "timeout_secs": 7,
    "env": {"MY_KEY": "v"},
    "callback_url": "https://platform.example.com/hook",
    "metadata": {"run": 3},
}


def submit(api, body=None) -> str:
    reply = api.post("/evaluate", data=json.dumps(body or REQUEST), content_type="application/json")
    assert reply.status_code == 202, reply.content
    return reply.json()["eval_id"]


def end(eval_id, status=Status.FAILED, kind=ErrorKind.INFRASTRUCTURE):
    assert lifecycle.record(eval_id, status=Status.RUNNING, expect=[Status.PENDING])
    assert lifecycle.finish(eval_id, status, error="cloning_repo: executor worker lost", kind=kind)


def retry(api, eval_id, **headers):
    return api.post(f"/evaluate/{eval_id}/retry", **headers)


REQUEST_COLUMNS = ("agent_code", "language", "task_url", "timeout_secs", "env", "static_assets", "callback_url",
                   "metadata", "agent_archive_id", "agent_entrypoint", "agent_sha256", "request_sha256")  # fmt: skip


def test_retry_creates_a_pending_evaluation_with_the_same_request(api):
    first = submit(api)
    end(first)
    reply = retry(api, first)
    assert reply.status_code == 202, reply.content
    body = reply.json()
    assert set(body) == {"eval_id", "status", "retry_of"}
    assert (body["status"], body["retry_of"]) == ("pending", first) and body["eval_id"] != first
    assert reply["Location"] == f"/evaluate/{body['eval_id']}"
    old, new = Evaluation.objects.get(id=first), Evaluation.objects.get(id=body["eval_id"])
    assert [getattr(new, c) for c in REQUEST_COLUMNS] == [getattr(old, c) for c in REQUEST_COLUMNS]
    assert (new.status, new.step, new.retry_of_id, new.error_kind) == ("pending", "queued", old.id, None)
    shown = api.get(f"/evaluate/{body['eval_id']}").json()
    assert (shown["retry_of"], shown["error_kind"], shown["status"]) == (first, None, "pending")
    assert api.get(f"/evaluate/{first}").json()["error_kind"] == "infrastructure"
    again = retry(api, first)  # no idempotency: each retry is a new evaluation
    assert again.status_code == 202 and again.json()["eval_id"] not in (first, body["eval_id"])


@pytest.mark.django_db(transaction=True)  # commits for real, so the wakeup runs before the reply is written
def test_retry_answers_pending_even_when_a_worker_claims_it_before_the_reply(api, monkeypatch):
    """The answer is the status as admitted, as POST /evaluate's: a woken worker may claim the row first."""
    first = submit(api)
    end(first)

    def worker_claims(data_dir):  # the wakeup runs at commit; a worker on the other core is this fast
        for row in Evaluation.objects.filter(status=Status.PENDING, retry_of_id=first):
            assert lifecycle.record(row.id, status=Status.RUNNING, expect=[Status.PENDING])

    monkeypatch.setattr("evaluations.worker.wakeup.notify", worker_claims)
    reply = retry(api, first)
    assert reply.status_code == 202, reply.content
    assert reply.json()["status"] == "pending"
    assert Evaluation.objects.get(id=reply.json()["eval_id"]).status == "running"


def test_a_retry_of_an_archive_agent_keeps_its_archive(api):
    first = submit(api)
    digest = agents.store_archive(b"not really an archive, only its row matters here")
    Evaluation.objects.filter(id=first).update(
        agent_code="", agent_archive_id=digest, agent_entrypoint="src/run.py", agent_sha256=digest
    )
    end(first, Status.CANCELLED, ErrorKind.CANCELLED)
    new = Evaluation.objects.get(id=retry(api, first).json()["eval_id"])
    assert (new.agent_code, new.agent_archive_id, new.agent_entrypoint) == ("", digest, "src/run.py")


def test_retry_of_an_unknown_evaluation_is_404(api):
    for eval_id in (uuid.uuid4(), "not-a-uuid"):
        reply = retry(api, eval_id)
        assert (reply.status_code, reply.json()["error"]) == (404, "not_found")
    assert Evaluation.objects.count() == 0


@pytest.mark.parametrize("running", [False, True])
def test_retry_of_an_evaluation_not_ended_is_409_and_creates_nothing(api, running):
    eval_id = submit(api)
    if running:
        assert lifecycle.record(eval_id, status=Status.RUNNING, expect=[Status.PENDING])
    reply = retry(api, eval_id)
    assert reply.status_code == 409
    body = reply.json()
    assert body["error"] == "not_finished" and ("running" if running else "pending") in body["detail"]
    assert Evaluation.objects.count() == 1


def test_retry_at_capacity_is_503_with_retry_after_and_creates_nothing(api, executor_config):
    executor_config(max_concurrent_evals=1, max_queued_evals=0)
    ended = submit(api)
    end(ended)
    submit(api)  # the only slot
    reply = retry(api, ended)
    assert reply.status_code == 503 and reply.json()["error"] == "at_capacity"
    assert int(reply["Retry-After"]) >= 1
    assert Evaluation.objects.count() == 2 and not Evaluation.objects.filter(retry_of_id=ended).exists()


def test_retry_needs_the_token_like_the_other_evaluate_routes(api, executor_config):
    eval_id = submit(api)
    end(eval_id)
    executor_config(auth_tokens=("s3cret",))
    reply = retry(api, eval_id)
    assert (reply.status_code, reply.json()["error"]) == (401, "unauthorized")
    assert Evaluation.objects.count() == 1
    assert retry(api, eval_id, HTTP_AUTHORIZATION="Bearer s3cret").status_code == 202
