"""What keeps the service's memory down (issue 7): the figures are in bench/, the behaviour here.

* serve's preload leaves nothing for a first query or request to import privately, and no
  PostgreSQL driver on SQLite;
* an evaluation's cancel is a byte on a pipe, so no resource tracker process runs (serve's whole
  process tree: test_worker.py);
* a large response is freed once sent; SQLite connections keep a small page cache.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection

import pytest
from django.db import connections

from evaluations.models import WORKER_LOST
from evaluations.pipeline.cancel import CancelState, Stop
from evaluations.worker.child import start_watching_worker
from executor_project.memory import LARGE_RESPONSE_BYTES, release_after_large_responses
from tests.helpers.database_marks import NO_DATABASE_URL
from tests.helpers.service import PROJECT, LiveService


def run_probe(call: str, env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", f"from tests.worker import probes; probes.{call}"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_env(tmp_path, database_url: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST_", "PROMETHEUS_"))}
    env.update({"DATA_DIR": str(tmp_path / "data"), "DATABASE_URL": database_url, "WORKSPACE_BASE": str(tmp_path)})
    return env


@pytest.mark.slow
@pytest.mark.database  # a LiveService of its own, for its database
def test_after_the_preload_a_first_query_and_the_api_reads_import_nothing(tmp_path):
    service = LiveService(tmp_path / "svc")  # for its fresh database (SQLite, or PostgreSQL when the run uses it)
    try:
        service.manage("migrate", "--noinput")
        task_file = tmp_path / "checks.txt"
        task_file.write_text("\ufefftest -f calc.py\n", encoding="utf-8")
        report = run_probe(f"first_use({str(task_file)!r})", probe_env(tmp_path, service.database.url))
    finally:
        service.database.drop()
    assert report["statuses"] == ["200 OK"] * 5
    # Anything listed here is imported by every process that runs it, each into its own memory:
    # import it in serve.first_use() instead.
    assert report["imported"] == []
    # DRF imports psycopg wherever it can (rest_framework.compat): only a PostgreSQL service lets it.
    assert report["drivers"] == (["psycopg"] if service.database.name else [])


@pytest.mark.slow
def test_the_worker_loss_reaches_the_evaluation_process_and_no_resource_tracker_runs(tmp_path):
    report = run_probe("pool_worker_loss()", probe_env(tmp_path, NO_DATABASE_URL))  # the pool needs no database
    assert report["finished"] == [["probe", 0]]  # exit 0: the target saw the end of its pipe
    assert report["children"] == ["te-forkserver"]  # the evaluation process is the forkserver's child
    assert report["tracker_pid"] is None
    assert not [cmdline for cmdline in report["descendants"] if "resource_tracker" in cmdline]


def reader_and_writer() -> tuple[Connection, int]:
    read_fd, write_fd = os.pipe()
    return Connection(read_fd, writable=False), write_fd


def test_only_the_end_of_the_liveness_pipe_says_the_worker_is_lost():
    channel, write_fd = reader_and_writer()
    state = CancelState()
    start_watching_worker(channel, state)
    os.write(write_fd, b"x")  # a stray byte is not a loss
    time.sleep(0.2)
    assert not state.is_set()
    os.close(write_fd)
    deadline = time.monotonic() + 5
    while not state.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (state.stop, state.reason) == (Stop.WORKER_LOST, WORKER_LOST)
    state.set(Stop.CANCELLED, "by user")  # a lost worker is not overridden by a later cancel
    assert state.stop is Stop.WORKER_LOST


class CyclicResponse:
    """What a DRF response is to the garbage collector: an object that refers to itself."""

    def __init__(self, size: int):
        self.body = b"x" * size
        self.cycle = self
        self.closed = False

    def __iter__(self):
        yield self.body

    def close(self):
        self.closed = True


def serve_once(size: int) -> tuple[weakref.ref, bytes]:
    made = []

    def app(environ, start_response):
        response = CyclicResponse(size)
        made.append(weakref.ref(response))
        return response

    iterable = release_after_large_responses(app)({}, None)
    body = b"".join(iterable)
    iterable.close()
    return made[0], body


def test_a_large_response_is_freed_once_sent_and_a_small_one_left_to_the_collector():
    gc.disable()  # only the wrapper's own collection may free the cycles
    try:
        large, body = serve_once(LARGE_RESPONSE_BYTES)
        assert len(body) == LARGE_RESPONSE_BYTES
        assert large() is None
        small, body = serve_once(100)
        assert body == b"x" * 100
        assert small() is not None and small().closed  # closed, as the server asked; no collection
    finally:
        gc.enable()
        gc.collect()


def test_a_file_response_is_passed_through_for_sendfile():
    class FileWrapper:
        pass

    sent = FileWrapper()
    assert release_after_large_responses(lambda environ, start: sent)({"wsgi.file_wrapper": FileWrapper}, None) is sent


def cache_size_of_a_new_connection() -> int:
    fresh = connections.create_connection("default")
    try:
        with fresh.cursor() as cursor:
            return cursor.execute("PRAGMA cache_size").fetchone()[0]
    finally:
        fresh.close()
        if fresh.connection is not None:  # Django leaves in-memory databases open
            fresh.connection.close()


@pytest.mark.django_db
def test_new_sqlite_connections_keep_a_small_page_cache():
    if connections["default"].vendor != "sqlite":
        pytest.skip("an SQLite setting")
    assert cache_size_of_a_new_connection() == -256  # KiB; SQLite's own default is -2000
