"""POST/GET/DELETE /batches and GET /batches' paging (SPEC §14), without a worker: validation refuses
the whole batch and creates nothing, MAX_OPEN_BATCHES, Idempotency-Key, the batch's end."""

import base64
import io
import json
import tarfile

import pytest

from evaluations import lifecycle
from evaluations.models import AgentArchive, Batch, Evaluation, Status, Transition

pytestmark = pytest.mark.django_db

URLS = [f"https://example.com/task{i}.tar.gz" for i in range(3)]
GOOD = {"agent_code": "print('hi')", "agent_language": "python", "task_urls": URLS}


def post(api, body, **headers):
    return api.post("/batches", data=json.dumps(body), content_type="application/json", **headers)


def nothing_created():
    return Batch.objects.count() == 0 and Evaluation.objects.count() == 0 and Transition.objects.count() == 0


def test_a_batch_queues_its_evaluations_in_task_urls_order(api):
    response = post(api, {**GOOD, "env": {"MODE": "x"}, "metadata": {"run": 7}, "timeout_secs": 30})
    assert response.status_code == 202
    body = response.json()
    assert set(body) == {"batch_id", "eval_ids", "status"} and body["status"] == "pending"
    assert response["Location"] == f"/batches/{body['batch_id']}"
    rows = {str(e.id): e for e in Evaluation.objects.all()}
    assert [rows[i].task_url for i in body["eval_ids"]] == URLS
    first = rows[body["eval_ids"][0]]
    assert (first.env, first.metadata, first.timeout_secs, first.status) == ({"MODE": "x"}, {"run": 7}, 30, "pending")
    assert str(first.batch_id) == body["batch_id"] and first.agent_sha256
    # The worker claims oldest first: the batch's order is the queue's.
    queued = Evaluation.objects.filter(status=Status.PENDING).order_by("created_at").values_list("id", flat=True)
    assert [str(i) for i in queued] == body["eval_ids"]


def test_the_body_cap_makes_room_for_max_batch_tasks_long_urls_with_escaped_slashes(api, executor_config):
    executor_config(max_agent_code_bytes=1000, max_agent_archive_bytes=1000, max_batch_tasks=400)
    urls = [f"https://example.com/{i:03}/" + "a/" * 1010 for i in range(400)]  # 2044 characters, half slashes
    raw = json.dumps({**GOOD, "task_urls": urls}).replace("/", "\\/")  # as PHP's json_encode writes them
    assert len(raw) > 6 * 1000 + 1024 * 1024  # over the cap that counted only agent_code
    response = api.post("/batches", data=raw, content_type="application/json")
    assert response.status_code == 202, response.content[:300]
    assert Evaluation.objects.filter(batch_id=response.json()["batch_id"]).count() == 400


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"task_urls": []}, "task_urls", "at least one"),
        ({"task_urls": [f"https://h/{i}" for i in range(4)]}, "task_urls", "at most 3"),
        ({"task_urls": [URLS[0], URLS[1], URLS[0]]}, "task_urls", "task_urls[2]: the same URL as task_urls[0]"),
        ({"task_urls": [URLS[0], "ftp://h/x.tar.gz", URLS[2]]}, "task_urls", "task_urls[1]: scheme must be"),
        ({"task_urls": [URLS[0], 5]}, "task_urls", "task_urls[1]: must be a non-empty string"),
        ({"task_urls": "https://h/x"}, "task_urls", "list"),
        ({"task_urls": None}, "task_urls", ""),
        ({"agent_archive": "eHg="}, "agent_code", "both were given"),
        ({"agent_code": None}, "agent_archive", "neither was given"),
        ({"callback_url": "ftp://h/"}, "callback_url", "scheme"),
        ({"env": {"PATH": "/x"}}, "env", "reserved"),
        ({"timeout_secs": 0}, "timeout_secs", "between"),
        ({"task_url": URLS[0]}, "task_url", "unknown field"),
    ],  # fmt: skip
)
def test_a_bad_request_is_refused_whole_naming_the_field(api, executor_config, change, field, words):
    executor_config(max_batch_tasks=3)
    body = {**GOOD, **change}
    body = {name: value for name, value in body.items() if value is not None or name == "task_urls"}
    response = post(api, body)
    assert response.status_code == 400, response.content
    problems = response.json()["fields"]
    assert field in problems and words in " ".join(problems[field])
    assert nothing_created()


def test_over_max_open_batches_is_503_at_capacity(api, executor_config):
    executor_config(max_open_batches=2)
    assert [post(api, GOOD).status_code for _ in range(2)] == [202, 202]
    refused = post(api, {**GOOD, "task_urls": ["https://h/other"]})
    assert refused.status_code == 503
    assert refused.json()["error"] == "at_capacity" and "2 batches" in refused.json()["detail"]
    assert int(refused["Retry-After"]) >= 1
    assert Batch.objects.count() == 2 and Evaluation.objects.count() == 6


def test_batch_evaluations_do_not_count_against_the_single_queue(api, executor_config):
    executor_config(max_concurrent_evals=1, max_queued_evals=0, max_batch_tasks=5)
    assert post(api, {**GOOD, "task_urls": [f"https://h/{i}" for i in range(5)]}).status_code == 202
    single = api.post(
        "/evaluate", data=json.dumps({"agent_code": "x", "task_url": URLS[0]}), content_type="application/json"
    )
    assert single.status_code == 202
    again = api.post(
        "/evaluate", data=json.dumps({"agent_code": "x", "task_url": URLS[1]}), content_type="application/json"
    )
    assert again.status_code == 503


def test_idempotency_key_replays_and_conflicts(api):
    first = post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k1")
    replay = post(api, GOOD, HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == replay.status_code == 202
    assert replay.json() == first.json()
    conflict = post(api, {**GOOD, "task_urls": URLS[:2]}, HTTP_IDEMPOTENCY_KEY="k1")
    assert conflict.status_code == 409 and conflict.json()["error"] == "idempotency_conflict"
    assert Batch.objects.count() == 1 and Evaluation.objects.count() == 3
    assert post(api, GOOD, HTTP_IDEMPOTENCY_KEY="x" * 201).status_code == 400


def archive_of(files: dict) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def test_an_archive_agent_is_stored_once_for_the_whole_batch(api):
    body = {**GOOD, "agent_code": None, "agent_archive": archive_of({"agent.py": "print('hi')\n"})}
    del body["agent_code"]
    response = post(api, body)
    assert response.status_code == 202, response.content
    assert AgentArchive.objects.count() == 1
    archive = AgentArchive.objects.get()
    batch = Batch.objects.get()
    assert batch.agent_archive_id == archive.sha256 and batch.agent_code == ""
    assert set(Evaluation.objects.values_list("agent_archive_id", flat=True)) == {archive.sha256}
    assert set(Evaluation.objects.values_list("agent_sha256", flat=True)) == {archive.sha256}


def test_get_shows_counts_and_reward_once_all_finished(api):
    body = post(api, {**GOOD, "callback_url": "https://example.com/hook"}).json()
    batch_id, ids = body["batch_id"], body["eval_ids"]
    shown = api.get(f"/batches/{batch_id}").json()
    assert shown["status"] == "pending" and shown["reward"] is None and shown["total"] == 3
    assert [e["task_url"] for e in shown["evaluations"]] == URLS
    assert set(shown["evaluations"][0]) == {
        "eval_id",
        "task_url",
        "attempt",
        "status",
        "passed",
        "reward",
        "error_kind",
    }
    lifecycle.record(ids[0], status=Status.RUNNING, expect=[Status.PENDING])
    assert api.get(f"/batches/{batch_id}").json()["status"] == "running"
    lifecycle.finish(ids[0], Status.COMPLETED, expect=[Status.RUNNING])
    lifecycle.finish(ids[1], Status.FAILED, error="tests failed", kind="tests_failed")
    middle = api.get(f"/batches/{batch_id}").json()
    assert (middle["finished"], middle["passed"], middle["failed"], middle["reward"]) == (2, 1, 1, None)
    assert middle["evaluations"][1]["error_kind"] == "tests_failed"
    lifecycle.finish(ids[2], Status.COMPLETED)
    ending = api.get(f"/batches/{batch_id}").json()  # every evaluation ended, settle not yet run
    assert (ending["status"], ending["finished_at"]) == ("completed", None)
    assert lifecycle.settle(batch_id)  # the test's transaction holds lifecycle's on_commit back
    assert not lifecycle.settle(batch_id)  # once: a second call (a second worker) ends nothing
    done = api.get(f"/batches/{batch_id}").json()
    assert done["status"] == "completed" and done["finished_at"] is not None
    assert done["reward"] == pytest.approx(2 / 3)
    batch = Batch.objects.get()
    assert (batch.status, batch.callback_state) == ("completed", "pending")
    assert Evaluation.objects.exclude(callback_state="").count() == 0  # the batch calls back, not its tasks


def test_unknown_ids_are_404(api):
    for method in ("get", "delete"):
        for bad in ("nope", "0d7f1405-1a5a-4372-a2e8-b2157a35d163"):
            response = getattr(api, method)(f"/batches/{bad}")
            assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_delete_cancels_a_pending_batch(api):
    body = post(api, GOOD).json()
    response = api.delete(f"/batches/{body['batch_id']}")
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    assert set(Evaluation.objects.values_list("status", flat=True)) == {"cancelled"}
    shown = api.get(f"/batches/{body['batch_id']}").json()
    assert shown["status"] == "cancelled" and shown["cancelled"] == 3 and shown["finished_at"] is not None
    assert shown["reward"] == 0
    assert api.delete(f"/batches/{body['batch_id']}").status_code == 409


def test_delete_of_a_running_batch_asks_the_running_to_stop(api):
    body = post(api, GOOD).json()
    running = body["eval_ids"][0]
    lifecycle.record(running, status=Status.RUNNING, expect=[Status.PENDING])
    assert api.delete(f"/batches/{body['batch_id']}").status_code == 202
    assert Evaluation.objects.get(id=running).cancel_requested
    shown = api.get(f"/batches/{body['batch_id']}").json()
    assert shown["status"] == "cancelled" and shown["finished_at"] is None and shown["cancelled"] == 2
    lifecycle.finish(running, Status.CANCELLED, expect=[Status.RUNNING])
    assert lifecycle.settle(body["batch_id"])
    assert Batch.objects.get().status == "cancelled"


def test_list_pages_like_evaluations_and_filters_by_status(api, executor_config):
    executor_config(max_open_batches=10)
    made = [post(api, {**GOOD, "task_urls": [f"https://h/{n}"]}).json()["batch_id"] for n in range(5)]
    first = api.get("/batches?limit=2")
    assert first.status_code == 200
    rows = first.json()
    assert set(rows[0]) == {
        "batch_id", "status", "total", "finished", "passed", "failed", "cancelled", "reward", "created_at",
        "finished_at", "owner", "attempts", "mean_reward", "pass_at_k", "agent_sha256", "executor_version",
    }  # fmt: skip
    assert 'rel="next"' in first["Link"] and f"before={rows[-1]['batch_id']}" in first["Link"]
    seen = [r["batch_id"] for r in rows]
    while "Link" in first:
        first = api.get(f"/batches?limit=2&before={seen[-1]}")
        seen += [r["batch_id"] for r in first.json()]
    assert seen == list(reversed(made))
    api.delete(f"/batches/{made[0]}")
    assert [r["batch_id"] for r in api.get("/batches?status=cancelled").json()] == [made[0]]
    assert len(api.get("/batches?status=pending").json()) == 4
    for query, field in (("status=failed", "status"), ("limit=0", "limit"), ("before=nope", "before")):
        response = api.get(f"/batches?{query}")
        assert response.status_code == 400 and field in response.json()["fields"]


def test_routes_need_the_token(api, executor_config):
    executor_config(auth_tokens=("t",))
    assert post(api, GOOD).status_code == 401
    assert api.get("/batches").status_code == 401
    assert post(api, GOOD, HTTP_AUTHORIZATION="Bearer t").status_code == 202
    assert nothing_created() is False


def test_the_reaper_ends_a_batch_whose_last_evaluation_ended_without_ending_it(api, settings):
    from evaluations.worker import reaper

    body = post(api, {**GOOD, "task_urls": URLS[:1], "callback_url": "https://example.com/hook"}).json()
    # lifecycle.finish's settle waits for a commit the test's transaction never makes: as if the
    # worker died between the evaluation's commit and its batch's settle.
    lifecycle.finish(body["eval_ids"][0], Status.COMPLETED)
    assert Batch.objects.get().finished_at is None
    reaper.reap(settings.EXECUTOR)
    batch = Batch.objects.get()
    assert (batch.status, batch.callback_state) == ("completed", "pending") and batch.finished_at
