"""A running pipeline's transitions (``lifecycle.Progress``'s records and end): three statements written once.

Through the ORM each transition held the evaluation process for 1.2-1.6 ms of Python (p50 in a
pipeline, nine an evaluation, on the path of every evaluation: three querysets built, compiled and
run; 0.43-0.64 ms now); here the same three statements are written once per database (the
evaluation's UPDATE once per set of columns a step stages), and each value is converted as the ORM
converts it (the admission's rows: ``admission.Row.prepared``; bytes, the UTF-8 of a text column,
made text by the database as ``text.Utf8Text`` does). bench/RESULTS.md, issue 38, stop 55.

Who runs them: lifecycle, the one writer of statuses and transitions (tests/test_layout.py).
"""

from __future__ import annotations

import functools

from django.db import connection

from evaluations.db import admission
from evaluations.db.text import UTF8_TEXT_SQL
from evaluations.models import Evaluation, Transition


class Statements:
    """The SQL of a pipeline's step change for one database vendor."""

    def __init__(self, vendor: str):
        quote = connection.ops.quote_name
        rows = admission.statements(vendor)  # the same rows and first-transition INSERT as a new evaluation's
        self.evaluation, self.transition = rows.evaluation, rows.transition
        self.utf8 = UTF8_TEXT_SQL[vendor]
        self.quote = quote
        self.table = quote(Evaluation._meta.db_table)
        pk, status = (quote(self.evaluation.column(name)) for name in (Evaluation._meta.pk.attname, "status"))
        self.where = f"{pk} = %s AND {status} = %s"
        transitions, transition_pk = quote(Transition._meta.db_table), quote(Transition._meta.pk.column)
        duration = quote(Transition._meta.get_field("duration_ms").column)
        self.close_previous = f"UPDATE {transitions} SET {duration} = %s WHERE {transition_pk} = %s"
        self.insert_transition = f"{rows.insert_transition} RETURNING {transition_pk}"
        self.updates: dict[tuple[tuple[str, bool], ...], str] = {}

    def update(self, columns: tuple[tuple[str, bool], ...]) -> str:
        """The evaluation's UPDATE of ``columns`` ((attname, given as UTF-8) each), conditional on its
        id and status; written once per set of columns (a few: what each step stages)."""
        sql = self.updates.get(columns)
        if sql is None:
            sets = ", ".join(
                f"{self.quote(self.evaluation.column(name))} = {self.utf8 if utf8 else '%s'}" for name, utf8 in columns
            )
            sql = self.updates[columns] = f"UPDATE {self.table} SET {sets} WHERE {self.where}"
        return sql

    def update_values(self, updates: dict, db) -> tuple[tuple[tuple[str, bool], ...], list]:
        """``updates`` (attname: value; bytes for a text column's UTF-8) as the UPDATE's columns and
        parameters, the WHERE's left to the caller."""
        columns, params = [], []
        for name, value in updates.items():
            utf8 = isinstance(value, bytes)
            columns.append((name, utf8))
            params.append(value if utf8 else self.evaluation.prepared(name, value, db))
        return tuple(columns), params

    def pk_value(self, eval_id, db):
        return self.evaluation.prepared(Evaluation._meta.pk.attname, eval_id, db)


@functools.cache
def statements(vendor: str) -> Statements:
    return Statements(vendor)
