"""A command's output: read as it comes, kept as head + tail, never more.

stdout and stderr share one pipe (``stderr=STDOUT``), so the kernel keeps
them in the order they were written and one fd is all there is to read. The
loop below also watches a pidfd, so it notices the command's exit even when
a background process it left behind still holds the pipe open.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from typing import BinaryIO

_CHUNK = 64 * 1024
# The executor's own lines in an evaluation's log start with this character (U+241E, SYMBOL FOR
# RECORD SEPARATOR); a command's output never carries it to the log: each occurrence is replaced
# with U+FFFD on the way (both are 3 bytes of UTF-8, so sizes and offsets do not move).
LOG_MARK = "\u241e"
_MARK = LOG_MARK.encode()
_NOT_MARK = "\ufffd".encode()
# After the command exits, how long to keep draining a pipe that a leftover
# background process still holds open. Normal commands close it as they exit.
_DRAIN_AFTER_EXIT_SECS = 0.2


class OutputCapture:
    """Keeps the first half of ``max_bytes``, a ring of the last half, and counts the rest.

    Memory is bounded by ``max_bytes`` plus one read chunk, whatever the
    command prints. The live log, when given, receives the same bytes as they
    arrive, up to ``max_bytes``, then one line saying it stopped; with LOG_MARK
    replaced, also when a read splits it (the bytes that may begin it wait for
    the next read, or for ``end_log``).
    """

    def __init__(self, max_bytes: int, live_log: BinaryIO | None = None):
        self.max_bytes = max_bytes
        self.total = 0
        self._head_cap = max_bytes // 2
        self._tail_cap = max_bytes - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self._log = live_log
        self._log_room = max_bytes
        self._held = b""  # the last bytes read, when they could begin LOG_MARK

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self._to_log(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            excess = len(self._tail) - self._tail_cap
            if excess > 0:
                del self._tail[:excess]  # cheap: bytearray drops from the front in place

    def _to_log(self, data: bytes) -> None:
        if self._log is None or self._log_room < 0:
            return
        data = (self._held + data).replace(_MARK, _NOT_MARK)
        held = next((n for n in (2, 1) if data.endswith(_MARK[:n])), 0)
        self._held = data[len(data) - held :]
        data = data[: len(data) - held]
        kept = data[: self._log_room]
        if kept:
            self._log.write(kept)
            self._log_room -= len(kept)
        if len(kept) < len(data):
            self._log.write(f"\n{LOG_MARK} [... live log stops after {self.max_bytes} bytes ...]\n".encode())
            self._log_room = -1  # stopped: one line says so, once

    def end_log(self) -> None:
        """The command ended: bytes held back were the start of a character that never came."""
        if self._held and self._log is not None and self._log_room >= 0:
            self._log.write(_NOT_MARK)
        self._held = b""

    @property
    def truncated(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def text(self) -> str:
        """Head + ``[... N bytes truncated ...]`` + tail, as ``as_text``."""
        if not self.truncated:
            return as_text(bytes(self._head + self._tail))
        return as_text(self._head) + f"\n[... {self.truncated} bytes truncated ...]\n" + as_text(self._tail)


def as_text(data: bytes) -> str:
    """What a command printed, as text every database stores: invalid UTF-8 and NUL (which
    PostgreSQL refuses in a text column) become U+FFFD. The one way output becomes text."""
    return data.decode("utf-8", errors="replace").replace("\0", "\ufffd")


def utf8_text(data: bytes, piece: int = 64 * 1024) -> bytes:
    """``as_text(data).encode()``: what a command printed as text, as UTF-8, without a str of the whole
    (up to 4 bytes a character, and encoded again to be stored: the kept log, issue 38).

    ``data`` is cut before a byte that starts a character (never inside a UTF-8 sequence, so each
    piece decodes as it does within the whole, invalid bytes included) and each piece goes through
    ``as_text``; the pieces it left as they were are views of ``data``, and ``data`` itself is
    returned when it left all of them (valid UTF-8 without NUL: the usual log).
    """
    view, pieces, changed, start = memoryview(data), [], False, 0
    while start < len(data):
        end = min(start + piece, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte: not a character's start
            end += 1
        chunk = data[start:end]
        text = as_text(chunk).encode()
        if text == chunk:
            pieces.append(view[start:end])
        else:
            pieces.append(text)
            changed = True
        start = end
    return b"".join(pieces) if changed else data


def pump(proc: subprocess.Popen, capture: OutputCapture, stdin_data: bytes | None) -> None:
    """Feed the command's stdin and capture its output until EOF (or exit + a short drain)."""
    pidfd = _pidfd(proc.pid)
    try:
        pump_fds(
            proc.stdout.fileno(),
            capture,
            stdin_fd=proc.stdin.fileno() if proc.stdin is not None else None,
            close_stdin=proc.stdin.close if proc.stdin is not None else None,
            stdin_data=stdin_data,
            exited=lambda: proc.poll() is not None,
            exit_fd=pidfd,
        )
    finally:
        if pidfd is not None:
            os.close(pidfd)
        if proc.stdin is not None and not proc.stdin.closed:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        proc.stdout.close()


def pump_fds(
    stdout_fd: int,
    capture: OutputCapture,
    *,
    stdin_fd: int | None,
    close_stdin: Callable[[], None] | None,
    stdin_data: bytes | None,
    exited: Callable[[], bool],
    exit_fd: int | None = None,
) -> None:
    """``pump`` over descriptors: ``exit_fd`` (a pidfd) becomes readable when the command exits;
    without one, ``exited`` is asked every 50 ms (an exec in a phase's sandbox, runtime/phase.py).
    ``close_stdin`` closes ``stdin_fd`` once ``stdin_data`` is written (at once when there is
    none); the caller closes ``stdout_fd``."""
    sel = selectors.DefaultSelector()
    sel.register(stdout_fd, selectors.EVENT_READ)
    if exit_fd is not None:
        sel.register(exit_fd, selectors.EVENT_READ)
    pending = memoryview(stdin_data or b"")
    if stdin_fd is not None:
        os.set_blocking(stdin_fd, False)
        if pending:
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            close_stdin()
            stdin_fd = None
    exited_at: float | None = None
    try:
        while True:
            if exited_at is None and exit_fd is None and exited():
                exited_at = time.monotonic()  # no pidfd: poll
            timeout = 0.05 if exit_fd is None else None
            if exited_at is not None:
                timeout = exited_at + _DRAIN_AFTER_EXIT_SECS - time.monotonic()
                if timeout <= 0:
                    return
            for key, _ in sel.select(timeout):
                if key.fd == stdout_fd:
                    data = os.read(stdout_fd, _CHUNK)
                    if not data:
                        return
                    capture.feed(data)
                elif key.fd == exit_fd:
                    exited_at = time.monotonic()
                    sel.unregister(exit_fd)
                else:
                    pending = _write_some(stdin_fd, pending)
                    if not pending:
                        sel.unregister(key.fd)
                        close_stdin()
                        stdin_fd = None
    finally:
        sel.close()
        if stdin_fd is not None:
            with contextlib.suppress(OSError):
                close_stdin()


def _write_some(fd: int, pending: memoryview) -> memoryview:
    try:
        written = os.write(fd, pending[:_CHUNK])
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[:0]  # the command stopped reading; the rest is dropped
    return pending[written:]


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
