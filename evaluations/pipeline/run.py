"""Run one evaluation: prepare, the steps in order, then cleanup and the final state.

1. ``_prepare`` leases a uid, makes the session folder and the spawner. If
   any of it fails, what was made is undone and the evaluation fails with
   that cause (not as a process that died).
2. Each step is recorded as it starts (ctx.progress, lifecycle.Progress: the
   change is conditional; if the evaluation was ended elsewhere, by the
   reaper, we stop). What a step produced is staged on the context
   (``ctx.stage``) and written with the next transition or the final state,
   in its transaction (SPEC §25). A step raises StepFailed, Cancelled or
   WorkerLost; anything else is an internal error. The error sentence always
   names the step.
3. ``_cleanup``: whatever happened, every process of the evaluation is killed
   and the session folder removed before the final state is written, so
   nothing of an evaluation outlives it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from django.db import close_old_connections

from evaluations import lifecycle, livelog
from evaluations.db.text import Utf8Text
from evaluations.environments import kinds
from evaluations.grading import registry
from evaluations.models import ErrorKind, Evaluation, Status, Step, TestResult
from evaluations.network.egress import EgressProxy, egress_policy
from evaluations.pipeline import outcome
from evaluations.pipeline.cancel import CancelState
from evaluations.pipeline.context import Cancelled, Context, StepFailed, WorkerLost
from evaluations.pipeline.session import Session, remove_retired
from evaluations.pipeline.steps import in_order
from evaluations.pipeline.warm import WorkspaceCache
from evaluations.runtime import Limits, Runtime, Spawner, sandbox_uid, uids
from evaluations.runtime.idmap import image_id_range
from evaluations.runtime.netns import NetworkUnavailable, SharedNetwork
from evaluations.runtime.output import utf8_text
from executor_project.config import Config
from executor_project.logs import evaluation_context

logger = logging.getLogger("term_executor.pipeline")
EGRESS_SOCKET = "egress.sock"  # in the session folder: root's, passable only by the evaluation's uid


def run_pipeline(
    eval_id: str,
    config: Config,
    *,
    runtime: Runtime,
    cancel: CancelState,
    claimed: lifecycle.Mark | None = None,
    remove_later: Callable[[Path], None] | None = None,
) -> None:
    """``runtime``: what the worker resolved at start; ``cancel``: set by the evaluation's watchers;
    ``claimed``: the claim's transition, as the worker hands it over (lifecycle.Progress);
    ``remove_later``: takes the retired session folder (``Session.retire``: closed to every uid but
    ours) once the evaluation is written, for its caller to remove (``remove_retired``) off the path to
    the next claim (child.tidy); without it the folder is removed here, before returning."""
    # Every log line written meanwhile, by any logger or thread of this process, carries the eval_id.
    with evaluation_context(eval_id):
        log = logging.LoggerAdapter(logger, {"eval_id": eval_id})
        try:
            ctx, lease = _prepare(eval_id, config, runtime, cancel, claimed)
        except Exception as exc:
            log.exception("could not prepare the evaluation")
            error = f"queued: {_prepare_failure(exc)}"  # a uid pool exhausted, a host disk full...
            lifecycle.finish(eval_id, Status.FAILED, error=error, kind=ErrorKind.INFRASTRUCTURE)
            return
        ending = _steps(ctx, log)
        retired = _cleanup(ctx, lease, ending, log)
        if retired is None:
            return
        if remove_later is not None:
            remove_later(retired)
            return
        try:
            remove_retired(retired)
        except OSError as exc:
            log.warning("could not remove %s (the reaper will): %s", retired, exc)


def _prepare(
    eval_id: str, config: Config, runtime: Runtime, cancel: CancelState, claimed: lifecycle.Mark | None
) -> tuple[Context, uids.UidLease | None]:
    evaluation = Evaluation.objects.get(id=eval_id)
    lease = lease_uid(config)  # a uid no other evaluation has (runtime/uids.py)
    session = egress = loopback = None
    try:
        uid = lease.uid if lease else None
        session = Session.create(config.workspace_base, eval_id, uid)
        spawner = Spawner(
            eval_id=eval_id,
            session_dir=session.root,
            runtime=runtime,
            uid=uid,
            live_log=session.log,
            cancel_event=cancel,
            exclusive_uid=lease is not None,
        )
        if runtime.isolated:  # a sandbox's only way out (without one, commands have the host's network)
            # An image's other users (a verifier run as its root, the agent as [agent] user) are ids of the
            # lease's range (runtime/idmap.py), which reach the proxy too.
            ids = image_id_range(config.image_uid_base, uid, config.sandbox_uid) if uid is not None else None
            proxy = EgressProxy(session.root / EGRESS_SOCKET, egress_policy(config), allowed_uid=uid, id_range=ids)
            egress = proxy.start()
            loopback = _loopback()
    except BaseException:
        if loopback is not None:
            loopback.close()
        if session is not None:
            session.remove()
        if lease is not None:
            lease.release()  # not marked clean: the next holder scrubs it
        raise
    spawner.make_cgroup_ahead(Limits.of(config, config.agent_timeout_secs))  # made while the task downloads
    progress = lifecycle.Progress(eval_id, claimed)
    ctx = Context(
        eval_id=eval_id,
        config=config,
        evaluation=evaluation,
        session=session,
        runtime=runtime,
        spawner=spawner,
        cancel=cancel,
        cache=WorkspaceCache(eval_id, config, session, progress.stage),
        env=kinds.Host(session, spawner),  # preparing_environment puts the task's own in its place
        progress=progress,
        egress=egress,
        loopback=loopback,
    )
    if loopback is not None:
        ctx.closing.callback(loopback.close)  # once every sandbox of the evaluation has ended (_cleanup)
    return ctx, lease


def _loopback() -> SharedNetwork | None:
    """The evaluation's own network namespace (Context.loopback), as root; None where it cannot be
    made: each sandbox then makes its own, as bubblewrap does by default."""
    if os.geteuid() != 0:
        return None
    try:
        return SharedNetwork.create()
    except NetworkUnavailable as exc:
        logger.warning("each sandbox makes a network namespace of its own: %s", exc)
        return None


def _prepare_failure(exc: Exception) -> str:
    if isinstance(exc, uids.UidPoolExhausted):
        return str(exc)
    return f"could not prepare the session: {exc.__class__.__name__}: {exc}"


class Ending(NamedTuple):
    status: str
    error: str
    kind: str | None  # SPEC §14 error_kind (pipeline/outcome.py)
    fields: dict | None = None  # written with the final state: the grade's reward and rewards (SPEC §17)


def _steps(ctx: Context, log) -> Ending:
    """Run the steps; return how the evaluation ends."""
    try:
        for name, step in in_order(ctx):
            ctx.step = name
            if ctx.egress is not None:
                ctx.egress.set_step(name)  # each connection is recorded under the step that made it
            if not ctx.progress.record(name):
                log.info("ended elsewhere before %s; stopping", name)
                # The conditional finish writes nothing.
                return Ending(Status.CANCELLED, f"{name}: ended elsewhere", ErrorKind.CANCELLED)
            livelog.append_step_marker(ctx.session.log, name)
            ctx.check_cancelled()
            step(ctx)
        return _verdict(ctx)
    except (StepFailed, WorkerLost) as exc:
        return Ending(Status.FAILED, f"{ctx.step}: {exc}", outcome.of_exception(ctx.step, exc))
    except Cancelled as exc:
        return Ending(Status.CANCELLED, f"{ctx.step}: {exc}", outcome.of_exception(ctx.step, exc))
    except Exception as exc:
        log.exception("internal error in %s", ctx.step)
        error = f"{ctx.step}: internal error: {exc.__class__.__name__}: {exc}"
        return Ending(Status.FAILED, error, outcome.of_exception(ctx.step, exc))


def _cleanup(ctx: Context, lease: uids.UidLease | None, ending: Ending, log) -> Path | None:
    """The evaluation's end: its sandboxes gone, its row finished; returns the retired session folder
    (``Session.retire``), if any, for the caller to remove."""
    eval_id, session, spawner, config = ctx.eval_id, ctx.session, ctx.spawner, ctx.config
    status, error = ending.status, ending.error
    spawner.end_prestart()  # a sandbox started for a phase that never came (its step failed before)
    spawner.end_phase()  # and those of ended phases still to be seen gone (``phase(retire=True)``)
    spawner.sweep()
    try:
        ctx.closing.close()  # the image's root unmounted, its pin let go (pipeline/imageenv.py)
    except OSError as exc:
        log.warning("could not unmount the image's root (the session's removal will): %s", exc)
    try:
        ctx.cache.release()  # the session's overlays unmounted, the cache's locks dropped
    except OSError as exc:
        log.warning("could not release the workspace cache (the reaper will): %s", exc)
    close_old_connections()
    ctx.progress.record(Step.CLEANUP)  # with what the last step staged
    livelog.append_text(session.log, livelog.end_block(status, error))
    kept_log = _keep_log(session, config)
    ctx.stage(log=kept_log)
    _keep_usage(ctx, log)
    retired = None
    try:
        if not config.keep_workspaces:
            retired = session.retire()
        elif session.uid is not None:
            os.chown(session.root, -1, 0)  # kept for debugging: closed to the uid's next holder
    finally:
        if lease is not None:
            clean = False
            try:
                spawner.scrub()  # its files in the host's /tmp, /dev/shm..., its SysV IPC
                clean = True
            finally:
                lease.release(clean=clean)  # clean: the next evaluation need not scrub it
    if not ctx.progress.finish(status, error=error, kind=ending.kind, **(ending.fields or {})) and kept_log:
        # Ended elsewhere (the reaper found its worker lost): the row's shown columns are the ender's,
        # signed; the live log is not among them, and GET /logs serves it from here on.
        Evaluation.objects.filter(id=eval_id).update(log=Utf8Text(kept_log))
    log.info("finished %s%s", status, f": {error}" if error else "")
    return retired


def _keep_usage(ctx: Context, log) -> None:
    """Stage what the evaluation reached and used (``egress``, ``resources``); end its proxy and cgroup."""
    fields = {}
    if ctx.egress is not None:
        ctx.egress.close()
        fields["egress"] = [record.as_dict() for record in ctx.egress.records()]
    try:
        fields["resources"] = ctx.spawner.resources()
    except OSError as exc:
        log.warning("could not read the evaluation's resources: %s", exc)
    try:
        ctx.spawner.close()
    except OSError as exc:
        log.warning("could not remove the evaluation's cgroup (the reaper will): %s", exc)
    ctx.stage(**fields)


def lease_uid(config: Config) -> uids.UidLease | None:
    """As root, a uid of the pool, scrubbed and held until the evaluation ends; else None."""
    if sandbox_uid(config.sandbox_uid) is None:
        return None  # not root: commands run as the service's own uid
    return uids.acquire(config.sandbox_uid, config.sandbox_uid_count, uids.lock_dir(config.data_dir))


def _keep_log(session: Session, config: Config) -> bytes:
    """The live log to store before its folder goes, so /logs offsets carry on after the end (any
    host); b"" when there is none. As its UTF-8 (``output.utf8_text``), which lifecycle writes as
    text (db/text.py): a log with one executor's mark is no str of 2-4 bytes a character, encoded
    again for its UPDATE (issue 38).

    Over its cap, the head and the tail are kept around a marker, as for each command's
    output: the end of a log (the tests, the final status) matters as much as its start.
    """
    cap = 4 * config.max_output_bytes
    try:
        with open(session.log, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(cap if size <= cap else cap // 2)
            tail = b""
            if size > cap:
                handle.seek(size - (cap - len(head)))
                tail = handle.read()
    except OSError:
        return b""
    kept = utf8_text(head)
    if tail:
        marker = livelog.truncation_line(size - len(head) - len(tail)).encode()
        kept = b"".join([kept, b"" if kept.endswith(b"\n") else b"\n", marker, utf8_text(tail)])
    return kept


def _verdict(ctx: Context) -> Ending:
    """How the evaluation ends, as the task's grader says from its grade and the rows stored (SPEC §17)."""
    if ctx.steps is not None:  # SPEC §23: the task's reward made of its steps' (pipeline/multistep.py)
        return Ending(*ctx.steps.verdict())
    results = list(TestResult.objects.filter(evaluation_id=ctx.eval_id).values_list("name", "passed"))
    return Ending(*registry.for_task(ctx.task).verdict(ctx.grade, results))
