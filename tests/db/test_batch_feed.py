"""A batch's event stream (events/stream.py ``BatchFeed``): the cursor of an evaluation's last event
says it ended, whichever of its status and its rows the read saw change first."""

from __future__ import annotations

import pytest
from django.utils import timezone

from evaluations.events.cursor import Position
from evaluations.events.stream import BatchFeed
from evaluations.models import Batch, Evaluation, Status, Step, Transition

pytestmark = pytest.mark.django_db

STEPS = [(Step.QUEUED, Status.PENDING), (Step.QUEUED, Status.RUNNING), (Step.CLEANUP, Status.RUNNING)]


def _evaluation(batch, status: str, *, ended: bool) -> Evaluation:
    evaluation = Evaluation.objects.create(batch=batch, task_url="https://h/t", agent_code="x", status=status)
    rows = [*STEPS, (Step.CLEANUP, Status.COMPLETED)] if ended else STEPS
    for step, state in rows:
        Transition.objects.create(evaluation=evaluation, step=step, status=state, at=timezone.now())
    return evaluation


def _ids(frames: list[bytes]) -> list[str]:
    return [frame.decode().split("\n", 1)[0].removeprefix("id: ") for frame in frames]


def test_the_last_event_of_an_evaluation_that_ended_between_its_status_and_its_rows_says_so():
    """The read takes the statuses, then the rows: an evaluation that ended in between reads as
    running with its ending transition among its rows (its status and that transition commit together).
    That transition's event carries "d", as it does when the status was read ended."""
    batch = Batch.objects.create(agent_code="x")
    done = _evaluation(batch, Status.COMPLETED, ended=True)
    raced = _evaluation(batch, Status.RUNNING, ended=True)  # the status as read before the end's commit
    running = _evaluation(batch, Status.RUNNING, ended=False)
    ids = [done.id, raced.id, running.id]
    feed = BatchFeed(batch.id, ids, [Position() for _ in ids], done_body=dict)
    frames = feed.read_rows()
    assert len(frames) == 4 + 4 + 3
    assert _ids(frames)[7] == "d*2,0.0"  # the raced one's ending step: ended, as the done one's
    assert _ids(frames)[-1] == "d*2,3.0"
    assert not feed.ended  # the batch itself has not finished
