"""Memory the service's processes hold on to after large outputs, and what lets them give it back.

Measured with ``python -m bench --only memory`` (bench/RESULTS.md): an agent
writing 1 GB leaves a 1 MiB ``agent_output`` and a 1 MiB log in its row.

1. A gunicorn worker rendering such a row for ``GET /evaluate/{id}`` kept
   the row, the data and the rendered body until its next full
   garbage collection, several large responses later: a DRF response is a
   reference cycle (response -> renderer context -> view -> response). After
   a large response the worker collects at once, then hands the freed
   memory back to the kernel (``malloc_trim``): glibc's mmap threshold
   rises to the size of the first large block freed, so later megabyte
   blocks come from the heap, and freed heap memory stays in the process.
(SQLite's page cache, the other thing a large row filled, is capped where the
connection is configured: ``dburl.SQLITE_OPTIONS``.)

2. A process whose database is SQLite imports no PostgreSQL driver
   (``without_postgresql_drivers``): DRF imported psycopg whenever it was installed.
"""

from __future__ import annotations

import ctypes
import gc
import sys

from executor_project.dburl import POSTGRESQL_ENGINE

_libc = ctypes.CDLL(None)
LARGE_RESPONSE_BYTES = 256 * 1024
POSTGRESQL_DRIVERS = ("psycopg", "psycopg2")


def release_after_large_responses(app):
    """``app`` as a WSGI application that frees what a large response left behind once it is sent."""

    def application(environ, start_response):
        response = app(environ, start_response)
        file_wrapper = environ.get("wsgi.file_wrapper")
        if file_wrapper is not None and isinstance(response, file_wrapper):
            return response  # gunicorn sends these with sendfile: leave them as they are
        return _Releasing(response)

    return application


class _Releasing:
    """The response's chunks, counted; ``close`` drops the response and collects if it was large.

    The server calls ``close`` after sending the last chunk; until then it holds this object, so
    the response itself is only reachable through the cycle that ``gc.collect`` then frees.
    """

    def __init__(self, response):
        self.response = response
        self.sent = 0

    def __iter__(self):
        for chunk in self.response:
            self.sent += len(chunk)
            yield chunk

    def close(self) -> None:
        response, self.response = self.response, None
        try:
            if hasattr(response, "close"):
                response.close()
        finally:
            del response  # the last reference outside the cycle (a bound method would be one more)
            if self.sent >= LARGE_RESPONSE_BYTES:
                gc.collect()
                _libc.malloc_trim(0)


def without_postgresql_drivers(database: dict) -> None:
    """Make the PostgreSQL drivers unimportable in this process when ``database`` is not PostgreSQL.

    Nothing of ours imports one then, but DRF does whenever it is installed: ``rest_framework.compat``
    imports ``django.contrib.postgres.fields``, whose ``psycopg_any`` imports psycopg (or psycopg2),
    and takes an ImportError as "no PostgreSQL fields". That was 87 modules, 6 MB of every
    process's heap and 3 MB of libraries (libssl, libkrb5, libldap) for a database the service never
    talks to: 7 MB of the service's PSS (bench/RESULTS.md, issue 38 stop 55). ``None`` in
    ``sys.modules`` is the import system's own "not there" (ModuleNotFoundError). A driver already
    imported is left as it is.
    """
    if database["ENGINE"] == POSTGRESQL_ENGINE:
        return
    for name in POSTGRESQL_DRIVERS:
        sys.modules.setdefault(name, None)
