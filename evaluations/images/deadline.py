"""A pull's time (SPEC §21): its whole deadline, its evaluation's cancel, and how long a fetch may stall.

1. IMAGE_PULL_TIMEOUT_SECS bounds the whole pull: no socket waits longer than what is left, the
   time is checked between chunks and between layers, and while waiting for a layer another
   process is pulling (``waiting``).
2. A blob fetch that receives nothing for IMAGE_FETCH_STALL_SECS is given up: that is its
   socket's timeout. The error leaves the store's ``populate``, which releases the layer's lock,
   so the other pulls of that layer try for themselves instead of waiting on a slow registry.
3. A cancel (the evaluation's ``CancelState.is_set``) or the deadline is noticed within
   WATCH_SECS even while a read is blocked: a watcher thread shuts the pull's open connections
   down, so the read returns at once, and ``check`` then says why. A connection watched after
   that is shut as it is watched.
4. ``stop``: a layer of the pull failed, so the others (images/pull.py fetches several at once)
   end too: their connections are shut at once and their next ``check`` raises ``Stopped``.

All of these end the pull as ImageUnavailable (infrastructure): none is the task's fault. The
pipeline turns a pull that stopped for its cancel into the evaluation's own ending.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator

from evaluations.images.errors import ImageUnavailable


class Stopped(ImageUnavailable):
    """A layer given up because another layer of the same pull failed: that one's error is the pull's."""


WATCH_SECS = 0.25  # how soon a blocked read notices a cancel or the deadline
_LOCK_POLL_SECS = (0.01, 0.25)  # waiting for another process's layer: first and longest pause


class PullClock:
    """One pull's deadline and cancel; ``watch`` a connection while it is read from. Used as a context
    (``with``) its watcher runs; unused, ``check`` and the socket timeouts still hold."""

    def __init__(self, what: str, *, timeout_secs: float, stall_secs: float, cancelled: Callable[[], bool] | None):
        self.what = what
        self.timeout_secs, self.stall_secs = timeout_secs, stall_secs
        self.ends_at = time.monotonic() + timeout_secs
        self.cancelled = cancelled or (lambda: False)
        self._open: dict[http.client.HTTPConnection, socket.socket] = {}
        self._guard = threading.Lock()
        self._done = threading.Event()
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def of(cls, what: str, config, cancelled: Callable[[], bool] | None = None) -> PullClock:
        return cls(
            what,
            timeout_secs=config.image_pull_timeout_secs,
            stall_secs=config.image_fetch_stall_secs,
            cancelled=cancelled,
        )

    def left(self) -> float:
        return self.ends_at - time.monotonic()

    def check(self) -> None:
        """ImageUnavailable if the pull was cancelled or is past its deadline; Stopped if it was stopped."""
        if self.cancelled():
            raise ImageUnavailable(f"The pull of {self.what} was cancelled.")
        if self.left() <= 0:
            raise ImageUnavailable(
                f"The pull of {self.what} took longer than IMAGE_PULL_TIMEOUT_SECS ({self.timeout_secs} s)."
            )
        if self._stopped.is_set():
            raise Stopped(f"The pull of {self.what} stopped: another of its layers failed.")

    def stop(self) -> None:
        """End the pull's other work: every open connection shut, every later ``check`` raising."""
        self._stopped.set()
        with self._guard:
            for sock in self._open.values():
                _shut(sock)

    def _over(self) -> bool:
        return self._stopped.is_set() or self.cancelled() or self.left() <= 0

    def socket_timeout(self, longest: float) -> float:
        """A socket timeout of at most ``longest`` and what is left of the pull (never 0: that means
        non-blocking to a socket)."""
        return max(0.001, min(longest, self.left()))

    def waiting(self) -> Iterator[None]:
        """Pauses between tries of a lock another process holds; ``check`` before each."""
        pause = _LOCK_POLL_SECS[0]
        while True:
            self.check()
            yield
            time.sleep(min(pause, max(self.left(), 0)))
            pause = min(pause * 2, _LOCK_POLL_SECS[1])

    # -- the watcher ------------------------------------------------------------------------

    def __enter__(self) -> PullClock:
        self._watcher = threading.Thread(target=self._watch, name="pull-clock", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()

    def watch(self, conn: http.client.HTTPConnection) -> None:
        """Shut ``conn``'s socket down when the pull is cancelled or out of time, until ``unwatch``.
        Called once it is connected: its socket is kept here, because a response that closes the
        connection (HTTP/1.0, ``Connection: close``) takes it from ``conn`` while still reading it."""
        if conn.sock is not None:
            with self._guard:
                self._open[conn] = conn.sock
            if self._over():  # after the watcher's last look, or a stop: no read may block on it
                _shut(conn.sock)

    def unwatch(self, conn: http.client.HTTPConnection) -> None:
        with self._guard:
            self._open.pop(conn, None)

    def _watch(self) -> None:
        while not self._done.wait(WATCH_SECS):
            if self._over():
                with self._guard:
                    for sock in self._open.values():
                        _shut(sock)
                return


def _shut(sock: socket.socket) -> None:
    """End a read blocked on ``sock`` from another thread: shutdown (not close, which would leave the
    reader on a closed descriptor). The plain socket's shutdown also for TLS: SSLSocket.shutdown
    would drop its SSL object under the reader's feet."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
