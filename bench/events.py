"""``python -m bench.events [--transitions N] [--streams N] [--secs S]``: event streams (SPEC §18, issue 28).

Every figure is measured in this run, on this machine, and printed; none is judged by an assertion.

1. Latency: an httpx-sse client follows a pending evaluation's stream while this process writes
   ``--transitions`` transitions straight into the live service's database with
   ``lifecycle.record``, one at a time; each is timed from its commit (an ``on_commit`` hook
   registered before record's own announce) to its event reaching the client. Target p50 <= 50 ms.
2. GET /evaluate/{id} of a completed evaluation (bench/http.py's load: 32 clients, the worker
   stopped), with no stream open and with ``--streams`` idle streams open (raw sockets that read
   their first bytes and then wait), and the gunicorn processes' memory (RSS and USS, master and
   workers summed) in both states.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time

import psutil

from bench.common import live_service, load_average, percentile, trivial_task
from bench.e2e import one_evaluation
from bench.http import CLIENTS, _stop_worker, measure
from bench.loadgen import build_request, run_load

MB = 1024 * 1024


def gunicorn_memory(service) -> tuple[float, float]:
    """RSS and USS of the gunicorn master and its workers, summed, in MiB."""
    master = psutil.Process(service.gunicorn.pid)
    infos = [p.memory_full_info() for p in (master, *master.children())]
    return sum(i.rss for i in infos) / MB, sum(i.uss for i in infos) / MB


def open_idle_streams(port: int, path: str, count: int) -> list[socket.socket]:
    """``count`` streams, each open (its ": open" comment read) and then left idle."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = b""
        while b": open" not in head:
            data = sock.recv(4096)
            if not data:
                raise RuntimeError(f"stream {len(sockets) + 1} closed: {head[:200]!r}")
            head += data
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"stream {len(sockets) + 1} refused: {head[:200]!r}")
        sockets.append(sock)
    return sockets


def pending_evaluation(port: int) -> str:
    """An evaluation that stays pending (the worker is stopped): what idle streams follow."""
    from bench.common import request

    status, body = request(port, "POST", "/evaluate", {"task_url": "http://127.0.0.1:9/t.tar.gz", "agent_code": "1"})
    if status != 202:
        raise RuntimeError(f"POST /evaluate: {status} {body[:200]!r}")
    import json

    return json.loads(body)["eval_id"]


def latency(service, transitions: int) -> list[float]:
    """Milliseconds from each transition's commit to its event at the client."""
    import httpx
    from httpx_sse import connect_sse

    os.environ.update(
        {"DATABASE_URL": service.env["DATABASE_URL"], "DATA_DIR": service.env["DATA_DIR"], "WEB_WORKERS": "1"}
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
    import django

    django.setup()
    from django.db import transaction

    from evaluations import lifecycle

    eval_id = pending_evaluation(service.port)
    received: dict[str, float] = {}
    arrived = threading.Condition()
    opened = threading.Event()

    def follow():
        with httpx.Client(base_url=service.base_url, timeout=None) as client:
            with connect_sse(client, "GET", f"/evaluate/{eval_id}/events") as source:
                opened.set()
                for sse in source.iter_sse():
                    with arrived:
                        received[sse.id] = time.perf_counter()
                        arrived.notify_all()
                    if len(received) > transitions:
                        return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    opened.wait(30)
    with arrived:
        arrived.wait_for(lambda: "1.0.0" in received, timeout=30)  # the queued transition
    steps = ("downloading_task", "cloning_repo")
    samples = []
    for n in range(transitions):
        committed = []
        with transaction.atomic():
            transaction.on_commit(lambda committed=committed: committed.append(time.perf_counter()))
            lifecycle.record(eval_id, step=steps[n % 2])
        event_id = f"{n + 2}.0.0"
        with arrived:
            if not arrived.wait_for(lambda event_id=event_id: event_id in received, timeout=30):
                raise RuntimeError(f"event {event_id} never arrived")
        samples.append((received[event_id] - committed[0]) * 1000)
    reader.join(30)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=300)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--secs", type=float, default=8.0, help="each GET load's duration")
    args = parser.parse_args()
    from bench.common import bench_folder

    print(f"load average at the start: {load_average()}", flush=True)
    with bench_folder() as root, trivial_task(root) as task:
        # One slot more than the idle streams: the latency client's, freed only at its stream's next write.
        slots = args.streams + 1
        env = {"MAX_CONCURRENT_EVALS": 2, "MAX_QUEUED_EVALS": 10**6, "MAX_EVENT_STREAMS": slots}
        with live_service(root, "events", worker=True, **env) as service:
            _elapsed, body = one_evaluation(service.port, task)
            _stop_worker(service)  # from here on, only the web side works
            samples = latency(service, args.transitions)
            get = build_request("GET", f"/evaluate/{body['eval_id']}")
            run_load(service.port, lambda n: get, clients=CLIENTS, total=200)  # warm every gunicorn worker
            memory0 = gunicorn_memory(service)
            idle = measure(service.port, service.gunicorn.pid, get, 200, args.secs)
            path = f"/evaluate/{pending_evaluation(service.port)}/events"
            started = time.monotonic()
            streams = open_idle_streams(service.port, path, args.streams)
            open_secs = time.monotonic() - started
            memory1 = gunicorn_memory(service)
            busy = measure(service.port, service.gunicorn.pid, get, 200, args.secs)
            memory2 = gunicorn_memory(service)
            for sock in streams:
                sock.close()
    print(
        f"event latency, commit to client, {len(samples)} transitions: p50 {percentile(samples, 0.5):.1f} ms, "
        f"p95 {percentile(samples, 0.95):.1f} ms, max {max(samples):.1f} ms (target p50 <= 50 ms)"
    )
    for label, result in (
        (f"GET /evaluate/{{id}}, {CLIENTS} clients, no stream", idle),
        (f"same, {args.streams} idle streams open", busy),
    ):
        print(
            f"{label}: {result.rate:.0f} req/s, p50 {result.p(0.5) * 1000:.0f} ms, p99 {result.p(0.99) * 1000:.0f} ms, "
            f"server CPU {result.server_cpu_secs / result.requests * 1000:.2f} ms/request"
        )
    print(f"opening {args.streams} streams took {open_secs:.2f} s")
    print(
        f"gunicorn memory (RSS / USS, MiB): no stream {memory0[0]:.1f} / {memory0[1]:.1f}; "
        f"{args.streams} idle streams {memory1[0]:.1f} / {memory1[1]:.1f}; after the load beside them "
        f"{memory2[0]:.1f} / {memory2[1]:.1f}"
    )
    print(f"load average at the end: {load_average()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
