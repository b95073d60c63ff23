"""POST /evaluate's decision: admit, refuse at capacity, or replay an idempotent request.

Counting pending+running and inserting happen in one transaction that
serialises admissions: SQLite's IMMEDIATE transaction takes the write lock at
BEGIN; on PostgreSQL an advisory transaction lock does the same. Without it,
two gunicorn workers could both see one free slot and both insert.
"""

from __future__ import annotations

from django.db import connection, transaction

from evaluations import wakeup
from evaluations.models import ACTIVE_STATUSES, Evaluation, Status, Step, Transition

ADMISSION_LOCK = 0x7E57E4EC  # any constant shared by every process of the fleet


class AtCapacity(Exception):
    pass


class IdempotencyConflict(Exception):
    pass


def admit(
    *, fields: dict, limit: int, scope: str, key: str | None, request_sha256: str, data_dir
) -> tuple[Evaluation, bool]:
    """Return (evaluation, created). Raise AtCapacity or IdempotencyConflict."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADMISSION_LOCK])
        if key is not None:
            existing = Evaluation.objects.filter(idempotency_scope=scope, idempotency_key=key).first()
            if existing is not None:
                if existing.request_sha256 != request_sha256:
                    raise IdempotencyConflict(key)
                return existing, False
        if Evaluation.objects.filter(status__in=ACTIVE_STATUSES).count() >= limit:
            raise AtCapacity()
        evaluation = Evaluation.objects.create(
            idempotency_scope=scope,
            idempotency_key=key,
            request_sha256=request_sha256,
            status=Status.PENDING,
            step=Step.QUEUED,
            **fields,
        )
        Transition.objects.create(
            evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING, at=evaluation.created_at
        )
        transaction.on_commit(lambda: wakeup.notify(data_dir))
    return evaluation, True
