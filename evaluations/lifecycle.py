"""The one place that moves an evaluation between steps and statuses.

Every change writes the Evaluation row and a Transition row in one short
transaction, and is conditional on the status the caller expects, so a
pipeline that lost a race with DELETE (or with the reaper) finds out instead
of overwriting a terminal state.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
from collections.abc import Iterable

from django.db import connection, transaction
from django.utils import timezone

from evaluations.models import ACTIVE_STATUSES, Evaluation, Status, Step, TestResult, Transition


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

    Four statements in one transaction: the conditional UPDATE of the row, one
    read of its step and status as they are now with the transition to close
    (a join), the close, and the new transition. They are written as SQL once
    per process (``_statements``): every evaluation records nine transitions,
    and the ORM spent ~3 ms of CPU building the same four queries each time.
    """
    now = timezone.now()
    updates = dict(fields)
    if step is not None:
        updates["step"] = step
    if status is not None:
        updates["status"] = status
    sql = _statements(connection.vendor)
    expect = list(expect)
    evaluation_id = sql.evaluation_pk.get_db_prep_value(eval_id, connection)
    columns = ", ".join(f"{sql.quote(sql.evaluation_fields[name].column)} = %s" for name in updates)
    values = [sql.evaluation_fields[name].get_db_prep_save(value, connection) for name, value in updates.items()]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {sql.evaluations} SET {columns} WHERE {sql.evaluation_id} = %s "
            f"AND {sql.quote('status')} IN ({', '.join(['%s'] * len(expect))})",
            [*values, evaluation_id, *expect],
        )
        if cursor.rowcount != 1:
            return False
        cursor.execute(sql.previous, [evaluation_id])
        current_step, current_status, previous_id, previous_at, duration_ms = cursor.fetchone()
        if previous_id is not None and duration_ms is None:
            elapsed = _elapsed_ms(_datetime(previous_at), now)
            cursor.execute(sql.close_previous, [elapsed, previous_id])
        cursor.execute(
            sql.insert, [evaluation_id, current_step, current_status, sql.at.get_db_prep_save(now, connection)]
        )
    return True


class _Statements:
    """record()'s SQL for one database vendor, and the fields that convert its values."""

    def __init__(self):
        self.quote = quote = connection.ops.quote_name
        self.evaluation_fields = {field.name: field for field in Evaluation._meta.concrete_fields}
        self.evaluation_fields.update({field.attname: field for field in Evaluation._meta.concrete_fields})
        self.evaluation_pk = Evaluation._meta.pk
        self.at = Transition._meta.get_field("at")
        self.evaluations = quote(Evaluation._meta.db_table)
        self.evaluation_id = quote(self.evaluation_pk.column)
        transitions = quote(Transition._meta.db_table)
        link = quote(Transition._meta.get_field("evaluation").column)
        t_id, at, duration = quote("id"), quote("at"), quote("duration_ms")
        self.previous = (
            f"SELECT e.{quote('step')}, e.{quote('status')}, t.{t_id}, t.{at}, t.{duration} "
            f"FROM {self.evaluations} e LEFT JOIN {transitions} t ON t.{link} = e.{self.evaluation_id} "
            f"WHERE e.{self.evaluation_id} = %s ORDER BY t.{at} DESC, t.{t_id} DESC LIMIT 1"
        )
        self.close_previous = f"UPDATE {transitions} SET {duration} = %s WHERE {t_id} = %s"
        self.insert = (
            f"INSERT INTO {transitions} ({link}, {quote('step')}, {quote('status')}, {at}) VALUES (%s, %s, %s, %s)"
        )


@functools.cache
def _statements(vendor: str) -> _Statements:
    return _Statements()


def _datetime(value) -> datetime.datetime:
    """A DateTimeField as a cursor returns it: aware from PostgreSQL, UTC text from SQLite."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if timezone.is_naive(value):
        value = value.replace(tzinfo=datetime.UTC)
    return value


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
    expect: Iterable[str] = ACTIVE_STATUSES,
    **fields,
) -> bool:
    """End an evaluation: step `done`, final status, `passed`, times and the results hash."""
    now = timezone.now()
    row = Evaluation.objects.filter(id=eval_id).values("created_at", "started_at", "callback_url").first()
    if row is None:
        return False
    if row["callback_url"]:
        # The worker's callback dispatcher delivers it; nothing here waits on the receiver.
        fields.update(callback_state="pending", callback_next_at=now)
    results = list(TestResult.objects.filter(evaluation_id=eval_id).values("name", "passed", "exit_code"))
    passed = status == Status.COMPLETED
    return record(
        eval_id,
        step=Step.DONE,
        status=status,
        expect=expect,
        passed=passed,
        error=error,
        finished_at=now,
        duration_ms=_elapsed_ms(row["started_at"] or row["created_at"], now),
        results_sha256=results_sha256(eval_id, passed, results),
        **fields,
    )


def cancel(eval_id, reason: str) -> str | None:
    """DELETE: cancel a pending evaluation at once, ask a running one to stop.

    Returns the status after the call, or None if the evaluation had already ended.
    """
    if finish(eval_id, Status.CANCELLED, error=f"queued: {reason}", expect=[Status.PENDING], cancel_reason=reason):
        return Status.CANCELLED
    asked = Evaluation.objects.filter(id=eval_id, status=Status.RUNNING).update(
        cancel_requested=True, cancel_reason=reason
    )
    return Status.RUNNING if asked else None
