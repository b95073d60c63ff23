"""Claiming pending evaluations so that no two workers ever run the same one.

1. PostgreSQL: SELECT ... FOR UPDATE SKIP LOCKED inside a transaction, so
   workers on many hosts take different rows without waiting on each other.
2. SQLite: find candidates, then a conditional UPDATE ... WHERE status='pending'
   per row; only a changed row is ours ("another worker got there first").
3. Either way the status change goes through lifecycle.record, which is itself
   conditional and stores the transition.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from evaluations import lifecycle
from evaluations.models import Evaluation, Sandbox, SandboxStatus, Status


def _take(eval_id, worker_id: str) -> bool:
    return lifecycle.record(
        eval_id,
        status=Status.RUNNING,
        expect=[Status.PENDING],
        worker_id=worker_id,
        started_at=timezone.now(),
    )


def claim(worker_id: str, limit: int) -> list:
    """Claim up to `limit` pending evaluations, oldest first; return their ids."""
    if limit <= 0:
        return []
    pending = Evaluation.objects.filter(status=Status.PENDING).order_by("created_at")
    if connection.vendor == "postgresql":
        with transaction.atomic():
            candidates = list(pending.select_for_update(skip_locked=True).values_list("id", flat=True)[:limit])
            return [eval_id for eval_id in candidates if _take(eval_id, worker_id)]
    candidates = list(pending.values_list("id", flat=True)[:limit])
    return [eval_id for eval_id in candidates if _take(eval_id, worker_id)]


def claim_sandboxes(worker_id: str, node: str, limit: int) -> list[str]:
    """Claim up to ``limit`` starting sandboxes made on this host (``node``), oldest first."""
    if limit <= 0:
        return []
    waiting = Sandbox.objects.filter(node=node, status=SandboxStatus.STARTING, worker_id="").order_by("created_at")
    candidates = list(waiting.values_list("id", flat=True)[:limit])
    return [
        str(sandbox_id)
        for sandbox_id in candidates
        if Sandbox.objects.filter(id=sandbox_id, worker_id="").update(worker_id=worker_id)
    ]
