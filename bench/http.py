"""HTTP: requests/s and p50/p99 latency of the API under 32 concurrent clients.

gunicorn runs as the README starts it (``WEB_WORKERS`` sync workers, the
configured logging); no worker runs during the load, so the figures are the
web side's alone:

- ``GET /evaluate/{id}`` of a completed evaluation (its transitions and two
  test results, as a platform polls it);
- ``POST /evaluate`` admitted (202: the row and its transition are written
  and the worker is poked);
- ``POST /evaluate`` refused at capacity (503 with ``Retry-After``).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench.common import PROJECT, README_WEB_WORKERS, Task, live_service, submit
from bench.e2e import one_evaluation
from bench.loadgen import LoadResult, build_request, run_load

CLIENTS = 32


def _cpu_secs(server_pid: int) -> float:
    """CPU seconds used so far by the gunicorn master and its workers."""
    master = psutil.Process(server_pid)
    total = 0.0
    for proc in (master, *master.children()):
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def measure(port: int, server_pid: int, request: bytes, status: int, duration: float) -> LoadResult:
    """`duration` seconds of 32 clients sending `request`; every reply must have `status`."""
    cpu_before = _cpu_secs(server_pid)
    result = run_load(port, lambda n: request, clients=CLIENTS, duration=duration)
    result.server_cpu_secs = _cpu_secs(server_pid) - cpu_before
    if set(result.statuses) != {status} or result.errors:
        raise RuntimeError(f"expected only {status}, got {dict(result.statuses)} and {result.errors} errors")
    return result


def _stop_worker(service) -> None:
    service.worker.send_signal(signal.SIGTERM)
    service.worker.wait(timeout=60)


@contextlib.contextmanager
def hello_gunicorn(root: Path):
    """The baseline server: bench/hello_wsgi.py under gunicorn with the service's worker count."""
    from tests.helpers.service import free_port

    port = free_port()
    log = open(root / "hello-gunicorn.log", "ab")
    argv = [sys.executable, "-m", "gunicorn", "-k", "sync", "-w", str(README_WEB_WORKERS), "-b", f"127.0.0.1:{port}"]
    argv += ["--access-logfile", "-", "bench.hello_wsgi:app"]
    server = subprocess.Popen(argv, cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield port, server.pid
    finally:
        server.terminate()
        server.wait(timeout=30)


def hello_load(root: Path, duration: float) -> dict[str, LoadResult]:
    post = build_request("POST", "/evaluate", {"task_url": "http://127.0.0.1/task.tar.gz", "agent_code": "print(1)"})
    get = build_request("GET", "/evaluate/00000000-0000-0000-0000-000000000000")
    with hello_gunicorn(root) as (port, pid):
        run_load(port, lambda n: get, clients=CLIENTS, total=200)
        return {"get": measure(port, pid, get, 200, duration), "post": measure(port, pid, post, 202, duration)}


def http_load(root: Path, task: Task, duration: float) -> dict[str, LoadResult]:
    post = build_request("POST", "/evaluate", {"task_url": task.url, "agent_code": task.agent_code})
    results = {}
    with live_service(root, "http", worker=True, MAX_CONCURRENT_EVALS=2, MAX_QUEUED_EVALS=10**7) as service:
        _elapsed, body = one_evaluation(service.port, task)
        _stop_worker(service)  # from here on, only the web side works
        get = build_request("GET", f"/evaluate/{body['eval_id']}")
        run_load(service.port, lambda n: get, clients=CLIENTS, total=200)  # warm every gunicorn worker
        results["get"] = measure(service.port, service.gunicorn.pid, get, 200, duration)
        results["post_accepted"] = measure(service.port, service.gunicorn.pid, post, 202, duration)
    with live_service(root, "http-full", worker=False, MAX_CONCURRENT_EVALS=1, MAX_QUEUED_EVALS=0) as service:
        submit(service.port, task)  # the one slot, taken for good: no worker runs it
        run_load(service.port, lambda n: post, clients=CLIENTS, total=200)
        results["post_refused"] = measure(service.port, service.gunicorn.pid, post, 503, duration)
    return results
