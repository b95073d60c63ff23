"""DATABASE_URL -> Django DATABASES entry (SQLite or PostgreSQL through psycopg 3)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from executor_project.config import ConfigError

SQLITE_OPTIONS = {
    # WAL lets readers (gunicorn) and the writer (the worker) work at once. The page cache is
    # 256 KiB, not SQLite's 2 MB: rows are read and written by primary key, which a few dozen
    # pages serve, and a connection that touched a row with 1 MiB outputs kept 2 MB of its
    # overflow pages in every process (bench/RESULTS.md, memory).
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-256;",
    # Seconds a writer waits for the lock instead of failing with "database is locked".
    "timeout": 30,
    # Take the write lock at BEGIN so a read-then-write transaction never deadlocks
    # on upgrade; this is also what serialises admissions.
    "transaction_mode": "IMMEDIATE",
}


POSTGRESQL_ENGINE = "django.db.backends.postgresql"


def sqlite_database(path: Path) -> dict:
    # Persistent connections: opening one (and its PRAGMAs) per request costs more than the query.
    # The engine is Django's, with write transactions queued on a file lock (backends/sqlite3/base.py).
    return {
        "ENGINE": "executor_project.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": SQLITE_OPTIONS,
        "CONN_MAX_AGE": 600,
        # Django's default for SQLite, spelled out: pytest-django recognises only Django's own
        # engine name, and under xdist would otherwise name a per-worker test file "test_/abs/path_gw0".
        "TEST": {"NAME": ":memory:"},
    }


def parse_database_url(url: str, default_sqlite: Path) -> dict:
    """Return a DATABASES["default"] dict; raise ConfigError naming DATABASE_URL."""
    if not url:
        return sqlite_database(default_sqlite)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        # sqlite:///relative/path, sqlite:////absolute/path (as dj-database-url reads them)
        raw = unquote(parts.path)[1:]
        if not raw:
            raise ConfigError("DATABASE_URL: a sqlite URL needs a file path, e.g. sqlite:////var/lib/x.db")
        return sqlite_database(Path(raw).absolute())
    if scheme in ("postgres", "postgresql", "pgsql"):
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ConfigError("DATABASE_URL: a postgres URL needs a database name")
        options = dict(parse_qsl(parts.query))
        return {
            "ENGINE": POSTGRESQL_ENGINE,
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": options,
            # Keep connections across requests; the worker closes its own.
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ConfigError(f"DATABASE_URL: unsupported scheme {parts.scheme!r} (use sqlite:// or postgres://)")
