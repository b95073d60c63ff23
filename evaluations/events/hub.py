"""One thread per web process that receives the writers' announcements and wakes the streams they concern.

1. Started with the process's first stream: a datagram socket in DATA_DIR/events/ (announce.py
   sends to every one there) and, on PostgreSQL, a LISTEN connection of its own for the writers
   on other hosts. One thread and at most one connection per process, however many streams.
2. A stream subscribes with the ids it follows (its evaluation; a batch and its evaluations) and
   waits on its own ``threading.Event``; the hub sets the events of the streams whose ids a
   datagram names, and no other: 200 idle streams do not all read the database at each change.
3. ``stop_streams`` (gunicorn's SIGTERM, gunicorn.conf.py) wakes every stream for good: they end
   at once instead of holding the graceful stop, and their clients resume with Last-Event-ID.
"""

from __future__ import annotations

import atexit
import logging
import os
import selectors
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

from django.db import connection

from evaluations.events import datagrams
from evaluations.events.announce import CHANNEL, SOCKET_SUFFIX, hub_dir

logger = logging.getLogger("term_executor.events")
MAX_DATAGRAM = 4096


class Subscription:
    def __init__(self, hub: Hub, keys: frozenset[str]):
        self.hub = hub
        self.keys = keys
        self.event = threading.Event()

    def wait(self, timeout: float) -> bool:
        """True when woken (a change, or the process stopping) within ``timeout`` seconds."""
        woken = self.event.wait(timeout)
        if not self.hub.stopping.is_set():
            self.event.clear()  # before the caller reads: a change announced from here on wakes it again
        return woken

    @property
    def stopping(self) -> bool:
        return self.hub.stopping.is_set()

    def close(self) -> None:
        self.hub.unsubscribe(self)


class Hub:
    def __init__(self, data_dir: Path):
        self.lock = threading.Lock()
        self.by_key: dict[str, set[Subscription]] = {}
        self.stopping = threading.Event()
        folder = hub_dir(data_dir)
        self.path = folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}{SOCKET_SUFFIX}"
        self.sock = datagrams.bind(folder, self.path.name)
        self.listener = _listen() if connection.vendor == "postgresql" else None
        atexit.register(self.close)
        threading.Thread(target=self.run, name="te-events-hub", daemon=True).start()

    def subscribe(self, keys: Iterable) -> Subscription:
        subscription = Subscription(self, frozenset(str(k) for k in keys))
        with self.lock:
            for key in subscription.keys:
                self.by_key.setdefault(key, set()).add(subscription)
        if self.stopping.is_set():
            subscription.event.set()
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self.lock:
            for key in subscription.keys:
                waiting = self.by_key.get(key)
                if waiting is not None:
                    waiting.discard(subscription)
                    if not waiting:
                        del self.by_key[key]

    def wake(self, keys: Iterable[str]) -> None:
        with self.lock:
            woken = {s for key in keys for s in self.by_key.get(key, ())}
        for subscription in woken:
            subscription.event.set()

    def stop(self) -> None:
        """Every stream, now and later, wakes and ends (the process is stopping)."""
        self.stopping.set()
        with self.lock:
            woken = {s for waiting in self.by_key.values() for s in waiting}
        for subscription in woken:
            subscription.event.set()

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ, self._datagrams)
        if self.listener is not None:
            selector.register(self.listener.fileno(), selectors.EVENT_READ, self._notifies)
        while True:
            try:
                for key, _mask in selector.select():
                    key.data()
            except Exception:  # the hub must outlive a bad datagram or a lost LISTEN connection
                logger.exception("event hub: ")
                if self.listener is not None and self.listener.closed:
                    selector.unregister(self.listener.fileno())
                    self.listener = None  # streams still wake on this host's datagrams and their ticks

    def _datagrams(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            self.wake(data.decode(errors="replace").split())

    def _notifies(self) -> None:
        for notify in self.listener.notifies(timeout=0):
            self.wake(notify.payload.split())

    def close(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def _listen():
    """LISTEN on a connection of the hub's own (autocommit), as the worker's listener does."""
    import psycopg

    conn = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


_hub: Hub | None = None
_hub_lock = threading.Lock()
_stopped = threading.Event()


def hub(data_dir: Path) -> Hub:
    """This process's hub, started at its first stream."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub(data_dir)
            if _stopped.is_set():
                _hub.stop()
        return _hub


def stop_streams() -> None:
    """gunicorn's SIGTERM (called from the signal handler: takes no lock the main thread could hold)."""
    _stopped.set()
    if _hub is not None:
        _hub.stop()
