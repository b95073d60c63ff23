"""A large text column (an agent's output, its patch, the kept log) handled as UTF-8 by the database,
so the process that ends an evaluation does not hold a second copy of it (issue 38, SPEC §8's memory).

1. ``Utf8Sha256(column)``: the SHA-256 of the column's UTF-8, hex, null when it is empty: what
   ``representation`` shows as ``agent_patch_sha256``, read without the text. PostgreSQL computes it
   (``sha256``, built in since 11); SQLite hands over the UTF-8 as a blob (``CAST ... AS BLOB``,
   no decoding into a str), hashed here as it arrives.
2. ``Utf8Text(data)``: ``data`` (bytes, valid UTF-8 without NUL: ``runtime.output.as_text``'s rule)
   written to a text column as text by the database (``CAST ... AS TEXT``, ``convert_from``), so
   text kept as bytes is never decoded into a str of up to 4 bytes a character and encoded again.

Each stores and reads exactly what the str would: the column holds the same text, and the digest
is that of ``text.encode()``.
"""

from __future__ import annotations

import hashlib

from django.db.models import BinaryField, CharField, Func, TextField, Value


class Utf8Sha256(Func):
    """The hex SHA-256 of a text column's UTF-8; null when the column is empty."""

    output_field = CharField()

    def as_postgresql(self, compiler, connection, **extra_context):
        template = "ENCODE(SHA256(CONVERT_TO(NULLIF(%(expressions)s, ''), 'UTF8')), 'hex')"
        return self.as_sql(compiler, connection, template=template, **extra_context)

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="CAST(NULLIF(%(expressions)s, '') AS BLOB)", **extra_context)

    def get_db_converters(self, connection):
        converters = super().get_db_converters(connection)
        if connection.vendor == "sqlite":
            converters.append(_hex_sha256)
        return converters


def _hex_sha256(value, expression, connection):
    return None if value is None else hashlib.sha256(value).hexdigest()


# How each database makes a parameter's UTF-8 (bytes) the text a column stores: ``Utf8Text``'s SQL,
# and that of the statements written by hand for it (db/progress.py).
UTF8_TEXT_SQL = {"postgresql": "CONVERT_FROM(%s, 'UTF8')", "sqlite": "CAST(%s AS TEXT)"}


class Utf8Text(Func):
    """``data``'s UTF-8 as the text the column stores."""

    output_field = TextField()

    def __init__(self, data: bytes):
        if not isinstance(data, bytes):
            raise TypeError(f"Utf8Text takes the text's UTF-8 (bytes), not {type(data).__name__}")
        super().__init__(Value(data, output_field=BinaryField()))

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template=_utf8_template("postgresql"), **extra_context)

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template=_utf8_template("sqlite"), **extra_context)


def _utf8_template(vendor: str) -> str:
    return UTF8_TEXT_SQL[vendor].replace("%s", "%(expressions)s")
