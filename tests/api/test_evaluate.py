"""POST /evaluate, GET/DELETE /evaluate/{id}: every success and every refusal, in-process."""

import json
import uuid

import pytest

from evaluations.api.limits import max_body_bytes
from evaluations.api.serializers import EvaluateRequestSerializer
from evaluations.models import Evaluation, Status, Step, Transition
from executor_project.config import Config

pytestmark = pytest.mark.django_db

GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}


def post(api, body, **headers):
    return api.post("/evaluate", data=json.dumps(body), content_type="application/json", **headers)


def assert_refused(response, status, code, field=None):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"] == code
    assert isinstance(body["detail"], str) and body["detail"]
    if field:
        assert field in body["fields"], body
    return body


def test_post_admits_and_records_queued_transition(api):
    response = post(api, {**GOOD, "metadata": {"run": 7}, "env": {"MY_KEY": "v"}})
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "pending"
    eval_id = body["eval_id"]
    assert response["Location"] == f"/evaluate/{eval_id}"
    evaluation = Evaluation.objects.get(id=eval_id)
    assert (evaluation.status, evaluation.step, evaluation.language) == ("pending", "queued", "python")
    assert evaluation.env == {"MY_KEY": "v"}
    assert list(Transition.objects.filter(evaluation=evaluation).values_list("step", "status")) == [
        ("queued", "pending")
    ]


def test_get_returns_every_field_of_the_evaluation_object(api):
    eval_id = post(api, {**GOOD, "metadata": {"a": 1}}).json()["eval_id"]
    body = api.get(f"/evaluate/{eval_id}").json()
    assert set(body) == {
        "eval_id", "status", "step", "passed", "error", "duration_ms", "task_url", "language", "agent_sha256", "metadata",
        "created_at", "started_at", "finished_at", "test_results", "agent_output", "agent_exit_code",
        "agent_patch", "test_output", "transitions", "results_sha256", "egress", "resources", "cache",
        "error_kind", "retry_of", "owner", "environment", "reward", "rewards", "task_format", "limits_applied",
        "task_metadata", "system_changes", "artifacts", "batch_id", "attempt", "test_counts",
        "task_sha256", "agent_patch_sha256", "executor_version", "signature", "steps",
    }  # fmt: skip
    assert (body["error_kind"], body["retry_of"], body["owner"]) == (None, None, None)  # null while pending or running
    assert body["steps"] is None  # SPEC §23: a Harbor task of [[steps]] only
    assert body["cache"] is None  # decided at cloning_repo (SPEC §13)
    assert body["environment"] is None  # decided at preparing_environment (SPEC §16)
    assert body["metadata"] == {"a": 1}
    assert body["transitions"][0]["step"] == "queued"
    assert body["passed"] is None
    assert (body["egress"], body["resources"]) == ([], None)  # nothing reached, nothing used yet


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task_url": "https://x/t.tgz"}, "agent_code"),
        ({"agent_code": "", "task_url": "https://x/t.tgz"}, "agent_code"),
        ({"agent_code": 5, "task_url": "https://x/t.tgz"}, "agent_code"),
        ({"agent_code": "x"}, "task_url"),
        ({**GOOD, "task_url": "ftp://example.com/t.tgz"}, "task_url"),
        ({**GOOD, "task_url": "file:///etc/passwd"}, "task_url"),
        ({**GOOD, "task_url": "https://example.com/" + "a" * 2048}, "task_url"),
        ({**GOOD, "task_url": ["https://x"]}, "task_url"),
        ({**GOOD, "agent_language": "cobol"}, "agent_language"),
        ({**GOOD, "timeout_secs": 0}, "timeout_secs"),
        ({**GOOD, "timeout_secs": 601}, "timeout_secs"),
        ({**GOOD, "timeout_secs": "10"}, "timeout_secs"),
        ({**GOOD, "timeout_secs": True}, "timeout_secs"),
        ({**GOOD, "env": {"PATH": "/evil"}}, "env"),
        ({**GOOD, "env": {"HOME": "/x"}}, "env"),
        ({**GOOD, "env": {"LD_PRELOAD": "/x.so"}}, "env"),
        ({**GOOD, "env": {"STATIC_ASSET_X": "1"}}, "env"),
        ({**GOOD, "env": {"lower": "1"}}, "env"),
        ({**GOOD, "env": {"1ABC": "1"}}, "env"),
        ({**GOOD, "env": {"A": 1}}, "env"),
        ({**GOOD, "env": ["A"]}, "env"),
        ({**GOOD, "env": {f"V{i}": "x" for i in range(65)}}, "env"),
        ({**GOOD, "env": {"BIG": "x" * (64 * 1024 + 1)}}, "env"),
        ({**GOOD, "metadata": {"blob": "x" * 5000}}, "metadata"),
        ({**GOOD, "metadata": "text"}, "metadata"),
        ({**GOOD, "callback_url": "gopher://x"}, "callback_url"),
        ({**GOOD, "static_assets": {"a": {"save_path": "x"}}}, "static_assets"),
        ({**GOOD, "surprise": 1}, "surprise"),
    ],
)
def test_bad_fields_get_400_naming_the_field_and_change_nothing(api, body, field):
    assert_refused(post(api, body), 400, "invalid_request", field)
    assert Evaluation.objects.count() == 0


def test_agent_code_at_the_limit_is_admitted_and_one_byte_over_is_refused(api, executor_config):
    executor_config(max_agent_code_bytes=1000)
    assert post(api, {**GOOD, "agent_code": "é" * 500}).status_code == 202  # 1000 UTF-8 bytes
    body = assert_refused(post(api, {**GOOD, "agent_code": "é" * 500 + "x"}), 400, "invalid_request", "agent_code")
    assert "1001 bytes" in body["fields"]["agent_code"][0]
    assert Evaluation.objects.count() == 1


def test_the_serializer_takes_its_limits_from_the_config_in_its_context(settings):
    body = {**GOOD, "task_url": "file:///tmp/t.tgz", "timeout_secs": 700, "agent_code": "x" * 2000}
    # The global would refuse the URL and the timeout and take the code: each context decides otherwise.
    assert not settings.EXECUTOR.allow_file_urls and settings.EXECUTOR.agent_timeout_secs < 700
    assert settings.EXECUTOR.max_agent_code_bytes > 2000
    strict = EvaluateRequestSerializer(data=body, context={"config": Config(max_agent_code_bytes=1000)})
    assert not strict.is_valid() and set(strict.errors) == {"task_url", "timeout_secs", "agent_code"}
    lenient = Config(allow_file_urls=True, agent_timeout_secs=900, max_agent_code_bytes=2000)
    assert EvaluateRequestSerializer(data=body, context={"config": lenient}).is_valid()


def test_file_urls_only_when_allowed(api, executor_config):
    assert post(api, {**GOOD, "task_url": "file:///tmp/t.tgz"}).status_code == 400
    executor_config(allow_file_urls=True)
    assert post(api, {**GOOD, "task_url": "file:///tmp/t.tgz"}).status_code == 202


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe", b"null"],
)
def test_bodies_that_are_not_a_json_object_get_400(api, raw):
    response = api.post("/evaluate", data=raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] in ("invalid_json", "invalid_request")
    assert Evaluation.objects.count() == 0


def test_form_encoded_json_from_plain_curl_is_accepted(api):
    response = api.post("/evaluate", data=json.dumps(GOOD), content_type="application/x-www-form-urlencoded")
    assert response.status_code == 202


def test_a_huge_body_gets_413(api, executor_config):
    config = executor_config(max_agent_code_bytes=1000, max_agent_archive_bytes=1000, max_batch_tasks=1)
    assert max_body_bytes(config) == 6000 + 4100 + 1024 * 1024
    raw = json.dumps({**GOOD, "agent_code": "x" * (2 * 1024 * 1024)}).encode()
    response = api.post("/evaluate", data=raw, content_type="application/json")
    assert_refused(response, 413, "payload_too_large")
    assert Evaluation.objects.count() == 0


def test_admission_refuses_at_capacity_with_retry_after(api, executor_config):
    executor_config(max_concurrent_evals=2, max_queued_evals=1)
    for _ in range(3):
        assert post(api, GOOD).status_code == 202
    response = post(api, GOOD)
    assert_refused(response, 503, "at_capacity")
    assert int(response["Retry-After"]) >= 1
    assert Evaluation.objects.count() == 3
    # A finished evaluation frees its slot.
    Evaluation.objects.filter(id=Evaluation.objects.first().id).update(status=Status.COMPLETED)
    assert post(api, GOOD).status_code == 202


def test_at_capacity_a_replay_still_answers_and_a_slot_freed_is_taken(api, executor_config):
    """Once full, a process answers from a read without the write lock (api/admission.py); same answers."""
    executor_config(max_concurrent_evals=1, max_queued_evals=0)
    first = post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k-full")
    assert first.status_code == 202
    for _ in range(2):  # the second refusal comes from the read without the lock
        assert_refused(post(api, {**GOOD, "agent_code": "print(2)"}), 503, "at_capacity")
    again = post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k-full")
    assert again.status_code == 202 and again.json()["eval_id"] == first.json()["eval_id"]
    assert_refused(
        post(api, {**GOOD, "agent_code": "other"}, HTTP_IDEMPOTENCY_KEY="k-full"), 409, "idempotency_conflict"
    )
    assert_refused(post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k-new"), 503, "at_capacity")
    Evaluation.objects.filter(id=first.json()["eval_id"]).update(status=Status.COMPLETED)
    assert post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k-new").status_code == 202
    assert_refused(post(api, GOOD), 503, "at_capacity")
    assert Evaluation.objects.count() == 2


def test_unknown_and_malformed_ids_are_404(api):
    assert_refused(api.get(f"/evaluate/{uuid.uuid4()}"), 404, "not_found")
    assert_refused(api.get("/evaluate/not-a-uuid"), 404, "not_found")
    assert_refused(api.delete(f"/evaluate/{uuid.uuid4()}"), 404, "not_found")


def test_unknown_route_and_wrong_method_use_the_envelope(api):
    assert_refused(api.get("/nope"), 404, "not_found")
    assert_refused(api.put("/evaluate", data="{}", content_type="application/json"), 405, "method_not_allowed")
    assert_refused(api.get("/evaluate"), 405, "method_not_allowed")
    assert_refused(api.post("/evaluations"), 405, "method_not_allowed")


def test_delete_cancels_a_pending_evaluation_at_once(api):
    eval_id = post(api, GOOD).json()["eval_id"]
    response = api.delete(f"/evaluate/{eval_id}")
    assert response.status_code == 202
    assert response.json() == {"eval_id": eval_id, "status": "cancelled"}
    evaluation = Evaluation.objects.get(id=eval_id)
    assert (evaluation.status, evaluation.step, evaluation.passed) == ("cancelled", "done", False)
    assert evaluation.finished_at is not None and evaluation.results_sha256
    steps = list(evaluation.transitions.values_list("step", "status"))
    assert steps == [("queued", "pending"), ("done", "cancelled")]
    assert_refused(api.delete(f"/evaluate/{eval_id}"), 409, "already_finished")


def test_delete_asks_a_running_evaluation_to_stop(api):
    eval_id = post(api, GOOD).json()["eval_id"]
    Evaluation.objects.filter(id=eval_id).update(status=Status.RUNNING, step=Step.RUNNING_AGENT)
    response = api.delete(f"/evaluate/{eval_id}")
    assert response.status_code == 202
    assert response.json()["status"] == "running"
    assert Evaluation.objects.get(id=eval_id).cancel_requested


def test_idempotency_key_replays_and_conflicts(api):
    first = post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k-1")
    again = post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 202
    assert first.json()["eval_id"] == again.json()["eval_id"]
    assert Evaluation.objects.count() == 1
    assert_refused(post(api, {**GOOD, "agent_code": "other"}, HTTP_IDEMPOTENCY_KEY="k-1"), 409, "idempotency_conflict")
    assert_refused(post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k" * 201), 400, "invalid_request", "Idempotency-Key")
    assert Evaluation.objects.count() == 1
