"""POST /evaluate's SQL, written once per process, and its rows' values prepared before the lock.

The admission (api/admission.py) serialises on one lock, so the time it holds it bounds how
many evaluations are admitted a second. Through the ORM it held the lock for about 1.2 ms of
Python (two ``create()``, a ``count()``, a ``filter()``); here, under the lock, run at most
three statements written once per vendor, with every value converted beforehand: the
idempotency lookup, the evaluation's INSERT carrying the capacity check in its WHERE, and
its first transition's INSERT (bench/RESULTS.md, "admission's single statement").

Who runs what: the admission runs the reads (``peek``, ``find_key``); the two INSERTs are
lifecycle's (``lifecycle.prepare_queued``, ``lifecycle.queue_if_room``), the one writer of
statuses and transitions (tests/test_layout.py holds it to that).
"""

from __future__ import annotations

import functools

from django.db import connection
from django.db.models import CharField, Field, TextField

from evaluations.models import ACTIVE_STATUSES, Evaluation, Transition


class Row:
    """An INSERT's parameters for one model: every concrete column, as the ORM would send them.

    Columns the caller does not give hold their field's default, converted for the
    database once per process when it is a constant ("", None, False), at each row
    when it is computed (a callable default). A text column (Django's own CharField or
    TextField) takes a str or None as it is: the ORM's five calls per value return it unchanged.
    """

    def __init__(self, model, *, skip=()):
        self.fields = [field for field in model._meta.concrete_fields if field.attname not in skip]
        self.position = {field.attname: i for i, field in enumerate(self.fields)}
        self.text = [keeps_str(field) for field in self.fields]
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
            row[self.position[name]] = self.prepared(name, value, db)
        return row

    def prepared(self, name: str, value, db):
        """One column's value as the ORM would send it."""
        i = self.position[name]
        if self.text[i] and (value is None or isinstance(value, str)):
            return value
        return self.fields[i].get_db_prep_save(value, db)

    def column(self, name: str) -> str:
        return self.fields[self.position[name]].column


def keeps_str(field) -> bool:
    """True when the field's get_db_prep_save returns any str, and None, unchanged: Django's CharField
    and TextField, whose to_python keeps both, with none of the preparing methods overridden."""
    cls = type(field)
    return (
        cls.get_db_prep_save is Field.get_db_prep_save
        and cls.get_db_prep_value is Field.get_db_prep_value
        and (cls.get_prep_value, cls.to_python) in _TEXT_METHODS
    )


_TEXT_METHODS = {(cls.get_prep_value, cls.to_python) for cls in (CharField, TextField)}


class Statements:
    """The admission's SQL and rows for one database vendor."""

    def __init__(self):
        quote = connection.ops.quote_name
        evaluations = quote(Evaluation._meta.db_table)
        self.evaluation = Row(Evaluation)
        self.transition = Row(Transition, skip={Transition._meta.pk.attname})
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
def statements(vendor: str) -> Statements:
    return Statements()
