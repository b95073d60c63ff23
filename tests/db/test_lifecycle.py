"""lifecycle.record: the conditional row update and the transition chain, on the configured database."""

import datetime

import pytest
from django.utils import timezone

from evaluations import lifecycle
from evaluations.models import Evaluation, Status, Step, Transition

pytestmark = pytest.mark.django_db

T0 = datetime.datetime(2026, 11, 23, 7, 0, 0, tzinfo=datetime.UTC)


@pytest.fixture
def clock(monkeypatch):
    """timezone.now() as record() sees it, moved by hand."""
    now = {"at": T0}
    monkeypatch.setattr(lifecycle.timezone, "now", lambda: now["at"])

    def advance(ms: int) -> None:
        now["at"] += datetime.timedelta(milliseconds=ms)

    return advance


def new_evaluation() -> Evaluation:
    return Evaluation.objects.create(
        task_url="https://example.com/t.tgz", agent_code="x", status=Status.PENDING, step=Step.QUEUED, created_at=T0
    )


def chain(evaluation) -> list[tuple]:
    return list(
        Transition.objects.filter(evaluation=evaluation)
        .order_by("at", "id")
        .values_list("step", "status", "at", "duration_ms")
    )


def test_each_change_stores_a_transition_and_closes_the_previous_one(clock):
    evaluation = new_evaluation()
    assert lifecycle.record(
        evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], worker_id="w1", started_at=T0
    )
    clock(250)
    assert lifecycle.record(str(evaluation.id), step=Step.DOWNLOADING_TASK)  # a str id works too
    clock(1500)
    assert lifecycle.record(evaluation.id, step=Step.CLONING_REPO)
    assert chain(evaluation) == [
        (Step.QUEUED, Status.RUNNING, T0, 250),
        (Step.DOWNLOADING_TASK, Status.RUNNING, T0 + datetime.timedelta(milliseconds=250), 1500),
        (Step.CLONING_REPO, Status.RUNNING, T0 + datetime.timedelta(milliseconds=1750), None),
    ]
    evaluation.refresh_from_db()
    assert (evaluation.step, evaluation.status, evaluation.worker_id, evaluation.started_at) == (
        Step.CLONING_REPO,
        Status.RUNNING,
        "w1",
        T0,
    )


def test_a_row_not_in_the_expected_status_changes_nothing(clock):
    evaluation = new_evaluation()
    lifecycle.record(evaluation.id, step=Step.QUEUED)
    before = chain(evaluation)
    clock(10)
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.RUNNING], worker_id="late") is False
    assert chain(evaluation) == before
    evaluation.refresh_from_db()
    assert (evaluation.status, evaluation.worker_id) == (Status.PENDING, "")
    assert lifecycle.record("6f1f4a56-5ad4-4f0f-9d62-0fbd3f9b3c11", step=Step.CLEANUP) is False  # no such row


def test_finish_ends_the_chain_with_done_and_the_final_status(clock):
    evaluation = new_evaluation()
    lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], started_at=timezone.now())
    clock(40)
    assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: task defines no tests")
    steps = chain(evaluation)
    assert steps[-2][3] == 40 and steps[-1][:2] == (Step.DONE, Status.FAILED) and steps[-1][3] is None
    evaluation.refresh_from_db()
    assert (evaluation.passed, evaluation.duration_ms, evaluation.error) == (
        False,
        40,
        "running_tests: task defines no tests",
    )
    assert lifecycle.finish(evaluation.id, Status.COMPLETED) is False  # already ended
