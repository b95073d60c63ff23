"""POST /evaluate's decision: admit, refuse at capacity, or replay an idempotent request.

Counting pending+running and inserting happen in one transaction that
serialises admissions: SQLite's IMMEDIATE transaction takes the write lock at
BEGIN; on PostgreSQL an advisory transaction lock does the same. Without it,
two gunicorn workers could both see one free slot and both insert.

Admissions queue on that lock, so the time it is held bounds how many can be
admitted a second. Everything that does not need it happens before BEGIN: the
rows are built and every value converted for the database, with SQL written
once per process (db/admission.py). Under the lock run at most three statements:
the idempotency lookup (only with a key), the evaluation's INSERT, which carries
the capacity check in its WHERE (counting and inserting are one statement), and
the first transition's INSERT; the two INSERTs are lifecycle's, the one writer of
statuses and transitions (``lifecycle.queue_if_room``). Through the ORM the same
work ran much more Python, most of it under the lock (bench/RESULTS.md has the figures).

Refusals need no lock. Once a process has met a full executor, its next
requests first read, in one statement and without the lock, the idempotency
key and whether there is room: a replay, a conflict or a refusal is answered
from that snapshot (each was true at that instant; only admitting needs the
lock, to count and insert as one). Only when the read finds room does the
request queue for the lock, which decides again. A flood of retries at a full
executor then neither queues on the write lock nor delays the running
evaluations' own writes.
"""

from __future__ import annotations

import uuid

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from evaluations import lifecycle
from evaluations.db.admission import Statements, statements
from evaluations.models import Batch, Evaluation
from evaluations.worker import wakeup

ADMISSION_LOCK = 0x7E57E4EC  # any constant shared by every process of the fleet


class AtCapacity(Exception):
    pass


class IdempotencyConflict(Exception):
    pass


_met_full = False  # this process's last admission found the executor full: peek before queueing


def _peek(db, sql: Statements, *, limit: int, scope: str, key: str | None, request_sha256: str):
    """Without the lock: the key's evaluation id (a replay), or raise, or None when there may be room."""
    with db.cursor() as cursor:
        if key is None:
            cursor.execute(sql.peek, [limit] * sql.room_params)
        else:
            cursor.execute(sql.peek_key, [*[limit] * sql.room_params, scope, key])
        found_id, found_sha, has_room = cursor.fetchone()
    if found_id is not None:
        if found_sha != request_sha256:
            raise IdempotencyConflict(key)
        return Evaluation._meta.pk.to_python(found_id)
    if not has_room:
        raise AtCapacity()
    return None


def admit_id(
    *, fields: dict, limit: int, scope: str, key: str | None, request_sha256: str, data_dir
) -> tuple[uuid.UUID, bool]:
    """Return (the evaluation's id, created). Raise AtCapacity or IdempotencyConflict."""
    global _met_full
    # The connection itself, not django.db.connection: every attribute read through that proxy
    # looks the connection up again, and preparing a row's values reads dozens.
    db = connections[DEFAULT_DB_ALIAS]
    sql = statements(db.vendor)
    if _met_full:
        existing = _peek(db, sql, limit=limit, scope=scope, key=key, request_sha256=request_sha256)
        if existing is not None:
            return existing, False
    try:
        return _admit_locked(db, sql, fields=fields, limit=limit, scope=scope, key=key,
                             request_sha256=request_sha256, data_dir=data_dir)  # fmt: skip
    except AtCapacity:
        _met_full = True
        raise


def admit(**request) -> tuple[Evaluation, bool]:
    """As admit_id, with the evaluation loaded (the admin links to it); POST /evaluate needs only the id."""
    eval_id, created = admit_id(**request)
    return Evaluation.objects.get(pk=eval_id), created


def _admit_locked(
    db, sql: Statements, *, fields: dict, limit: int, scope: str, key: str | None, request_sha256: str, data_dir
) -> tuple[uuid.UUID, bool]:
    global _met_full
    given = {
        "id": uuid.uuid4(),
        "created_at": timezone.now(),
        "idempotency_scope": scope,
        "idempotency_key": key,
        "request_sha256": request_sha256,
        **fields,
    }
    queued = lifecycle.prepare_queued(db, given)
    with transaction.atomic(using=db.alias), db.cursor() as cursor:
        if db.vendor == "postgresql":
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADMISSION_LOCK])
        if key is not None:
            cursor.execute(sql.find_key, [scope, key])
            found = cursor.fetchone()
            if found is not None:
                if found[1] != request_sha256:
                    raise IdempotencyConflict(key)
                return Evaluation._meta.pk.to_python(found[0]), False
        if not lifecycle.queue_if_room(cursor, queued, limit=limit):
            raise AtCapacity()
        transaction.on_commit(lambda: wakeup.notify(data_dir), using=db.alias)
    _met_full = False
    return given["id"], True


BATCH_LOCK = 0x7E57BA7C  # batches count open batches, not evaluations: a lock of their own


def admit_batch(
    *,
    fields: dict,
    task_urls: list[str],
    attempts: int = 1,
    max_open: int,
    scope: str,
    key: str | None,
    request_sha256: str,
    data_dir,
) -> tuple[uuid.UUID, list[uuid.UUID], bool]:
    """Return (the batch's id, its evaluations' ids in queue order, created).

    Raise AtCapacity when MAX_OPEN_BATCHES batches are unfinished, IdempotencyConflict as admit_id.
    The batch, its evaluations and their first transitions are one transaction: all or nothing.
    Through the ORM: a batch is one request for up to MAX_BATCH_TASKS rows, rare beside the
    single evaluations whose cost the SQL above is written for. Each evaluation is created a
    microsecond after the one before, so the worker's claim (oldest first) takes them in order.

    The order is by round (SPEC §17 attempts): attempt 1 of every task URL in task_urls order,
    then attempt 2 of every one, and so on. A batch cut short (cancelled, or read while it runs)
    then has every task tried as often as any other, give or take one, and two runs of one task
    are as far apart in the queue as the batch allows.
    """
    db = connections[DEFAULT_DB_ALIAS]
    now = timezone.now()
    with transaction.atomic(using=db.alias):
        if db.vendor == "postgresql":
            with db.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [BATCH_LOCK])
        if key is not None:
            found = Batch.objects.filter(idempotency_scope=scope, idempotency_key=key).values("id", "request_sha256")
            found = found.first()
            if found is not None:
                if found["request_sha256"] != request_sha256:
                    raise IdempotencyConflict(key)
                return found["id"], batch_eval_ids(found["id"]), False
        if Batch.objects.filter(finished_at__isnull=True).count() >= max_open:
            raise AtCapacity()
        batch = Batch.objects.create(
            created_at=now,
            attempts=attempts,
            idempotency_scope=scope,
            idempotency_key=key,
            request_sha256=request_sha256,
            **fields,
        )
        shared = {name: value for name, value in fields.items() if name not in _BATCH_ONLY}
        runs = [(attempt, task_url) for attempt in range(1, attempts + 1) for task_url in task_urls]
        evaluations = [
            Evaluation(
                id=uuid.uuid4(),
                batch=batch,
                task_url=task_url,
                attempt=attempt,
                created_at=now + timezone.timedelta(microseconds=i),
                **shared,
            )
            for i, (attempt, task_url) in enumerate(runs)
        ]
        lifecycle.queue(evaluations)
        transaction.on_commit(lambda: wakeup.notify(data_dir), using=db.alias)
    return batch.id, [e.id for e in evaluations], True


# A batch's own columns; the others are copied to each of its evaluations. Its callback is the
# batch's: its evaluations send none of their own.
_BATCH_ONLY = frozenset({"callback_url"})


def batch_eval_ids(batch_id) -> list[uuid.UUID]:
    return list(Evaluation.objects.filter(batch_id=batch_id).order_by("created_at", "id").values_list("id", flat=True))
