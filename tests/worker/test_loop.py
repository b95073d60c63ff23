"""The worker's loop (evaluations/worker/loop.py), one method at a time on the test database."""

from __future__ import annotations

import multiprocessing
import time

import pytest
from django.conf import settings

from evaluations import lifecycle
from evaluations.models import TTL_EXPIRED, Evaluation, Status
from evaluations.worker.claim import claim
from evaluations.worker.loop import Worker
from evaluations.worker.pool import Running

pytestmark = pytest.mark.django_db(transaction=True)


class PoolThatCannotStart:
    """The pool's start as it fails when the forkserver is gone or the host is out of processes."""

    capacity = free = 2
    running: dict = {}

    def start(self, eval_id, note=""):
        raise OSError(11, "Resource temporarily unavailable")


def worker_with(pool) -> Worker:
    return Worker(settings.EXECUTOR, pool, worker_id="test-worker")


def test_an_evaluation_whose_process_cannot_start_fails_at_once_with_the_cause():
    ids = [Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x").id for _ in range(2)]
    claimed = claim("test-worker", 2)
    assert sorted(map(str, claimed)) == sorted(map(str, ids))
    worker_with(PoolThatCannotStart()).start_claimed(claimed)
    for row in Evaluation.objects.filter(id__in=ids):
        # Not left running under a live worker, where nothing would ever end it.
        assert row.status == Status.FAILED
        assert row.error == (
            "queued: could not start the evaluation process: BlockingIOError: [Errno 11] Resource temporarily unavailable"
        )


def test_the_ttl_keeps_the_reason_of_a_cancel_already_asked_for():
    deleted = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    expired = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    claim("test-worker", 2)
    lifecycle.cancel(deleted.id, "cancelled by DELETE")
    long_ago = time.monotonic() - settings.EXECUTOR.session_ttl_secs - 5
    pool = PoolThatCannotStart()
    pool.running = {str(row.id): Running(str(row.id), None, None, started=long_ago) for row in (deleted, expired)}
    worker_with(pool).expire_sessions()
    reasons = dict(Evaluation.objects.values_list("id", "cancel_reason"))
    assert reasons == {deleted.id: "cancelled by DELETE", expired.id: TTL_EXPIRED}


def test_a_stop_asked_by_a_signal_wakes_the_loops_wait(tmp_path):
    """SIGTERM's handler runs while the loop waits (Python retries the interrupted select): the stop
    pokes the wake socket, so the wait ends now rather than at its poll (a service's stop took 2 s)."""
    from multiprocessing.connection import wait

    from evaluations.worker import wakeup

    worker = worker_with(PoolThatCannotStart())
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # a socket path longer than the kernel's 107 bytes
    worker.wake = wakeup.WakeSocket(deep, worker.worker_id)
    assert len(str(worker.wake.path)) > 107
    try:
        worker.request_stop()
        assert wait([worker.wake], timeout=30) == [worker.wake]
        worker.wake.drain()
        worker.request_stop()  # a second signal: the stop already asked, nothing more to wake
        assert wait([worker.wake], timeout=0) == []
    finally:
        worker.wake.close()


class RecordingPool:
    """A pool that starts nothing: it records what it was asked, and its one sentinel is ready, so a
    tick's closing wait returns at once."""

    capacity = free = 2
    running: dict = {}

    def __init__(self):
        self.started = []
        self.ready, writer = multiprocessing.Pipe(duplex=False)
        writer.send_bytes(b"ended")
        self._writer = writer

    def reap(self):
        return []  # nothing ended

    def start(self, eval_id, note=""):
        self.started.append(str(eval_id))

    def keep_spare(self):
        pass

    def sentinels(self):
        return [self.ready]


def test_a_tick_claims_the_freed_slot_before_its_other_work(monkeypatch, tmp_path):
    """The next evaluation is claimed as soon as the last one's end is collected: the tick's other
    work (callbacks, sandboxes, session expiry) comes after, off the hand-off (SPEC §25)."""
    pending = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    pool = RecordingPool()
    worker = worker_with(pool)
    worker.next_beat = worker.next_reap = time.monotonic() + 3600  # this tick neither beats nor reaps
    seen = {}

    def dispatch():
        seen["started when the callbacks ran"] = list(pool.started)
        return 0

    from evaluations.worker import wakeup

    monkeypatch.setattr(worker.callbacks, "dispatch", dispatch)
    worker.wake = wakeup.WakeSocket(tmp_path, worker.worker_id)
    try:
        assert worker.tick() is False
    finally:
        worker.wake.close()
    assert seen == {"started when the callbacks ran": [str(pending.id)]}
    assert Evaluation.objects.get(id=pending.id).status == Status.RUNNING
