"""GET /evaluate/{id} reads plain rows (evaluations/api/rows.py): its body is exactly what the model gives.

The reference is ``evaluation_json`` of the evaluation loaded through the ORM, rendered by
DRF's JSONRenderer: the bytes of the reply must be the same, for every kind of value a
column can hold (nulls, empty strings, JSON, datetimes with and without microseconds,
non-ASCII text), on SQLite and PostgreSQL alike.
"""

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.renderers import JSONRenderer

from evaluations.db.rows import Select
from evaluations.models import Evaluation, Status, Step, TestResult, Transition
from evaluations.representation import evaluation_json

pytestmark = pytest.mark.django_db

WHOLE_SECOND = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def reference(evaluation_id) -> bytes:
    evaluation = Evaluation.objects.prefetch_related("transitions", "test_results").get(id=evaluation_id)
    return JSONRenderer().render(evaluation_json(evaluation))


def assert_read_as_the_model(api, evaluation):
    response = api.get(f"/evaluate/{evaluation.id}")
    assert response.status_code == 200
    assert response.content == reference(evaluation.id)
    return response.json()


def test_a_new_evaluation_reads_as_the_model(api):
    eval_id = api.post("/evaluate", {"agent_code": "x", "task_url": "https://example.com/t.tgz"}, format="json").json()[
        "eval_id"
    ]
    body = assert_read_as_the_model(api, Evaluation.objects.get(id=eval_id))
    assert (body["passed"], body["error"], body["metadata"], body["results_sha256"]) == (None, None, None, None)


def test_an_ended_evaluation_with_every_kind_of_value_reads_as_the_model(api):
    evaluation = Evaluation.objects.create(
        task_url="https://example.com/ünï.tgz",
        agent_code="print('✓')",
        status=Status.FAILED,
        step=Step.DONE,
        passed=False,
        error="agent failed: exit 3 — see its output\n",
        created_at=WHOLE_SECOND,
        started_at=WHOLE_SECOND + timedelta(microseconds=7),
        finished_at=WHOLE_SECOND + timedelta(seconds=2, microseconds=123456),
        duration_ms=2000,
        metadata={"nested": {"list": [1, 2.5, None, True]}, "text": "é\u2028✓"},
        agent_output="out\u2029put ✓",
        agent_exit_code=-9,
        agent_patch="",
        test_output="\x1b[31mred\x1b[0m",
        results_sha256="ab" * 32,
    )
    # Two transitions at the same instant: their ids order them, as the ORM's ordering did.
    for i, (step, status) in enumerate([(Step.QUEUED, Status.PENDING), (Step.CLONING_REPO, Status.RUNNING)] * 2):
        Transition.objects.create(
            evaluation=evaluation, step=step, status=status, at=WHOLE_SECOND + timedelta(seconds=i // 2),
            duration_ms=None if i == 3 else i,
        )  # fmt: skip
    for position in (2, 0, 1):  # stored out of order: position orders them
        TestResult.objects.create(
            evaluation=evaluation, position=position, name=f"test_{position}.sh", kind="fail_to_pass",
            passed=position != 1, exit_code=None if position == 2 else position, timed_out=position == 2,
            duration_ms=position * 10, output="ünï\n" * position,
        )  # fmt: skip
    body = assert_read_as_the_model(api, evaluation)
    assert [r["name"] for r in body["test_results"]] == ["test_0.sh", "test_1.sh", "test_2.sh"]
    assert body["created_at"] == "2026-01-02T03:04:05Z"


def test_another_evaluations_rows_are_not_read(api):
    mine, other = (Evaluation.objects.create(task_url="https://e/t.tgz", agent_code="x") for _ in range(2))
    Transition.objects.create(evaluation=other, step=Step.QUEUED, status=Status.PENDING)
    TestResult.objects.create(evaluation=other, position=0, name="t", kind="test", passed=True)
    body = assert_read_as_the_model(api, mine)
    assert body["transitions"] == [] and body["test_results"] == []


def test_select_converts_each_column_as_the_orm_does():
    evaluation = Evaluation.objects.create(
        task_url="https://e/t.tgz", agent_code="x", passed=True, metadata=[1, {"a": "b"}], started_at=WHOLE_SECOND
    )
    from django.db import connections

    select = Select(Evaluation, ("id", "passed", "metadata", "started_at", "finished_at", "env"), where="id")
    with connections["default"].cursor() as cursor:
        (row,) = select.rows(cursor, evaluation.id)
        assert select.rows(cursor, uuid.uuid4()) == []
    loaded = Evaluation.objects.get(id=evaluation.id)
    for name in row._fields:
        assert getattr(row, name) == getattr(loaded, name) and type(getattr(row, name)) is type(getattr(loaded, name))
