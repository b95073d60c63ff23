"""A large text column (an agent's output, its patch, the kept log) handled as UTF-8 by the database,
so the process that ends an evaluation does not hold a second copy of it (issue 38, SPEC §8's memory).

``Utf8Sha256(column)``: the SHA-256 of the column's UTF-8, hex, null when it is empty: what
``representation`` shows as ``agent_patch_sha256``, read without the text. PostgreSQL computes it
(``sha256``, built in since 11); SQLite hands over the UTF-8 as a blob (``CAST ... AS BLOB``, no
decoding into a str), hashed here as it arrives. The digest is that of ``text.encode()``, as
``representation`` computes it from a str.
"""

from __future__ import annotations

import hashlib

from django.db.models import CharField, Func


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
