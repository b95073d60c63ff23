"""Why an evaluation must stop, and the one path a stop takes from its row to its commands.

1. Whatever stops a running evaluation writes its row first: DELETE, the
   TTL (reaper or worker), a worker shutting down and Ctrl-C in
   ``manage.py evaluate`` set ``cancel_requested`` and ``cancel_reason``; a
   reaper that finds the worker lost ends the row itself.
2. The evaluation's process watches its row (``watch_row``, every
   WATCH_SECS) and sets its ``CancelState``; the spawner's monitor sees the
   state within MONITOR_INTERVAL_MS and kills the running command.
3. Only the death of the worker itself is learned otherwise, from the end of
   the pipe the worker holds (worker/child.py): nobody is left to write a row.
"""

from __future__ import annotations

import enum
import logging
import threading

from django.db import connections

from evaluations.models import WORKER_LOST, Evaluation, Status

WATCH_SECS = 1.0
log = logging.getLogger(__name__)


class Stop(enum.IntEnum):
    """What stopped the evaluation; a higher value overrides a lower one."""

    CANCELLED = 1  # its row asked for it (the reason says who)
    WORKER_LOST = 2  # the worker that owns it died: it fails
    ENDED_ELSEWHERE = 3  # its row was ended by someone else (a reaper): nothing more is written


class CancelState:
    """One evaluation's stop, if any: set by the watchers, read by the pipeline and the monitors."""

    def __init__(self):
        self._lock = threading.Lock()
        self.stop: Stop | None = None
        self.reason = ""

    def set(self, stop: Stop, reason: str) -> None:
        with self._lock:
            if self.stop is None or stop > self.stop:
                self.stop, self.reason = stop, reason

    def is_set(self) -> bool:
        return self.stop is not None


def watch_row(eval_id: str, state: CancelState, done: threading.Event) -> None:
    """Until ``done``: set ``state`` from the evaluation's row (the one cancel path, see above).

    Runs in a thread of the evaluation's process, so a DELETE reaches the commands
    even when the worker is frozen or partitioned away.
    """
    try:
        while not done.wait(WATCH_SECS):
            try:
                row = (
                    Evaluation.objects.filter(id=eval_id)
                    .values_list("status", "cancel_requested", "cancel_reason")
                    .first()
                )
            except Exception:
                connections.close_all()
                continue  # the database is away: the next look may find it back
            if row is None or row[0] != Status.RUNNING:
                state.set(Stop.ENDED_ELSEWHERE, "ended elsewhere")
            elif row[1]:
                state.set(Stop.CANCELLED, row[2] or "cancelled")
    finally:
        connections.close_all()


def start_watching(eval_id: str, state: CancelState) -> threading.Event:
    """Start ``watch_row`` in a daemon thread; set the returned event to stop it."""
    done = threading.Event()
    threading.Thread(target=watch_row, args=(eval_id, state, done), name="watch-row", daemon=True).start()
    return done


__all__ = ["WATCH_SECS", "WORKER_LOST", "CancelState", "Stop", "start_watching", "watch_row"]
