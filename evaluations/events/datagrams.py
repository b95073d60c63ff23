"""Datagram sockets in a folder: each receiver binds one there, a sender sends to every one.

The worker's wake-up (worker/wakeup.py) and the event streams' hubs (events/announce.py, hub.py)
use the same shape: best effort, nothing waits, a full queue or a dead receiver is skipped.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from evaluations.safefs import unix_address


def bind(folder: Path, name: str) -> socket.socket:
    """A non-blocking datagram socket bound as ``folder/name`` (the folder made, a stale file replaced)."""
    folder.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.unlink(name, dir_fd=folder_fd)
        except FileNotFoundError:
            pass
        sock.bind(unix_address(folder_fd, name))
    finally:
        os.close(folder_fd)
    return sock


@contextlib.contextmanager
def _sender(folder: Path) -> Iterator[tuple[int, socket.socket] | None]:
    """(``folder`` open, a non-blocking datagram socket) to send through, by the folder's descriptor
    (``unix_address``: a path of any length); None when the folder does not exist."""
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        yield folder_fd, sock
    finally:
        sock.close()
        os.close(folder_fd)


def send_to(folder: Path, name: str, data: bytes) -> None:
    """``data`` to the one socket ``folder/name``; nothing if nobody is bound there or its queue is full."""
    with _sender(folder) as opened:
        if opened is None:
            return
        folder_fd, sock = opened
        with contextlib.suppress(OSError):  # refused (gone) or full (awake anyway)
            sock.sendto(data, unix_address(folder_fd, name))


def send_to_each(folder: Path, data: bytes, *, suffix: str = ".sock", remove_refused: bool = False) -> None:
    """``data`` to every socket named ``*suffix`` in ``folder`` (none if it does not exist).
    ``remove_refused``: a socket nobody is bound to any more (its receiver died) is removed."""
    with _sender(folder) as opened:
        if opened is None:
            return
        folder_fd, sock = opened
        for name in os.listdir(folder_fd):
            if not name.endswith(suffix):
                continue
            try:
                sock.sendto(data, unix_address(folder_fd, name))
            except ConnectionRefusedError:
                if remove_refused:
                    try:
                        os.unlink(name, dir_fd=folder_fd)
                    except FileNotFoundError:
                        pass
            except OSError:
                pass  # its queue is full (that receiver is awake anyway), or it went away meanwhile
