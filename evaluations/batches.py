"""Batches (SPEC §14): their object, their end, their cancel. The API, callbacks, admin and CLI use these.

A batch row's ``status`` is written twice: ``pending`` at creation and, once, its final
``completed`` or ``cancelled`` with ``finished_at`` (settle). ``running`` is read from its
evaluations (one has left the queue), not written: the worker's claim stays the one
statement it is. DELETE marks ``cancel_requested`` at once, so the batch shows ``cancelled``
while its running evaluations stop; it counts as open (MAX_OPEN_BATCHES) until they have.
"""

from __future__ import annotations

from django.db.models import Case, Count, Exists, OuterRef, Q, Value, When
from django.utils import timezone

from evaluations import lifecycle
from evaluations.models import ACTIVE_STATUSES, Batch, Evaluation, Status
from evaluations.representation import iso


def settle(batch_id) -> bool:
    """End the batch if none of its evaluations is still pending or running; True if this call ended it.

    Called after each of its evaluations ends (lifecycle.finish), after that change committed.
    One conditional UPDATE: two workers ending the last two evaluations at once both may
    find nothing active, and only the one whose UPDATE still sees finished_at NULL ends it
    (PostgreSQL re-checks the row's WHERE after the other's commit; SQLite writes one at a
    time), so the batch's callback is queued once.
    """
    now = timezone.now()
    ended = (
        Batch.objects.filter(id=batch_id, finished_at__isnull=True)
        .filter(~Exists(_active_evaluations()))
        .update(
            finished_at=now,
            status=Case(When(cancel_requested=True, then=Value(Status.CANCELLED)), default=Value(Status.COMPLETED)),
            # The worker's callback dispatcher delivers it (evaluations/callbacks.py).
            callback_state=Case(When(callback_url="", then=Value("")), default=Value("pending")),
            callback_next_at=Case(When(callback_url="", then=None), default=Value(now)),
        )
    )
    return ended == 1


def settle_stranded() -> int:
    """End the open batches none of whose evaluations is active; returns how many (the reaper's pass).

    A worker killed between an evaluation's commit and its batch's settle leaves such a batch:
    open for ever, holding one of MAX_OPEN_BATCHES, its callback never sent.
    """
    stranded = Batch.objects.filter(finished_at__isnull=True).filter(~Exists(_active_evaluations()))
    return sum(settle(batch_id) for batch_id in stranded.values_list("id", flat=True))


def _active_evaluations():
    """The batch's (OuterRef) evaluations still pending or running."""
    return Evaluation.objects.filter(batch_id=OuterRef("pk"), status__in=list(ACTIVE_STATUSES))


def cancel(batch_id, reason: str) -> list[str] | None:
    """DELETE /batches/{id}: cancel what has not finished; None if the batch had already ended.

    Each evaluation goes the way DELETE /evaluate/{id} takes it (lifecycle.cancel): a pending one
    ends now, a running one is asked to stop. Returns the statuses those calls left.
    """
    if not Batch.objects.filter(id=batch_id, finished_at__isnull=True).update(cancel_requested=True):
        return None
    outcomes = []
    pending = Evaluation.objects.filter(batch_id=batch_id, status__in=list(ACTIVE_STATUSES)).order_by("created_at")
    for eval_id in pending.values_list("id", flat=True):
        outcome = lifecycle.cancel(eval_id, reason)
        if outcome is not None:
            outcomes.append(outcome)
    settle(batch_id)  # nothing was left to cancel: the batch ends here
    return outcomes


def _status(batch: Batch, *, ended: bool, started: bool) -> str:
    """completed as soon as every evaluation ended: settle's finished_at follows a moment later."""
    if batch.cancel_requested:
        return Status.CANCELLED
    if batch.finished_at is not None:
        return batch.status
    if ended:
        return Status.COMPLETED
    return Status.RUNNING if started else Status.PENDING


STATUSES = (Status.PENDING, Status.RUNNING, Status.COMPLETED, Status.CANCELLED)


def with_status(queryset, status: str):
    """GET /batches?status=: the batches status_of would show as ``status``."""
    if status == Status.CANCELLED:
        return queryset.filter(cancel_requested=True)
    queryset = queryset.filter(cancel_requested=False)
    if status == Status.COMPLETED:
        return queryset.filter(finished_at__isnull=False)
    started = Evaluation.objects.filter(batch_id=OuterRef("pk")).exclude(status=Status.PENDING)
    queryset = queryset.filter(finished_at__isnull=True)
    return queryset.filter(Exists(started)) if status == Status.RUNNING else queryset.filter(~Exists(started))


def summaries(queryset):
    """Batches with their counts, for GET /batches' rows (summary_json): one query, no evaluation rows."""
    active = Q(evaluations__status__in=list(ACTIVE_STATUSES))
    return queryset.annotate(
        total=Count("evaluations"),
        finished=Count("evaluations", filter=~active),
        started=Count("evaluations", filter=~Q(evaluations__status=Status.PENDING)),
        passed_count=Count("evaluations", filter=Q(evaluations__passed=True)),
        failed=Count("evaluations", filter=Q(evaluations__status=Status.FAILED)),
        cancelled=Count("evaluations", filter=Q(evaluations__status=Status.CANCELLED)),
    ).defer("agent_code", "env", "metadata")


def summary_json(batch) -> dict:
    """One row of GET /batches: the batch object without its evaluations (counts from summaries)."""
    return _object(
        batch,
        total=batch.total,
        finished=batch.finished,
        started=batch.started,
        passed=batch.passed_count,
        failed=batch.failed,
        cancelled=batch.cancelled,
    )


def _object(batch: Batch, *, total: int, finished: int, started: int, passed: int, failed: int, cancelled: int):
    """The batch object from its evaluations' counts: GET /batches' rows and GET /batches/{id} alike."""
    return {
        "batch_id": str(batch.id),
        "owner": batch.owner,
        "status": _status(batch, ended=bool(total) and finished == total, started=bool(started)),
        "total": total,
        "finished": finished,
        "passed": passed,
        "failed": failed,
        "cancelled": cancelled,
        "reward": passed / total if total and finished == total else None,
        "created_at": iso(batch.created_at),
        "finished_at": iso(batch.finished_at),
    }


_ROW = ("id", "task_url", "status", "passed", "error_kind", "created_at")


def batch_json(batch_id, among=Batch.objects) -> dict | None:
    """GET /batches/{id}'s body and the batch callback's; None for no such batch in ``among``
    (the API's: the batches the caller may see). A batch's evaluations are its owner's."""
    batch = among.filter(id=batch_id).first()
    if batch is None:
        return None
    evaluations = list(Evaluation.objects.filter(batch_id=batch.id).order_by("created_at", "id").only(*_ROW))
    return document(batch, evaluations)


def document(batch: Batch, evaluations) -> dict:
    body = _object(
        batch,
        total=len(evaluations),
        finished=sum(1 for e in evaluations if e.status not in ACTIVE_STATUSES),
        started=sum(1 for e in evaluations if e.status != Status.PENDING),
        passed=sum(1 for e in evaluations if e.passed),
        failed=sum(1 for e in evaluations if e.status == Status.FAILED),
        cancelled=sum(1 for e in evaluations if e.status == Status.CANCELLED),
    )
    body["evaluations"] = [
        {
            "eval_id": str(e.id),
            "task_url": e.task_url,
            "status": e.status,
            "passed": e.passed,
            "error_kind": e.error_kind,
        }
        for e in evaluations
    ]
    return body
