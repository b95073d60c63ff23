"""Run one evaluation: the steps in order, then cleanup and the final state.

1. Each step is recorded as it starts (lifecycle.record is conditional: if
   the evaluation was ended elsewhere, by DELETE or the reaper, we stop).
2. A step raises StepFailed, Cancelled or WorkerLost; anything else is an
   internal error. The error sentence always names the step.
3. Whatever happened, every process of the evaluation is killed and the
   session folder removed before the final state is written, so nothing of
   an evaluation outlives it.
"""

from __future__ import annotations

import logging
import os

from django.db import close_old_connections

from evaluations import lifecycle, livelog
from evaluations.models import Evaluation, Status, Step, TestResult
from evaluations.pipeline.context import WORKER_LOST, Cancelled, Context, StepFailed, WorkerLost
from evaluations.pipeline.session import Session, remove_retired
from evaluations.pipeline.steps import STEPS
from evaluations.runtime import Bubblewrap, NoSandbox, Spawner, command_path, sandbox_uid, uids
from executor_project.logs import evaluation_context

logger = logging.getLogger("term_executor.pipeline")


def run_pipeline(eval_id: str, config, *, sandbox: str, cancel_event, lost_flag=None) -> None:
    # Every log line written meanwhile, by any logger or thread of this process, carries the eval_id.
    with evaluation_context(eval_id):
        _run(eval_id, config, sandbox=sandbox, cancel_event=cancel_event, lost_flag=lost_flag)


def _run(eval_id: str, config, *, sandbox: str, cancel_event, lost_flag) -> None:
    log = logging.LoggerAdapter(logger, {"eval_id": eval_id})
    evaluation = Evaluation.objects.get(id=eval_id)
    try:
        lease = _lease_uid(config)  # a uid no other evaluation has (runtime/uids.py)
    except uids.UidPoolExhausted as exc:
        lifecycle.finish(eval_id, Status.FAILED, error=f"queued: {exc}")
        return
    uid = lease.uid if lease else None
    session = Session.create(config.workspace_base, eval_id, uid)
    # The worker probed bubblewrap once at start; `sandbox` is what it chose.
    runtime = Bubblewrap(uid) if sandbox == "bwrap" else NoSandbox(uid)
    spawner = Spawner(
        eval_id=eval_id,
        session_dir=session.root,
        runtime=runtime,
        uid=uid,
        live_log=session.log,
        cancel_event=cancel_event,
        exclusive_uid=lease is not None,
    )

    def cancel_reason() -> str:
        if lost_flag is not None and lost_flag.is_set():
            return WORKER_LOST
        reason = Evaluation.objects.filter(id=eval_id).values_list("cancel_reason", flat=True).first()
        return reason or "cancelled"

    ctx = Context(
        eval_id=eval_id,
        config=config,
        evaluation=evaluation,
        session=session,
        spawner=spawner,
        command_path=command_path(runtime),
        cancel_reason=cancel_reason,
    )
    status, error = Status.FAILED, ""
    try:
        for name, step in STEPS:
            ctx.step = name
            if not lifecycle.record(eval_id, step=name):
                log.info("ended elsewhere before %s; stopping", name)
                return
            livelog.append_step_marker(session.log, name)
            ctx.check_cancelled()
            step(ctx)
        status, error = _verdict(eval_id)
    except StepFailed as exc:
        status, error = Status.FAILED, f"{ctx.step}: {exc}"
    except Cancelled as exc:
        status, error = Status.CANCELLED, f"{ctx.step}: {exc}"
    except WorkerLost as exc:
        status, error = Status.FAILED, f"{ctx.step}: {exc}"
    except Exception as exc:
        log.exception("internal error in %s", ctx.step)
        status, error = Status.FAILED, f"{ctx.step}: internal error: {exc.__class__.__name__}: {exc}"
    finally:
        spawner.sweep()
        close_old_connections()
        lifecycle.record(eval_id, step=Step.CLEANUP)
        _keep_log(eval_id, session, config)
        retired = None
        try:
            if not config.keep_workspaces:
                retired = session.retire()
            elif uid is not None:
                os.chown(session.root, -1, 0)  # kept for debugging: closed to the uid's next holder
        finally:
            if lease is not None:
                clean = False
                try:
                    spawner.scrub()  # its files in the host's /tmp, /dev/shm..., its SysV IPC
                    clean = True
                finally:
                    lease.release(clean=clean)  # clean: the next evaluation need not scrub it
        lifecycle.finish(eval_id, status, error=error)
        log.info("finished %s%s", status, f": {error}" if error else "")
        if retired is not None:
            try:
                remove_retired(retired)
            except OSError as exc:
                log.warning("could not remove %s (the reaper will): %s", retired, exc)


def _lease_uid(config) -> uids.UidLease | None:
    """As root, a uid of the pool, scrubbed and held until the evaluation ends; else None."""
    if sandbox_uid(config.sandbox_uid) is None:
        return None  # not root: commands run as the service's own uid
    return uids.acquire(config.sandbox_uid, config.sandbox_uid_count, uids.lock_dir(config.data_dir))


def _keep_log(eval_id: str, session: Session, config) -> None:
    """Store the live log before its folder goes, so /logs offsets carry on after the end (any host)."""
    cap = 4 * config.max_output_bytes
    try:
        with open(session.log, "rb") as handle:
            data = handle.read(cap + 1)
    except OSError:
        return
    text = data[:cap].decode("utf-8", errors="replace")
    if len(data) > cap:
        text += f"\n[... log truncated at {cap} bytes ...]\n"
    Evaluation.objects.filter(id=eval_id).update(log=text)


def _verdict(eval_id: str) -> tuple[str, str]:
    """completed only if there is at least one test and every one passed."""
    results = list(TestResult.objects.filter(evaluation_id=eval_id).values_list("name", "passed"))
    failed = [name for name, passed in results if not passed]
    if not results:
        return Status.FAILED, "running_tests: task defines no tests"
    if failed:
        shown = ", ".join(failed[:5]) + (", ..." if len(failed) > 5 else "")
        return Status.FAILED, f"running_tests: {len(failed)} of {len(results)} tests failed ({shown})"
    return Status.COMPLETED, ""
