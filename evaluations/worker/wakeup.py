"""Wake the worker when a row is written, instead of letting it poll.

On one host: every worker binds a datagram socket in DATA_DIR/wake/, and a
writer sends one byte to each. Across hosts on PostgreSQL: NOTIFY on
CHANNEL, which the worker LISTENs to. Both are best effort; the worker's
slow poll is the safety net.
"""

from __future__ import annotations

from pathlib import Path

from django.db import connection

from evaluations.events import datagrams

CHANNEL = "term_executor_wake"


def wake_dir(data_dir: Path) -> Path:
    return data_dir / "wake"


def notify(data_dir: Path) -> None:
    """Poke every worker on this host, and (PostgreSQL) every worker anywhere."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")
    datagrams.send_to_each(wake_dir(data_dir), b"!")


class WakeSocket:
    """The worker's end: a bound datagram socket to wait on with select/wait()."""

    def __init__(self, data_dir: Path, worker_id: str):
        self.path = wake_dir(data_dir) / f"{worker_id}.sock"
        self.sock = datagrams.bind(self.path.parent, self.path.name)

    def fileno(self) -> int:
        return self.sock.fileno()

    def poke(self) -> None:
        """Wake our own wait (a stop asked by a signal, whose handler runs while the wait goes on:
        Python retries an interrupted select)."""
        datagrams.send_to(self.path.parent, self.path.name, b"!")  # a path of any length

    def drain(self) -> None:
        while True:
            try:
                self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return

    def close(self) -> None:
        self.sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
