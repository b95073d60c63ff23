"""A batch ends once: two workers ending its last two evaluations at the same moment, on PostgreSQL.

On SQLite, writers take turns by design (one write lock), and the test database is in memory with a
shared cache, where a second writer gets "table is locked" at once instead of waiting: the
sequential case (a second settle ends nothing) is tests/api/test_batches.py's.
"""

import threading

import pytest
from django.db import connection

from evaluations import lifecycle
from evaluations.models import Batch, Evaluation, Status

pytestmark = pytest.mark.django_db(transaction=True)


def end_last_two_together(monkeypatch, real_settle) -> list[bool]:
    """Both finishes commit, then both settles run at once; returns what each settle returned."""
    batch = Batch.objects.create(agent_code="x", callback_url="https://example.com/hook")
    ids = [
        Evaluation.objects.create(batch=batch, task_url=f"https://h/{i}", agent_code="x", status=Status.RUNNING).id
        for i in range(2)
    ]
    both_ended = threading.Barrier(2, timeout=30)
    ended_it, errors = [], []

    def settle_after_both(batch_id):
        # Each settle then sees no active evaluation: only the conditional UPDATE keeps the batch
        # from ending (and queueing its callback) twice.
        both_ended.wait()
        ended_it.append(real_settle(batch_id))

    monkeypatch.setattr(lifecycle, "settle", settle_after_both)

    def finish(eval_id):
        try:
            lifecycle.finish(eval_id, Status.COMPLETED, expect=[Status.RUNNING])
        except Exception as exc:  # reported below: a thread's exception is otherwise lost
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=finish, args=(eval_id,)) for eval_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    batch.refresh_from_db()
    assert (batch.status, batch.callback_state) == (Status.COMPLETED, "pending") and batch.finished_at
    return ended_it


def test_the_last_two_evaluations_ending_together_end_the_batch_once(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers: PostgreSQL only (see the module's docstring)")
    real_settle = lifecycle.settle
    for _ in range(8):
        assert sorted(end_last_two_together(monkeypatch, real_settle)) == [False, True]
