"""A small HTTP load generator: N client threads, raw sockets, keep-alive when the server allows it.

Each client sends one request, reads the whole reply (Content-Length), and
sends the next; it reconnects only when the server says ``Connection:
close`` (gunicorn's sync workers always do). A request's latency counts
from before the connect (when one is needed) to the last byte of the
reply. Requests are prebuilt bytes and replies are parsed only as far as
the status line and the headers, so the generator spends a few tens of
microseconds per request; its own CPU time is reported next to the figures.

Bounded and self-stopping: it runs for ``duration`` seconds (or ``total``
requests), only against 127.0.0.1.
"""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.common import percentile

HOST = "127.0.0.1"


def build_request(method: str, path: str, body: dict | None = None, headers: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}", "User-Agent: te-bench", "Accept: */*"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


@dataclass
class LoadResult:
    requests: int
    seconds: float
    statuses: Counter
    latencies: list[float] = field(repr=False)
    errors: int
    client_cpu_secs: float
    reconnects: int
    server_cpu_secs: float = 0.0  # filled in by the caller that knows the server's processes

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def p(self, fraction: float) -> float:
        return percentile(self.latencies, fraction) if self.latencies else float("nan")


class _Connection:
    def __init__(self, port: int):
        self.port = port
        self.sock: socket.socket | None = None
        self.buffer = b""

    def connect(self) -> None:
        self.sock = socket.create_connection((HOST, self.port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def exchange(self, data: bytes) -> tuple[int, bytes, bool]:
        """(status, body, server keeps the connection)."""
        self.sock.sendall(data)
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, keep = 0, lines[0].startswith(b"HTTP/1.1")
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                keep = value.strip().lower() == b"keep-alive" or (keep and value.strip().lower() != b"close")
        while len(rest) < length:
            self.buffer = rest
            self._read()
            rest = self.buffer
        self.buffer = rest[length:]
        return status, rest[:length], keep

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection mid-reply")
        self.buffer += chunk


def run_load(
    port: int,
    make_request: Callable[[int], bytes],
    *,
    clients: int = 32,
    duration: float | None = None,
    total: int | None = None,
    check: Callable[[int, bytes], None] | None = None,
) -> LoadResult:
    """Hammer 127.0.0.1:``port`` with ``clients`` threads; ``make_request(n)`` gives the n-th request's bytes."""
    if (duration is None) == (total is None):
        raise ValueError("give duration or total")
    lock = threading.Lock()
    counter = iter(range(total if total is not None else 1 << 62))
    latencies: list[list[float]] = [[] for _ in range(clients)]
    statuses: list[Counter] = [Counter() for _ in range(clients)]
    errors = [0] * clients
    reconnects = [0] * clients
    start_gate = threading.Event()
    deadline = [0.0]

    def client(index: int) -> None:
        conn = _Connection(port)
        mine, seen = latencies[index], statuses[index]
        start_gate.wait()
        while True:
            with lock:
                number = next(counter, None)
            if number is None or (duration is not None and time.perf_counter() >= deadline[0]):
                break
            data = make_request(number)
            started = time.perf_counter()
            try:
                if conn.sock is None:
                    conn.connect()
                    reconnects[index] += 1
                status, body, keep = conn.exchange(data)
            except OSError:
                errors[index] += 1
                conn.close()
                continue
            mine.append(time.perf_counter() - started)
            seen[status] += 1
            if check is not None:
                check(status, body)
            if not keep:
                conn.close()
        conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    deadline[0] = started + (duration or 0)
    start_gate.set()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    all_latencies = [value for part in latencies for value in part]
    return LoadResult(
        requests=len(all_latencies),
        seconds=seconds,
        statuses=sum(statuses, Counter()),
        latencies=all_latencies,
        errors=sum(errors),
        client_cpu_secs=(cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime),
        reconnects=sum(reconnects),
    )
