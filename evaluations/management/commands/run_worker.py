"""`manage.py run_worker`: claim pending evaluations and run each in its own process.

1. Beats a heartbeat row before claiming anything, so the reaper never takes
   a starting worker for a lost one.
2. Claims atomically (see worker/claim.py), at most MAX_CONCURRENT_EVALS at once.
3. Sleeps until something happens: a child exits (its sentinel), the API
   wrote a row (wake socket / NOTIFY), or the slow safety-net poll.
4. A child that died leaves its evaluation failed with the reason, and the
   worker goes on serving.
5. Running evaluations asked to stop (DELETE, TTL) get their cancel event set.
6. SIGTERM: stop claiming, let running evaluations finish for
   SHUTDOWN_GRACE_SECS, then cancel them with "executor shutting down".
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import uuid
from multiprocessing.connection import wait

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection, connections
from django.db.models.functions import Now

from evaluations import lifecycle, reaper, wakeup
from evaluations.callbacks import Dispatcher
from evaluations.checks import log_startup_warnings
from evaluations.models import Evaluation, Status, WorkerHeartbeat
from evaluations.worker.claim import claim
from evaluations.worker.pool import Pool, describe_exit

logger = logging.getLogger("term_executor.worker")

POLL_SECS = 2.0  # safety net when no wake-up arrives
SHUTTING_DOWN = "executor shutting down"


class PostgresListener:
    """LISTEN for the API's NOTIFY on its own autocommit connection."""

    def __init__(self):
        import psycopg

        params = connection.get_connection_params()
        self.conn = psycopg.connect(**params, autocommit=True)
        self.conn.execute(f"LISTEN {wakeup.CHANNEL}")

    def fileno(self) -> int:
        return self.conn.fileno()

    def drain(self) -> None:
        for _ in self.conn.notifies(timeout=0):
            pass

    def close(self) -> None:
        self.conn.close()


class Command(BaseCommand):
    help = "Run evaluations: claim pending ones and execute each in its own process."
    requires_system_checks = []  # its start-up warnings are logged (one line each, LOG_FORMAT applies)

    def handle(self, *args, **options):
        from evaluations.runtime import become_subreaper, sandbox_uid, select_runtime

        config = settings.EXECUTOR
        config.workspace_base.mkdir(parents=True, exist_ok=True)
        os.chmod(config.workspace_base, 0o711)
        try:
            # The probe runs as nobody, outside the uid pool: no evaluation holds it (runtime/uids.py).
            runtime = select_runtime(config.sandbox, uid=sandbox_uid(), workdir=config.workspace_base)
        except Exception as exc:
            raise CommandError(f"SANDBOX={config.sandbox}: {exc}") from exc
        log_startup_warnings()
        become_subreaper()  # orphans of a dead evaluation process come to us, not to init
        self.config = config
        self.sandbox = runtime.name
        self.worker_id = f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stop_requested_at: float | None = None
        self.pool = Pool(config.max_concurrent_evals, self.sandbox)
        self.callbacks = Dispatcher(config)
        self.beat(stopping=False)
        self.wake = wakeup.WakeSocket(config.data_dir, self.worker_id)
        self.listener = None  # PostgreSQL LISTEN connection, opened by the first tick
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        logger.info(
            "worker %s started: capacity %d, sandbox %s", self.worker_id, config.max_concurrent_evals, self.sandbox
        )
        try:
            self.loop()
        finally:
            self.callbacks.shutdown()
            self.wake.close()
            if self.listener:
                self.listener.close()
            WorkerHeartbeat.objects.filter(worker_id=self.worker_id).delete()
            logger.info("worker %s stopped", self.worker_id)

    def request_stop(self, signum, frame):
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()

    def beat(self, stopping: bool) -> None:
        """Stamped with the database's clock, which every host's reaper also judges by."""
        fields = {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "capacity": self.config.max_concurrent_evals,
            "sandbox": self.sandbox,
            "last_beat_at": Now(),
            "stopping": stopping,
        }
        if not WorkerHeartbeat.objects.filter(worker_id=self.worker_id).update(**fields):
            WorkerHeartbeat.objects.create(worker_id=self.worker_id, **fields)

    def loop(self) -> None:
        """Run ticks until stopped; a failing tick (database restart, a folder gone mid-reap) is
        logged and retried, because one hiccup must not take the worker and its slots down."""
        self.next_beat = self.next_reap = 0.0
        while True:
            try:
                if self.tick():
                    return
            except Exception:
                logger.exception("worker tick failed; retrying in 1 s")
                connections.close_all()
                if self.listener is not None:
                    self.listener.close()
                    self.listener = None  # reconnected by the next tick
                time.sleep(1)

    def tick(self) -> bool:
        """One pass: beat, reap, collect, cancel, call back, claim, then sleep until woken."""
        config = self.config
        close_old_connections()
        if self.listener is None and connection.vendor == "postgresql":
            self.listener = PostgresListener()
        now = time.monotonic()
        stopping = self.stop_requested_at is not None
        if now >= self.next_beat:
            self.beat(stopping)
            self.next_beat = now + max(1.0, config.worker_stale_secs / 3)
        if now >= self.next_reap and not stopping:
            self.reap()
            self.next_reap = now + config.reap_interval_secs
        self.collect_finished()
        self.forward_cancels()
        self.callbacks.dispatch()
        if stopping:
            if now - self.stop_requested_at >= config.shutdown_grace_secs:
                self.cancel_all(SHUTTING_DOWN)
            if not self.pool.running:
                return True
        elif self.pool.free > 0:
            for eval_id in claim(self.worker_id, self.pool.free):
                self.pool.start(eval_id)
                logger.info("claimed", extra={"eval_id": eval_id})
        waitables = [self.wake, *self.pool.sentinels()]
        if self.listener is not None:
            waitables.append(self.listener)
        ready = wait(waitables, timeout=0.5 if stopping else POLL_SECS)
        if self.wake in ready:
            self.wake.drain()
        if self.listener is not None and self.listener in ready:
            self.listener.drain()
        return False

    def collect_finished(self) -> None:
        """A child that ended without ending its evaluation died: fail it, clean up after it."""
        for eval_id, exitcode in self.pool.reap():
            row = Evaluation.objects.filter(id=eval_id).values("status", "step").first()
            if row is None or row["status"] not in (Status.PENDING, Status.RUNNING):
                continue
            reason = f"{row['step']}: executor process died ({describe_exit(exitcode)})"
            lifecycle.finish(eval_id, Status.FAILED, error=reason)
            logger.error(reason, extra={"eval_id": eval_id})
            reaper.remove_orphan_folders(self.config.workspace_base)

    def forward_cancels(self) -> None:
        if not self.pool.running:
            return
        ttl = self.config.session_ttl_secs
        for eval_id, entry in self.pool.running.items():
            if not entry.cancel_sent and time.monotonic() - entry.started > ttl:
                Evaluation.objects.filter(id=eval_id, status=Status.RUNNING).update(
                    cancel_requested=True, cancel_reason=reaper.TTL_EXPIRED
                )
        asked = Evaluation.objects.filter(
            id__in=list(self.pool.running), status=Status.RUNNING, cancel_requested=True
        ).values_list("id", flat=True)
        for eval_id in asked:
            self.pool.cancel(str(eval_id))

    def cancel_all(self, reason: str) -> None:
        ids = [eval_id for eval_id, entry in self.pool.running.items() if not entry.cancel_sent]
        if ids:
            Evaluation.objects.filter(id__in=ids, status=Status.RUNNING, cancel_requested=False).update(
                cancel_requested=True, cancel_reason=reason
            )
            for eval_id in ids:
                self.pool.cancel(eval_id)

    def reap(self) -> None:
        summary = reaper.reap(self.config)
        if summary.expired or summary.lost or summary.folders_removed or summary.purged:
            logger.info(summary.line())
