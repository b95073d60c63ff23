"""The row watcher (evaluations/pipeline/cancel.py): an evaluation process learns of a cancel from its row."""

from __future__ import annotations

import pytest

from evaluations import lifecycle
from evaluations.models import Evaluation, Status
from evaluations.pipeline.cancel import CancelState, Stop, watch_row
from evaluations.worker.claim import claim

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_row_watcher_turns_the_row_into_the_cancel_state(monkeypatch):
    monkeypatch.setattr("evaluations.pipeline.cancel.WATCH_SECS", 0.01)
    row = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    claim("test-worker", 1)

    def watched() -> CancelState:
        state, done = CancelState(), _SetAfter(3)
        watch_row(str(row.id), state, done)
        return state

    assert not watched().is_set()
    lifecycle.cancel(row.id, "cancelled by DELETE")
    state = watched()
    assert (state.stop, state.reason) == (Stop.CANCELLED, "cancelled by DELETE")
    lifecycle.finish(row.id, Status.FAILED, error="cloning_repo: executor worker lost")
    assert watched().stop is Stop.ENDED_ELSEWHERE


class _SetAfter:
    """A done event that lets the watcher look ``n`` times."""

    def __init__(self, n: int):
        self.left = n

    def wait(self, timeout):
        self.left -= 1
        return self.left < 0
