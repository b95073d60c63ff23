"""Plain SELECTs of chosen columns, converted exactly as the ORM converts them, for the hot reads.

GET /evaluate/{id} is what platforms poll. Through the ORM (querysets or ``raw``) its
three SELECTs cost more CPU than the rest of the request, and the route missed its
bench/run target (bench/RESULTS.md): for every query the ORM compiles the SQL and
finds each column's converters again. Here both are found once per connection, and a
row becomes a named tuple of the converted values: the same Python values the model's
attributes would hold (the converters are the ORM's own: ``connection.ops`` and the
field's ``from_db_value``), so the JSON built from them is the same.
"""

from __future__ import annotations

import weakref
from collections import namedtuple


class Select:
    """``SELECT <columns> FROM <model's table> WHERE <column> = %s [ORDER BY ...]``."""

    def __init__(self, model, attnames: tuple[str, ...], *, where: str, order_by: tuple[str, ...] = ()):
        self.model = model
        self.fields = [model._meta.get_field(name) for name in attnames]
        self.where = model._meta.get_field(where)
        self.order_by = [model._meta.get_field(name) for name in order_by]
        self.row = namedtuple(f"{model.__name__}Row", attnames)
        self._prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _prepare(self, connection) -> tuple[str, list]:
        """The SQL and each column's (converters, expression) for this connection (thread)."""
        quote = connection.ops.quote_name
        table = self.model._meta.db_table
        sql = (
            f"SELECT {', '.join(quote(field.column) for field in self.fields)} FROM {quote(table)} "
            f"WHERE {quote(self.where.column)} = %s"
        )
        if self.order_by:
            sql += f" ORDER BY {', '.join(quote(field.column) for field in self.order_by)}"
        converters = []
        for position, field in enumerate(self.fields):
            expression = field.get_col(table)  # what the ORM's compiler passes to the converters
            found = connection.ops.get_db_converters(expression) + expression.get_db_converters(connection)
            if found:
                converters.append((position, found, expression))
        return sql, converters

    def rows(self, cursor, key) -> list:
        """Every row whose ``where`` column equals ``key`` (a Python value of that field), read with ``cursor``."""
        connection = cursor.db
        prepared = self._prepared.get(connection)
        if prepared is None:
            prepared = self._prepared[connection] = self._prepare(connection)
        sql, converters = prepared
        cursor.execute(sql, [self.where.get_db_prep_value(key, connection)])
        fetched = cursor.fetchall()
        if not converters:
            return [self.row._make(values) for values in fetched]
        result = []
        for values in fetched:
            values = list(values)
            for position, found, expression in converters:
                value = values[position]
                for converter in found:
                    value = converter(value, expression, connection)
                values[position] = value
            result.append(self.row._make(values))
        return result
