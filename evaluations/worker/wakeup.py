"""Wake the worker when a row is written, instead of letting it poll.

On one host: every worker binds a datagram socket in DATA_DIR/wake/, and a
writer sends one byte to each. Across hosts on PostgreSQL: NOTIFY on
CHANNEL, which the worker LISTENs to. Both are best effort; the worker's
slow poll is the safety net.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from django.db import connection

from evaluations.safefs import unix_address

CHANNEL = "term_executor_wake"


def wake_dir(data_dir: Path) -> Path:
    return data_dir / "wake"


def notify(data_dir: Path) -> None:
    """Poke every worker on this host, and (PostgreSQL) every worker anywhere."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")
    try:
        folder = os.open(wake_dir(data_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        for name in os.listdir(folder):
            if name.endswith(".sock"):
                try:
                    sock.sendto(b"!", unix_address(folder, name))
                except OSError:
                    pass  # a dead worker's socket, or its queue is full: it is awake anyway
    finally:
        sock.close()
        os.close(folder)


class WakeSocket:
    """The worker's end: a bound datagram socket to wait on with select/wait()."""

    def __init__(self, data_dir: Path, worker_id: str):
        folder = wake_dir(data_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{worker_id}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.sock.bind(unix_address(folder_fd, self.path.name))
        finally:
            os.close(folder_fd)

    def fileno(self) -> int:
        return self.sock.fileno()

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
