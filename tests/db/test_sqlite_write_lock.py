"""The SQLite backend queues write transactions on a file lock (executor_project/backends/sqlite3)."""

from __future__ import annotations

import fcntl
import os
import threading
import types

import pytest
from django.db import OperationalError
from django.db.utils import ConnectionHandler

from executor_project.dburl import parse_database_url
from tests.helpers.polling import wait_for


@pytest.fixture
def connections(tmp_path, django_db_blocker):
    """A fresh file database (not the test run's); each thread gets its own connection, as in Django."""
    settings = parse_database_url(f"sqlite:///{tmp_path / 'db.sqlite3'}", tmp_path / "unused")
    settings["OPTIONS"] = {**settings["OPTIONS"], "timeout": 0.5}
    handler = ConnectionHandler({"default": settings})
    with django_db_blocker.unblock():
        with handler["default"].cursor() as cursor:
            cursor.execute("CREATE TABLE t (x INTEGER)")
        yield handler
        handler.close_all()


def begin(connection) -> None:
    """What transaction.atomic does on SQLite: BEGIN IMMEDIATE under autocommit."""
    connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)


def end(connection, commit: bool = True) -> None:
    connection.commit() if commit else connection.rollback()
    connection.set_autocommit(True)


def lock_is_free(handler) -> bool:
    """Whether another process could take <database>.writelock now."""
    fd = os.open(f"{handler['default'].settings_dict['NAME']}.writelock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def writer_in_thread(handler, started: threading.Event, errors: list) -> threading.Thread:
    def write():
        connection = handler["default"]
        try:
            begin(connection)
            started.set()
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO t VALUES (2)")
            end(connection)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=write)
    thread.start()
    return thread


@pytest.fixture
def flock_attempts(monkeypatch):
    """Every flock the backend makes (the operations, in order); fcntl itself is the real one."""
    from executor_project.backends.sqlite3 import base

    attempts, real_flock = [], fcntl.flock

    def flock(fd, operation):
        attempts.append(operation)
        return real_flock(fd, operation)

    monkeypatch.setattr(base, "fcntl", types.SimpleNamespace(**{**vars(fcntl), "flock": flock}))
    return attempts


@pytest.mark.parametrize("how", ["commit", "rollback", "close"])
def test_a_writer_waits_for_the_holder_then_goes(connections, how, flock_attempts):
    holder = connections["default"]
    begin(holder)
    with holder.cursor() as cursor:
        cursor.execute("INSERT INTO t VALUES (1)")
    connections.settings["default"]["OPTIONS"]["timeout"] = 120  # the writer's (a new connection): it outwaits us
    flock_attempts.clear()
    started, errors = threading.Event(), []
    thread = writer_in_thread(connections, started, errors)
    # The writer is seen asking for the lock again, refused, and not begun while the first holds it.
    wait_for(lambda: len(flock_attempts) >= 3, interval=0.001, what="the second writer to retry the lock")
    assert not started.is_set(), "the second writer began while the first held the lock"
    assert not lock_is_free(connections)
    if how == "close":
        holder.close()
    else:
        end(holder, commit=how == "commit")
    assert started.wait(60), "the second writer did not begin once the lock was free"
    thread.join()
    assert errors == []
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT x FROM t ORDER BY x")
        rows = [row[0] for row in cursor.fetchall()]
    assert rows == ([1, 2] if how == "commit" else [2])
    assert lock_is_free(connections)


def test_waiting_is_bounded_by_the_timeout_option(connections, monkeypatch, flock_attempts):
    """The writer asks for the lock again and again (it waits), then gives up by itself while the
    holder still holds it (the wait is bounded), the bound being the ``timeout`` option's."""
    from executor_project.backends.sqlite3 import base

    holder = connections["default"]
    begin(holder)
    timeouts, attempts, real_acquire = [], flock_attempts, base._acquire
    attempts.clear()

    def acquire(fd, timeout_secs):
        timeouts.append(timeout_secs)
        real_acquire(fd, timeout_secs)

    monkeypatch.setattr(base, "_acquire", acquire)
    started, errors = threading.Event(), []
    thread = writer_in_thread(connections, started, errors)
    thread.join(60)
    assert not thread.is_alive(), "the writer waits for the lock without end"
    assert not lock_is_free(connections)  # it gave up while the holder held the lock
    assert not started.is_set()
    assert len(errors) == 1 and isinstance(errors[0], OperationalError) and str(errors[0]) == "database is locked"
    assert timeouts == [0.5]  # the fixture's option
    assert len(attempts) > 10, "the writer did not wait for the lock, it tried once"
    end(holder)


def test_checkpoints_run_after_the_lock_is_let_go(connections, monkeypatch):
    """SQLite's own checkpoint (inside the commit, so inside the lock) is only a safety net:
    the connection copies the log into the database every CHECKPOINT_EVERY commits, once
    the next writer may already go."""
    from executor_project.backends.sqlite3 import base

    connection = connections["default"]
    lock_free_at_checkpoint = []
    real_checkpoint = base.DatabaseWrapper._checkpoint

    def watched(self):
        lock_free_at_checkpoint.append(lock_is_free(connections))
        real_checkpoint(self)

    monkeypatch.setattr(base.DatabaseWrapper, "_checkpoint", watched)
    for n in range(2 * base.CHECKPOINT_EVERY):
        begin(connection)
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO t VALUES (%s)", [n])
        end(connection)
    assert lock_free_at_checkpoint == [True, True]
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
        busy, log_frames, checkpointed = cursor.fetchone()
    assert busy == 0 and log_frames == checkpointed
