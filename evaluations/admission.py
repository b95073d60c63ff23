"""POST /evaluate's decision: admit, refuse at capacity, or replay an idempotent request.

Counting pending+running and inserting happen in one transaction that
serialises admissions: SQLite's IMMEDIATE transaction takes the write lock at
BEGIN; on PostgreSQL an advisory transaction lock does the same. Without it,
two gunicorn workers could both see one free slot and both insert.

Admissions queue on that lock, so the time it is held bounds how many can be
admitted a second. Everything that does not need it happens before BEGIN: the
rows are built and every value converted for the database, with SQL written
once per process. Under the lock run at most three statements: the idempotency
lookup (only with a key), the evaluation's INSERT, which carries the capacity
check in its WHERE (counting and inserting are one statement), and the first
transition's INSERT. Through the ORM the same work ran much more Python, most
of it under the lock (bench/RESULTS.md has the figures).

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

import functools
import uuid

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import CharField, Field, TextField
from django.utils import timezone

from evaluations.models import ACTIVE_STATUSES, Batch, Evaluation, Status, Step, Transition
from evaluations.worker import wakeup

ADMISSION_LOCK = 0x7E57E4EC  # any constant shared by every process of the fleet


class AtCapacity(Exception):
    pass


class IdempotencyConflict(Exception):
    pass


class _Row:
    """An INSERT's parameters for one model: every concrete column, as the ORM would send them.

    Columns the caller does not give hold their field's default, converted for the
    database once per process when it is a constant ("", None, False), at each row
    when it is computed (a callable default). A text column (Django's own CharField or
    TextField) takes a str or None as it is: the ORM's five calls per value return it unchanged.
    """

    def __init__(self, model, *, skip=()):
        self.fields = [field for field in model._meta.concrete_fields if field.attname not in skip]
        self.position = {field.attname: i for i, field in enumerate(self.fields)}
        self.text = [_keeps_str(field) for field in self.fields]
        self.template = []
        self.computed = []  # fields whose default is made anew for every row
        for field in self.fields:
            if callable(field.default):
                self.computed.append(field)
                self.template.append(None)
            else:
                self.template.append(field.get_db_prep_save(field.get_default(), connection))

    def values(self, given: dict, db) -> list:
        row = list(self.template)
        for field in self.computed:
            if field.attname not in given:
                row[self.position[field.attname]] = field.get_db_prep_save(field.get_default(), db)
        for name, value in given.items():
            i = self.position[name]
            if self.text[i] and (value is None or isinstance(value, str)):
                row[i] = value
            else:
                row[i] = self.fields[i].get_db_prep_save(value, db)
        return row


def _keeps_str(field) -> bool:
    """True when the field's get_db_prep_save returns any str, and None, unchanged: Django's CharField
    and TextField, whose to_python keeps both, with none of the preparing methods overridden."""
    cls = type(field)
    return (
        cls.get_db_prep_save is Field.get_db_prep_save
        and cls.get_db_prep_value is Field.get_db_prep_value
        and (cls.get_prep_value, cls.to_python) in _TEXT_METHODS
    )


_TEXT_METHODS = {(cls.get_prep_value, cls.to_python) for cls in (CharField, TextField)}


class _Statements:
    """The admission's SQL and rows for one database vendor."""

    def __init__(self):
        quote = connection.ops.quote_name
        evaluations = quote(Evaluation._meta.db_table)
        self.evaluation = _Row(Evaluation)
        self.transition = _Row(Transition, skip={Transition._meta.pk.attname})
        columns = ", ".join(quote(field.column) for field in self.evaluation.fields)
        values = ", ".join(["%s"] * len(self.evaluation.fields))
        # Literals, and the index's own terms: SQLite then uses eval_batch_active_idx.
        active = ", ".join(f"'{status}'" for status in ACTIVE_STATUSES)
        # Only single evaluations count: a batch's are bounded by MAX_OPEN_BATCHES x MAX_BATCH_TASKS
        # (admit_batch), and a full batch must not shut POST /evaluate out for its whole run.
        single = f"{quote('status')} IN ({active}) AND {quote('batch_id')} IS NULL"
        # Counting stops at the limit: a deep queue costs the check no more than a full one.
        room = f"(SELECT COUNT(*) FROM (SELECT 1 FROM {evaluations} WHERE {single} LIMIT %s) AS active) < %s"
        if connection.vendor == "sqlite":
            # A table of fewer rows than the limit has room whatever their status, and SQLite
            # finds its largest rowid (never below the number of rows) in one b-tree descent.
            # With a very large MAX_QUEUED_EVALS, a queue of thousands costs no count at all.
            room = f"(SELECT COALESCE(MAX(rowid), 0) FROM {evaluations}) < %s OR {room}"
        self.room_params = room.count("%s")
        self.insert_if_room = f"INSERT INTO {evaluations} ({columns}) SELECT {values} WHERE {room}"
        key_match = f"{quote('idempotency_scope')} = %s AND {quote('idempotency_key')} = %s"
        pk, sha = quote(Evaluation._meta.pk.column), quote("request_sha256")
        self.find_key = f"SELECT {pk}, {sha} FROM {evaluations} WHERE {key_match}"
        # Without the lock, one snapshot: (id, request_sha256) of the key's row or NULLs, and the room.
        has_room = f"CASE WHEN {room} THEN 1 ELSE 0 END"
        self.peek = f"SELECT NULL, NULL, {has_room}"
        self.peek_key = (
            f"SELECT keyed.{pk}, keyed.{sha}, {has_room} FROM (SELECT 1 AS one) AS one "
            f"LEFT JOIN {evaluations} AS keyed ON keyed.{key_match.replace(' AND ', ' AND keyed.')}"
        )
        transition_columns = ", ".join(quote(field.column) for field in self.transition.fields)
        self.insert_transition = (
            f"INSERT INTO {quote(Transition._meta.db_table)} ({transition_columns}) "
            f"VALUES ({', '.join(['%s'] * len(self.transition.fields))})"
        )


@functools.cache
def _statements(vendor: str) -> _Statements:
    return _Statements()


_met_full = False  # this process's last admission found the executor full: peek before queueing


def _peek(db, sql: _Statements, *, limit: int, scope: str, key: str | None, request_sha256: str):
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
    sql = _statements(db.vendor)
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
    db, sql: _Statements, *, fields: dict, limit: int, scope: str, key: str | None, request_sha256: str, data_dir
) -> tuple[uuid.UUID, bool]:
    global _met_full
    given = {
        "id": uuid.uuid4(),
        "created_at": timezone.now(),
        "status": Status.PENDING,
        "step": Step.QUEUED,
        "idempotency_scope": scope,
        "idempotency_key": key,
        "request_sha256": request_sha256,
        **fields,
    }
    row = sql.evaluation.values(given, db)
    transition_row = sql.transition.values(
        {"evaluation_id": given["id"], "step": Step.QUEUED, "status": Status.PENDING, "at": given["created_at"]}, db
    )
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
        cursor.execute(sql.insert_if_room, [*row, *[limit] * sql.room_params])
        if cursor.rowcount != 1:
            raise AtCapacity()
        cursor.execute(sql.insert_transition, transition_row)
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
                status=Status.PENDING,
                step=Step.QUEUED,
                **shared,
            )
            for i, (attempt, task_url) in enumerate(runs)
        ]
        Evaluation.objects.bulk_create(evaluations)
        Transition.objects.bulk_create(
            Transition(evaluation_id=e.id, step=Step.QUEUED, status=Status.PENDING, at=e.created_at)
            for e in evaluations
        )
        transaction.on_commit(lambda: wakeup.notify(data_dir), using=db.alias)
    return batch.id, [e.id for e in evaluations], True


# A batch's own columns; the others are copied to each of its evaluations. Its callback is the
# batch's: its evaluations send none of their own.
_BATCH_ONLY = frozenset({"callback_url"})


def batch_eval_ids(batch_id) -> list[uuid.UUID]:
    return list(Evaluation.objects.filter(batch_id=batch_id).order_by("created_at", "id").values_list("id", flat=True))
