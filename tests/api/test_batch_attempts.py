"""POST /batches' attempts and the batch object's pass@k figures (SPEC §17), without a worker: every
evaluation is ended by lifecycle.finish, as the worker ends it, with the reward its grader gave."""

import json

import pytest

from evaluations import lifecycle, representation
from evaluations.models import Batch, Evaluation, Status, Transition

pytestmark = pytest.mark.django_db

URLS = [f"https://example.com/task{i}.tar.gz" for i in range(3)]
GOOD = {"agent_code": "print('hi')", "task_urls": URLS[:2]}


def post(api, body, **headers):
    return api.post("/batches", data=json.dumps(body), content_type="application/json", **headers)


def nothing_created():
    return Batch.objects.count() == 0 and Evaluation.objects.count() == 0 and Transition.objects.count() == 0


def test_each_task_url_runs_attempts_times_first_attempts_first(api):
    response = post(api, {**GOOD, "attempts": 3})
    assert response.status_code == 202, response.content
    body = response.json()
    assert Batch.objects.get().attempts == 3
    rows = {str(e.id): e for e in Evaluation.objects.all()}
    assert [(rows[i].attempt, rows[i].task_url) for i in body["eval_ids"]] == [
        (attempt, url) for attempt in (1, 2, 3) for url in URLS[:2]
    ]
    # The worker claims oldest first: eval_ids are in queue order, every first attempt before any second.
    queued = Evaluation.objects.filter(status=Status.PENDING).order_by("created_at").values_list("id", flat=True)
    assert [str(i) for i in queued] == body["eval_ids"]
    assert Transition.objects.count() == 6
    shown = api.get(f"/batches/{body['batch_id']}").json()
    assert shown["attempts"] == 3 and shown["total"] == 6
    assert [e["attempt"] for e in shown["evaluations"]] == [1, 1, 2, 2, 3, 3]
    assert shown["tasks"] == [
        {"task_url": url, "attempts": 3, "passes": 0, "pass_at_k": None, "mean_reward": None} for url in URLS[:2]
    ]


def test_attempts_defaults_to_one(api):
    body = post(api, GOOD).json()
    assert Batch.objects.get().attempts == 1
    assert set(Evaluation.objects.values_list("attempt", flat=True)) == {1}
    shown = api.get(f"/batches/{body['batch_id']}").json()
    assert shown["attempts"] == 1 and [t["attempts"] for t in shown["tasks"]] == [1, 1]


@pytest.mark.parametrize(
    ("attempts", "words"),
    [
        (0, "must be between 1 and 4 (MAX_ATTEMPTS)"),
        (-1, "must be between 1 and 4 (MAX_ATTEMPTS)"),
        (5, "must be between 1 and 4 (MAX_ATTEMPTS)"),
        (10**9, "must be between 1 and 4"),
        ("2", "A valid integer is required."),
        (2.0, "A valid integer is required."),
        (1.5, "A valid integer is required."),
        (True, "A valid integer is required."),
        ([2], "A valid integer is required."),
        ({"n": 2}, "A valid integer is required."),
        (None, "This field may not be null."),
    ],  # fmt: skip
)
def test_a_bad_attempts_is_refused_naming_the_field(api, executor_config, attempts, words):
    executor_config(max_attempts=4)
    response = post(api, {**GOOD, "attempts": attempts})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == "invalid_request" and set(body["fields"]) == {"attempts"}
    assert words in " ".join(body["fields"]["attempts"])
    assert nothing_created()


def test_max_batch_tasks_bounds_task_urls_times_attempts(api, executor_config):
    executor_config(max_batch_tasks=6, max_attempts=10)
    refused = post(api, {**GOOD, "task_urls": URLS, "attempts": 3})
    assert refused.status_code == 400
    assert refused.json()["fields"] == {
        "attempts": ["3 task URLs x 3 attempts is 9 evaluations; at most 6 (MAX_BATCH_TASKS) are allowed"]
    }
    assert nothing_created()
    assert post(api, {**GOOD, "task_urls": URLS, "attempts": 2}).status_code == 202
    assert Evaluation.objects.count() == 6


def test_attempts_is_part_of_the_idempotent_request(api):
    first = post(api, {**GOOD, "attempts": 2}, HTTP_IDEMPOTENCY_KEY="k")
    replay = post(api, {**GOOD, "attempts": 2}, HTTP_IDEMPOTENCY_KEY="k")
    assert first.status_code == replay.status_code == 202 and replay.json() == first.json()
    for other in ({**GOOD, "attempts": 3}, GOOD):  # another count, or none (the default) where one was given
        conflict = post(api, other, HTTP_IDEMPOTENCY_KEY="k")
        assert conflict.status_code == 409 and conflict.json()["error"] == "idempotency_conflict"
    assert Batch.objects.count() == 1 and Evaluation.objects.count() == 4


def summary_row(api, batch_id) -> dict:
    (row,) = [r for r in api.get("/batches").json() if r["batch_id"] == batch_id]
    return row


def assert_summary_agrees(api, batch_id) -> dict:
    """GET /batches' row is GET /batches/{id} without its tasks and evaluations (sums to float precision)."""
    document = api.get(f"/batches/{batch_id}").json()
    row = summary_row(api, batch_id)
    assert set(document) - set(row) == {"tasks", "evaluations", "signature"}
    for name, value in row.items():
        assert value == (pytest.approx(document[name]) if isinstance(value, float) else document[name]), name
    return document


def test_pass_at_k_and_mean_reward_per_task_and_over_the_batch(api, executor_config):
    executor_config(max_open_batches=2)
    body = post(api, {**GOOD, "attempts": 3}).json()
    batch_id, ids = body["batch_id"], body["eval_ids"]
    a, b = ids[0::2], ids[1::2]  # task0's attempts 1..3, task1's
    lifecycle.finish(a[0], Status.COMPLETED)  # reward 1.0
    lifecycle.finish(a[1], Status.FAILED, error="tests failed", kind="tests_failed")  # reward 0.0
    lifecycle.finish(b[0], Status.FAILED, error="tests failed", kind="tests_failed", reward=0.5)
    middle = assert_summary_agrees(api, batch_id)
    assert (middle["passed"], middle["reward"], middle["mean_reward"], middle["pass_at_k"]) == (1, None, None, None)
    assert [(t["passes"], t["pass_at_k"], t["mean_reward"]) for t in middle["tasks"]] == [
        (1, None, None),
        (0, None, None),
    ]
    lifecycle.finish(a[2], Status.FAILED, error="worker lost")  # infrastructure: no reward, counts 0
    task0_done = api.get(f"/batches/{batch_id}").json()["tasks"][0]
    assert task0_done == {
        "task_url": URLS[0], "attempts": 3, "passes": 1, "pass_at_k": 1.0, "mean_reward": pytest.approx(1 / 3),
    }  # fmt: skip
    lifecycle.finish(b[1], Status.FAILED, error="tests failed", kind="tests_failed", reward=0.25)
    lifecycle.finish(b[2], Status.CANCELLED, error="cancelled")  # no reward, counts 0
    ended = assert_summary_agrees(api, batch_id)
    assert (ended["status"], ended["total"], ended["finished"], ended["passed"]) == ("completed", 6, 6, 1)
    assert ended["reward"] == pytest.approx(1 / 6)  # passed / total, as before
    assert ended["mean_reward"] == pytest.approx((1.0 + 0.5 + 0.25) / 6)
    assert ended["pass_at_k"] == 0.5
    assert ended["tasks"] == [
        {"task_url": URLS[0], "attempts": 3, "passes": 1, "pass_at_k": 1.0, "mean_reward": pytest.approx(1 / 3)},
        {"task_url": URLS[1], "attempts": 3, "passes": 0, "pass_at_k": 0.0, "mean_reward": pytest.approx(0.25)},
    ]
    assert [(e["attempt"], e["reward"]) for e in ended["evaluations"]] == [
        (1, 1.0), (1, 0.5), (2, 0.0), (2, 0.25), (3, None), (3, None),
    ]  # fmt: skip
    assert lifecycle.settle(batch_id)
    assert assert_summary_agrees(api, batch_id)["finished_at"] is not None
    # The callback's body is the same document (worker/callbacks.py sends batch_json).
    assert representation.batch_json(batch_id) == api.get(f"/batches/{batch_id}").json()


def test_every_attempt_passing_and_a_cancelled_batch(api, executor_config):
    executor_config(max_open_batches=2)
    passing = post(api, {**GOOD, "attempts": 2}).json()
    for eval_id in passing["eval_ids"]:
        lifecycle.finish(eval_id, Status.COMPLETED)
    shown = assert_summary_agrees(api, passing["batch_id"])
    assert (shown["reward"], shown["mean_reward"], shown["pass_at_k"]) == (1.0, 1.0, 1.0)
    assert [(t["passes"], t["pass_at_k"], t["mean_reward"]) for t in shown["tasks"]] == [(2, 1.0, 1.0)] * 2
    cancelled = post(api, {**GOOD, "attempts": 2}).json()
    assert api.delete(f"/batches/{cancelled['batch_id']}").status_code == 202
    shown = assert_summary_agrees(api, cancelled["batch_id"])
    assert (shown["status"], shown["reward"], shown["mean_reward"], shown["pass_at_k"]) == ("cancelled", 0, 0, 0)
    assert [(t["passes"], t["pass_at_k"], t["mean_reward"]) for t in shown["tasks"]] == [(0, 0.0, 0.0)] * 2
