"""Django's SQLite backend, with write transactions that queue on a file lock.

Every ``atomic`` block on SQLite starts with ``BEGIN IMMEDIATE`` (dburl.py),
which takes the database's write lock. When another process holds it,
SQLite's busy handler sleeps and retries in growing steps (1, 2, 5, 10, 15,
20, 25... ms): a writer that arrives a moment after another one started
sleeps for milliseconds after a lock that was held for a fraction of one. With
four gunicorn workers admitting POSTs and the evaluation processes recording
their steps, that sleeping, not the work, bounded the write rate.

So a write transaction first takes an ``flock`` on ``<database>.writelock``,
retried every 0.1 to 1 ms: a waiter starts at most a millisecond after the
holder lets go (commit, rollback, close, or its death, when the kernel drops
the lock). Waiting is bounded like SQLite's own (the ``timeout`` option):
past it, "database is locked".
Statements outside ``atomic`` (autocommit) still rely on SQLite's handler.

Checkpoints run after the lock is let go. SQLite's own (``wal_autocheckpoint``,
once the log holds 1000 pages) runs inside the commit that crosses the
threshold, so inside the file lock: it copies the log into the database and
fsyncs both while every writer queued behind it waits,
and those stalls were much of POST /evaluate's p99. Here each connection
checkpoints (PASSIVE: it never waits, and writers go on meanwhile) every
``CHECKPOINT_EVERY`` of its write transactions once it has let go of the lock:
an admission writes a few pages, so under a flood of writes the log is copied
before SQLite's own threshold, which stays as the safety net (for writers that
write only outside ``atomic``, and for processes that commit a few times only).
"""

from __future__ import annotations

import fcntl
import os
import time

from django.db import OperationalError
from django.db.backends.sqlite3 import base

CHECKPOINT_EVERY = 16  # write transactions of one connection between two of its checkpoints


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock_fd: int | None = None
        self._lock_pid: int | None = None  # an fd inherited across fork is not ours: its lock is the parent's
        self._lock_held = False
        self._commits_since_checkpoint = 0

    def _start_transaction_under_autocommit(self):
        fd = self._write_lock_fd()
        if fd is not None:
            _acquire(fd, float(self.settings_dict["OPTIONS"].get("timeout", 5)))
            self._lock_held = True
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release()
            raise

    def _commit(self):
        try:
            result = super()._commit()
        finally:
            self._release()
        self._checkpoint_now_and_then()
        return result

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._release()
            if self._lock_fd is not None and self._lock_pid == os.getpid():
                os.close(self._lock_fd)
            self._lock_fd = None

    def _write_lock_fd(self) -> int | None:
        if self.is_in_memory_db():
            return None
        if self._lock_fd is None or self._lock_pid != os.getpid():
            path = f"{self.settings_dict['NAME']}.writelock"
            self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            self._lock_pid = os.getpid()
        return self._lock_fd

    def _checkpoint_now_and_then(self) -> None:
        if self.connection is None or self.is_in_memory_db():
            return
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint < CHECKPOINT_EVERY:
            return
        self._commits_since_checkpoint = 0
        self._checkpoint()

    def _checkpoint(self) -> None:
        try:
            self.connection.execute("PRAGMA wal_checkpoint(PASSIVE)").close()
        except base.Database.Error:
            pass  # best effort: the next one, or SQLite's own, copies these pages

    def _release(self) -> None:
        if self._lock_held and self._lock_pid == os.getpid() and self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._lock_held = False


def _acquire(fd: int, timeout_secs: float) -> None:
    """flock(LOCK_EX) within ``timeout_secs``: retried every 0.1 to 1 ms (a blocking flock has no timeout)."""
    deadline = time.monotonic() + timeout_secs
    delay = 0.0001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise OperationalError("database is locked") from None
        time.sleep(delay)
        delay = min(delay * 2, 0.001)
