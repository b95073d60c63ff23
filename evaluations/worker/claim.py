"""Claiming pending evaluations so that no two workers ever run the same one.

1. PostgreSQL: SELECT ... FOR UPDATE SKIP LOCKED inside a transaction, so
   workers on many hosts take different rows without waiting on each other.
2. SQLite: find candidates, then a conditional UPDATE ... WHERE status='pending'
   per row; only a changed row is ours ("another worker got there first").
3. Either way the status change goes through lifecycle.claim, which is itself
   conditional and stores the transition; its mark goes to the evaluation's process
   (worker/pool.py), whose pipeline closes it with its first step.
"""

from __future__ import annotations

from django.db import connection, transaction

from evaluations import lifecycle
from evaluations.models import Evaluation, Sandbox, SandboxStatus, Status


def claim(worker_id: str, limit: int) -> dict:
    """Claim up to `limit` pending evaluations, oldest first; return {id: its claim's transition}."""
    if limit <= 0:
        return {}
    pending = Evaluation.objects.filter(status=Status.PENDING).order_by("created_at")
    if connection.vendor == "postgresql":
        with transaction.atomic():
            candidates = list(pending.select_for_update(skip_locked=True).values_list("id", flat=True)[:limit])
            return _take(candidates, worker_id)
    return _take(list(pending.values_list("id", flat=True)[:limit]), worker_id)


def _take(candidates: list, worker_id: str) -> dict:
    taken = {eval_id: lifecycle.claim(eval_id, worker_id) for eval_id in candidates}
    return {eval_id: mark for eval_id, mark in taken.items() if mark is not None}


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
