"""The worker: claim pending evaluations and run each in its own process (`manage.py run_worker` runs it).

1. Beats a heartbeat row before claiming anything, so the reaper never takes
   a starting worker for a lost one.
2. Claims atomically (see worker/claim.py), at most MAX_CONCURRENT_EVALS at once.
3. Sleeps until something happens: a child exits (its sentinel), the API
   wrote a row (wake socket / NOTIFY), or the slow safety-net poll.
4. A child that died leaves its evaluation failed with the reason, and the
   worker goes on serving.
5. Running evaluations past SESSION_TTL_SECS are asked to stop through their
   row, like every cancel: each evaluation process watches its own row
   (pipeline/cancel.py).
6. SIGTERM: stop claiming, let running evaluations finish for
   SHUTDOWN_GRACE_SECS, then cancel them with "executor shutting down".
7. An evaluation whose process cannot be started is failed at once with the
   cause, never left running under this live worker.
8. While the pool has room it keeps a spare evaluation process (pool.py),
   forked on a tick that started nothing, so a claim does not wait for a
   fork; stopping ends it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import uuid
from datetime import timedelta
from multiprocessing.connection import wait

from django.db import close_old_connections, connection, connections
from django.db.models.functions import Now
from django.utils import timezone

from evaluations import lifecycle
from evaluations.models import (
    LIVE_SANDBOX_STATUSES,
    SHUTTING_DOWN,
    TTL_EXPIRED,
    ErrorKind,
    Evaluation,
    Sandbox,
    SandboxStatus,
    Status,
    WorkerHeartbeat,
)
from evaluations.runtime import initbin
from evaluations.sandboxes import fleet
from evaluations.sandboxes import reaping as sandbox_reaping
from evaluations.sandboxes import spec as sandbox_spec
from evaluations.worker import reaper, wakeup
from evaluations.worker.callbacks import Dispatcher
from evaluations.worker.child import sandbox_main
from evaluations.worker.claim import claim, claim_sandboxes
from evaluations.worker.listener import PostgresListener
from evaluations.worker.pool import Pool, describe_exit

logger = logging.getLogger("term_executor.worker")

POLL_SECS = 2.0  # safety net when no wake-up arrives
WARM_RETRY_SECS = 60  # a warm sandbox of an image failed: the next is tried this long after


class Worker:
    """One worker process's state: its pool of evaluation processes, its callbacks, its wake-ups.

    ``Worker.start`` makes one ready to run (heartbeat written, wake socket bound); ``run`` serves
    until ``request_stop`` (the command wires SIGTERM and SIGINT to it) and the grace period end.
    """

    def __init__(
        self,
        config,
        pool: Pool,
        worker_id: str,
        sandbox: str = "none",
        limits: str = "monitor",
        sandboxes: Pool | None = None,
    ):
        self.config = config
        self.pool = pool
        self.worker_id = worker_id
        self.sandbox = sandbox
        self.limits = limits
        self.stop_requested_at: float | None = None
        self.callbacks = Dispatcher(config)
        self.wake: wakeup.WakeSocket | None = None  # bound by start
        self.listener: PostgresListener | None = None  # PostgreSQL LISTEN connection, opened by the first tick
        # Live sandboxes (SPEC §24): one process each, as evaluations, claimed from this host's own.
        self.sandboxes = sandboxes
        self.node = fleet.node(config)

    @classmethod
    def start(cls, config, runtime) -> Worker:
        """A worker for ``runtime`` (the resolved ``evaluations.runtime.Runtime``), its first beat written."""
        worker = cls(
            config,
            Pool(config.max_concurrent_evals, runtime, spare=True, reuses=config.eval_process_reuses),
            worker_id=f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
            sandbox=runtime.name,
            limits=runtime.cgroups.mode.value if runtime.cgroups else "monitor",
            sandboxes=Pool(config.max_sandboxes, runtime, target=sandbox_main) if config.max_sandboxes else None,
        )
        worker.beat(stopping=False)
        worker.wake = wakeup.WakeSocket(config.data_dir, worker.worker_id)
        if worker.sandboxes is not None and runtime.isolated:
            try:  # the live sandboxes' init, built now rather than by the first sandbox (a C compiler's work)
                initbin.ensure_init(config.workspace_base)
            except (initbin.InitUnavailable, OSError) as exc:
                logger.warning("live sandboxes will fail until this is fixed: %s", exc)
        return worker

    def run(self) -> None:
        """Serve until stopped, then let go of everything: callbacks, wake-ups, the heartbeat row."""
        config = self.config
        logger.info(
            "worker %s started: capacity %d, sandbox %s", self.worker_id, config.max_concurrent_evals, self.sandbox
        )
        try:
            self.loop()
        finally:
            self.pool.end_spare()
            self.callbacks.shutdown()
            self.wake.close()
            if self.listener:
                self.listener.close()
            WorkerHeartbeat.objects.filter(worker_id=self.worker_id).delete()
            logger.info("worker %s stopped", self.worker_id)

    def request_stop(self, signum=None, frame=None) -> None:
        """Stop claiming; running evaluations get SHUTDOWN_GRACE_SECS from the first request."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            if self.wake is not None:
                self.wake.poke()  # the loop acts now, not after its poll's 2 s

    def beat(self, stopping: bool) -> None:
        """Stamped with the database's clock, which every host's reaper also judges by."""
        fields = {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "capacity": self.config.max_concurrent_evals,
            "sandbox": self.sandbox,
            "limits": self.limits,
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
        """One pass: beat, reap, collect, claim, cancel, call back, then sleep until woken."""
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
        if not stopping:  # first: the slot an evaluation just freed is the next one's (SPEC §25)
            claimed = claim(self.worker_id, self.pool.free)
            self.start_claimed(claimed)
        self.collect_sandboxes()
        self.expire_sessions()
        self.callbacks.dispatch()
        if stopping:
            self.pool.end_spare()
            self.stop_sandboxes(warm_only=True)  # nobody's yet: no grace to give
            if now - self.stop_requested_at >= config.shutdown_grace_secs:
                self.cancel_all(SHUTTING_DOWN)
                self.stop_sandboxes()
            if not self.pool.running and not (self.sandboxes and self.sandboxes.running):
                return True
        else:
            if not claimed:
                self.keep_spare()
            if self.sandboxes is not None:
                self.keep_warm()
                if self.sandboxes.free > 0:
                    self.start_sandboxes(claim_sandboxes(self.worker_id, self.node, self.sandboxes.free))
        waitables = [self.wake, *self.pool.sentinels(), *(self.sandboxes.sentinels() if self.sandboxes else ())]
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
            lifecycle.finish(eval_id, Status.FAILED, error=reason, kind=ErrorKind.INFRASTRUCTURE)
            logger.error(reason, extra={"eval_id": eval_id})
            reaper.remove_orphan_folders(self.config.workspace_base)

    def start_claimed(self, claimed: dict) -> None:
        """Start a process for each claimed evaluation ({id: its claim's transition}, which its
        pipeline closes); one that cannot start fails with the cause (it is ours and running:
        nothing else would ever end it while we beat)."""
        for eval_id, mark in claimed.items():
            try:
                self.pool.start(eval_id, note=mark.encode())
            except Exception as exc:
                reason = f"queued: could not start the evaluation process: {exc.__class__.__name__}: {exc}"
                logger.exception(reason, extra={"eval_id": eval_id})
                lifecycle.finish(
                    eval_id, Status.FAILED, error=reason, kind=ErrorKind.INFRASTRUCTURE, expect=[Status.RUNNING]
                )
            else:
                logger.info("claimed", extra={"eval_id": eval_id})

    def keep_spare(self) -> None:
        """The spare evaluation process, forked when this tick started none (not beside a new
        evaluation, whose first steps it would slow): it takes the next claim (pool.py)."""
        try:
            self.pool.keep_spare()
        except Exception:
            logger.exception("could not fork the spare evaluation process; evaluations start without one")

    def start_sandboxes(self, sandbox_ids) -> None:
        """A process for each claimed sandbox; one that cannot start fails at once with the cause."""
        for sandbox_id in sandbox_ids:
            try:
                self.sandboxes.start(sandbox_id)
            except Exception as exc:
                reason = f"could not start the sandbox's process: {exc.__class__.__name__}: {exc}"
                logger.exception(reason)
                lifecycle.end_sandbox(sandbox_id, SandboxStatus.FAILED, error=reason, kind=ErrorKind.INFRASTRUCTURE)

    def keep_warm(self) -> None:
        """SANDBOX_WARM_COUNT sandboxes of each of SANDBOX_WARM_IMAGES made ahead, within MAX_SANDBOXES;
        an image whose warm sandbox failed in the last WARM_RETRY_SECS is not tried again meanwhile."""
        config = self.config
        if not config.sandbox_warm_images or not config.sandbox_warm_count:
            return
        live = Sandbox.objects.filter(node=self.node, status__in=LIVE_SANDBOX_STATUSES)
        room = config.max_sandboxes - live.count()
        recently = timezone.now() - timedelta(seconds=WARM_RETRY_SECS)
        for ref in config.sandbox_warm_images:
            warm = live.filter(pooled=True, pool_key=ref).count()
            failing = Sandbox.objects.filter(  # while warm: the image's fault, not a request's
                node=self.node, pooled=True, pool_key=ref, status=SandboxStatus.FAILED, ended_at__gte=recently
            ).exists()
            for _ in range(min(room, config.sandbox_warm_count - warm) if not failing else 0):
                lifecycle.start_sandbox(
                    spec=sandbox_spec.parse({"environment": {"image": ref}}).as_dict(),
                    network=sandbox_spec.Network().as_dict(),
                    node=self.node,
                    public_url=config.public_url,
                    pooled=True,
                    pool_key=ref,
                )
                room -= 1

    def collect_sandboxes(self) -> None:
        """A sandbox's process that ended without ending its sandbox died: fail it, remove its leftovers."""
        if self.sandboxes is None:
            return
        for sandbox_id, exitcode in self.sandboxes.reap():
            reason = f"the sandbox's process died ({describe_exit(exitcode)})"
            if lifecycle.end_sandbox(sandbox_id, SandboxStatus.FAILED, error=reason, kind=ErrorKind.INFRASTRUCTURE):
                logger.error("sandbox %s: %s", sandbox_id, reason)
            try:
                sandbox_reaping.remove_leftovers(self.config, sandbox_id)
            except OSError as exc:  # a dying process still holding some of it: the next reap's
                logger.warning("sandbox %s: could not remove its leftovers yet (the reaper will): %s", sandbox_id, exc)

    def stop_sandboxes(self, *, warm_only: bool = False) -> None:
        """After the grace period (``warm_only``: at once, the warm ones nobody has taken): each
        sandbox's process ends its sandbox (SIGTERM, its own teardown)."""
        if self.sandboxes is None or not self.sandboxes.running:
            return
        chosen = set(self.sandboxes.running)
        if warm_only:
            warm = Sandbox.objects.filter(id__in=list(chosen), pooled=True).values_list("id", flat=True)
            chosen = {str(sandbox_id) for sandbox_id in warm}
        for sandbox_id in chosen:
            entry = self.sandboxes.running[sandbox_id]
            if entry.process.is_alive():
                os.kill(entry.process.pid, signal.SIGTERM)

    def expire_sessions(self) -> None:
        """Ask evaluations past SESSION_TTL_SECS to stop, unless a stop was already asked for
        (its reason stays): the evaluation process sees its row and ends itself."""
        ttl = self.config.session_ttl_secs
        expired = [eval_id for eval_id, entry in self.pool.running.items() if time.monotonic() - entry.started > ttl]
        if expired:
            Evaluation.objects.filter(id__in=expired, status=Status.RUNNING, cancel_requested=False).update(
                cancel_requested=True, cancel_reason=TTL_EXPIRED
            )

    def cancel_all(self, reason: str) -> None:
        """Ask every evaluation still running here to stop, through its row as every cancel, once the
        grace period is over: each process then kills its commands and ends its evaluation itself."""
        if self.pool.running:
            Evaluation.objects.filter(
                id__in=list(self.pool.running), status=Status.RUNNING, cancel_requested=False
            ).update(cancel_requested=True, cancel_reason=reason)

    def reap(self) -> None:
        """What `manage.py reap_sessions` does, every REAP_INTERVAL_SECS while this worker serves, so a
        lost worker's evaluations are failed by any live one; a log line only when something was done."""
        summary = reaper.reap(self.config)
        if summary.expired or summary.lost or summary.folders_removed or summary.purged or summary.artifacts_removed:
            logger.info(summary.line())
