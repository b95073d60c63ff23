"""The one place that moves an evaluation between steps and statuses.

Every change writes the Evaluation row and a Transition row in one short
transaction, and is conditional on the status the caller expects, so a
pipeline that lost a race with DELETE (or with the reaper) finds out instead
of overwriting a terminal state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from evaluations.models import (
    ACTIVE_STATUSES,
    CANCEL_KINDS,
    ErrorKind,
    Evaluation,
    Status,
    Step,
    TestResult,
    Transition,
)


def _elapsed_ms(start, end) -> int:
    return max(0, int((end - start).total_seconds() * 1000))


def record(
    eval_id,
    *,
    step: str | None = None,
    status: str | None = None,
    expect: Iterable[str] = ACTIVE_STATUSES,
    **fields,
) -> bool:
    """Apply a step/status change and store its transition; False if the row was not in `expect`.

    1. The UPDATE is conditional on the status: a caller that lost a race changes nothing.
    2. The transition stores the step and status the row holds after the UPDATE (a caller
       may change only one of them), and closes the previous transition's duration.
    """
    now = timezone.now()
    updates = dict(fields)
    if step is not None:
        updates["step"] = step
    if status is not None:
        updates["status"] = status
    with transaction.atomic():
        if Evaluation.objects.filter(id=eval_id, status__in=list(expect)).update(**updates) != 1:
            return False
        current_step, current_status = Evaluation.objects.filter(id=eval_id).values_list("step", "status").get()
        transitions = Transition.objects.filter(evaluation_id=eval_id).order_by("-at", "-id")
        previous = transitions.values("id", "at", "duration_ms").first()
        if previous is not None and previous["duration_ms"] is None:
            Transition.objects.filter(id=previous["id"]).update(duration_ms=_elapsed_ms(previous["at"], now))
        Transition.objects.create(evaluation_id=eval_id, step=current_step, status=current_status, at=now)
    return True


def results_sha256(eval_id, passed: bool | None, results: Iterable[dict]) -> str:
    """SHA-256 of a canonical JSON, so a platform can compare two executors' runs."""
    canonical = {
        "eval_id": str(eval_id),
        "passed": passed,
        "test_results": [{"name": r["name"], "passed": r["passed"], "exit_code": r["exit_code"]} for r in results],
    }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def finish(
    eval_id,
    status: str,
    *,
    error: str = "",
    kind: str | None = None,
    expect: Iterable[str] = ACTIVE_STATUSES,
    **fields,
) -> bool:
    """End an evaluation: step `done`, final status, `passed`, `error_kind`, times and the results hash;
    and its batch with its last evaluation (batches.settle; the reaper's batches.settle_stranded if this
    process dies in between).

    ``kind`` (SPEC §14 error_kind): none for `completed`; when a caller gives none, `cancelled`
    for a cancel and `infrastructure` for a failure nobody classified (the executor's, as an
    internal error is). Every end goes through here, so no ended evaluation lacks one.
    """
    if status == Status.COMPLETED:
        kind = None
    elif kind is None:
        kind = ErrorKind.CANCELLED if status == Status.CANCELLED else ErrorKind.INFRASTRUCTURE
    elif kind not in ErrorKind.values:
        raise ValueError(f"unknown error_kind {kind!r}")
    now = timezone.now()
    row = Evaluation.objects.filter(id=eval_id).values("created_at", "started_at", "callback_url", "batch_id").first()
    if row is None:
        return False
    if row["callback_url"]:
        # The worker's callback dispatcher delivers it; nothing here waits on the receiver.
        fields.update(callback_state="pending", callback_next_at=now)
    results = list(TestResult.objects.filter(evaluation_id=eval_id).values("name", "passed", "exit_code"))
    passed = status == Status.COMPLETED
    ended = record(
        eval_id,
        step=Step.DONE,
        status=status,
        expect=expect,
        passed=passed,
        error=error,
        error_kind=kind,
        finished_at=now,
        duration_ms=_elapsed_ms(row["started_at"] or row["created_at"], now),
        results_sha256=results_sha256(eval_id, passed, results),
        **fields,
    )
    if ended and row["batch_id"] is not None:
        # After record's commit: a batch ends when its last evaluation does, and settle's
        # check must see the other evaluations' own commits (batches.settle says why once).
        from evaluations import batches  # batches cancels through this module

        transaction.on_commit(lambda: batches.settle(row["batch_id"]))
    return ended


def cancel(eval_id, reason: str) -> str | None:
    """DELETE: cancel a pending evaluation at once, ask a running one to stop.

    Returns the status after the call, or None if the evaluation had already ended.
    """
    if finish(
        eval_id,
        Status.CANCELLED,
        error=f"queued: {reason}",
        kind=CANCEL_KINDS.get(reason, ErrorKind.CANCELLED),
        expect=[Status.PENDING],
        cancel_reason=reason,
    ):
        return Status.CANCELLED
    asked = Evaluation.objects.filter(id=eval_id, status=Status.RUNNING).update(
        cancel_requested=True, cancel_reason=reason
    )
    return Status.RUNNING if asked else None
