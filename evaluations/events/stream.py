"""What an event stream reads and sends, and when (SPEC §18, docs/events.md).

1. A stream reads the rows when the hub wakes it (a writer announced a change of its
   evaluation or batch) and once per keep-alive tick besides, the safety net for a lost
   datagram; a log stream also polls its log file's size every LOG_POLL_SECS, which costs no query.
2. A stream keeps the thread's database connection from one read to the next while wakes come
   within IDLE_SECS of each other (a running evaluation's transitions come milliseconds apart: a
   connection opened and closed for each read cost the web worker more CPU than the read), and
   closes it once none came: 200 idle streams hold no connection.
3. Per evaluation, a read sends the new transitions that do not end it, then the new test
   results, then the ending one: the tests are committed before the evaluation ends, so a
   client sees them before its last step. The status is read before the rows, so an
   evaluation read as ended has every row of its visible; in a batch, one whose ending
   transition is among the rows read has ended too (it commits with the status, after the
   tests), and that transition's event id says so.
4. A log stream keeps the live log's file open once found: after the evaluation ends and its
   folder is removed, it still reads the tail it had not sent, at the offsets it was sending.
   One that never saw the file (it ended first, or runs on another host) sends the final log
   (livelog.final_log) from the cursor's offset, as GET /evaluate/{id}/logs does.
5. Nothing is buffered beyond the event being written: the server writes each one as it is
   yielded, with a send timeout (views set SO_SNDTIMEO), and a client that does not take it
   in time is dropped.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable

from django.db import connection

from evaluations import livelog
from evaluations.events import cursor
from evaluations.events.cursor import Position
from evaluations.events.hub import Subscription
from evaluations.events.slots import Slot
from evaluations.models import TERMINAL_STATUSES, Batch, Evaluation, TestResult, Transition
from evaluations.representation import iso

KEEPALIVE = b": keep-alive\n\n"
OPENING = b": open\n\n"  # sent at once: the client has its headers even when nothing happens yet
LOG_POLL_SECS = 0.2
LOG_CHUNK_BYTES = 64 * 1024
LOG_BURST = 16  # chunks per poll while the evaluation runs: the rows' events are not held back long
IDLE_SECS = 0.5  # the database connection kept between two reads this long at most (point 2)


def frame(event: str, event_id: str, data: dict) -> bytes:
    """One event. JSON escapes newlines, so ``data`` is one line whatever it holds."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"id: {event_id}\nevent: {event}\ndata: {body}\n\n".encode()


def _new_rows(eval_ids: list, positions: dict) -> tuple[dict, dict]:
    """The transitions and test results of these evaluations past each one's position."""
    transitions: dict = {e: [] for e in eval_ids}
    tests: dict = {e: [] for e in eval_ids}
    rows = Transition.objects.filter(evaluation_id__in=eval_ids).order_by("evaluation_id", "id")
    for eval_id, step, status, at in rows.values_list("evaluation_id", "step", "status", "at"):
        transitions[eval_id].append({"step": step, "status": status, "at": iso(at)})
    rows = TestResult.objects.filter(evaluation_id__in=eval_ids).order_by("evaluation_id", "position")
    for eval_id, name, kind, passed, exit_code in rows.values_list(
        "evaluation_id", "name", "kind", "passed", "exit_code"
    ):
        tests[eval_id].append({"name": name, "kind": kind, "passed": passed, "exit_code": exit_code})
    for eval_id in eval_ids:
        transitions[eval_id] = transitions[eval_id][positions[eval_id].transitions :]
        tests[eval_id] = tests[eval_id][positions[eval_id].tests :]
    return transitions, tests


def _ends(transitions: list) -> bool:
    return any(t["status"] in TERMINAL_STATUSES for t in transitions)


def _in_order(position: Position, transitions: list, tests: list, extra: dict, event_id: Callable[[], str]):
    """(event, id, data) of one evaluation's new rows: steps, tests, the ending step; ``position`` moves."""
    ending = [t for t in transitions if t["status"] in TERMINAL_STATUSES]
    for t in transitions:
        if t not in ending:
            position.transitions += 1
            yield "step", event_id(), {**extra, **t}
    for t in tests:
        position.tests += 1
        yield "test", event_id(), {**extra, **t}
    for t in ending:
        position.transitions += 1
        yield "step", event_id(), {**extra, **t}


class EvaluationFeed:
    """One evaluation's events from ``position`` on."""

    def __init__(self, eval_id, position: Position, *, logs: bool, workspace_base, done_body: Callable[[], dict]):
        self.eval_id = eval_id
        self.position = position
        self.logs = logs
        self.workspace_base = workspace_base
        self.done_body = done_body
        self.log_fd: int | None = None
        self.log_behind = False
        self.ended = False

    @property
    def keys(self) -> list:
        return [self.eval_id]

    def event_id(self) -> str:
        return cursor.evaluation_id(self.position)

    def read_rows(self) -> list[bytes]:
        status = Evaluation.objects.filter(id=self.eval_id).values_list("status", flat=True).first()
        transitions, tests = _new_rows([self.eval_id], {self.eval_id: self.position})
        frames = [
            frame(*e)
            for e in _in_order(self.position, transitions[self.eval_id], tests[self.eval_id], {}, self.event_id)
        ]
        self.ended = status in TERMINAL_STATUSES
        return frames

    def read_log(self):
        """The log's new bytes as events of at most LOG_CHUNK_BYTES, each read as the previous one
        was sent (a generator: one chunk in memory); up to LOG_BURST of them while the evaluation
        runs, all the rest once it ended. ``log_behind``: there is more to read now."""
        self.log_behind = False
        if not self.logs:
            return
        if self.log_fd is None and not self.ended:
            self.log_fd = livelog.open_session_log(self.workspace_base, self.eval_id)
        for n in itertools.count():
            if not self.ended and n == LOG_BURST:
                self.log_behind = True
                return
            if self.log_fd is not None:
                data = os.pread(self.log_fd, LOG_CHUNK_BYTES, self.position.log)
            elif self.ended:
                evaluation = Evaluation.objects.get(id=self.eval_id)
                data = livelog.final_log(evaluation).encode("utf-8", errors="replace")
                data = data[self.position.log : self.position.log + LOG_CHUNK_BYTES]
                connection.close()
            else:
                return
            if not self.ended:
                data = data[: len(data) - _incomplete_tail(data)]  # the rest of a character comes later
            if not data:
                return
            offset = self.position.log
            self.position.log += len(data)
            yield frame("log", self.event_id(), {"offset": offset, "text": data.decode("utf-8", errors="replace")})

    def done(self) -> bytes:
        return frame("done", cursor.DONE, self.done_body())

    def close(self) -> None:
        fd, self.log_fd = self.log_fd, None
        if fd is not None:
            os.close(fd)


class BatchFeed:
    """A batch's events: each evaluation's steps and tests (with its eval_id), then the batch object."""

    def __init__(self, batch_id, eval_ids: list, positions: list[Position], *, done_body: Callable[[], dict]):
        self.batch_id = batch_id
        self.eval_ids = eval_ids
        self.positions = dict(zip(eval_ids, positions, strict=True))
        self.done_body = done_body
        self.ended = False

    @property
    def keys(self) -> list:
        return [self.batch_id, *self.eval_ids]

    def event_id(self) -> str:
        return cursor.batch_id([self.positions[e] for e in self.eval_ids])

    def read_rows(self) -> list[bytes]:
        """Status first (batch, then evaluations), rows after: what reads as ended has all its rows visible."""
        finished = Batch.objects.filter(id=self.batch_id).values_list("finished_at", flat=True).first()
        open_ids = [e for e in self.eval_ids if not self.positions[e].ended]
        if not open_ids:
            self.ended = finished is not None
            return []
        statuses = dict(Evaluation.objects.filter(id__in=open_ids).values_list("id", "status"))
        transitions, tests = _new_rows(open_ids, self.positions)
        frames = []
        for eval_id in open_ids:
            position = self.positions[eval_id]
            # Its ending transition read (committed with its status, after its tests) says it ended
            # too: one that ended between the two reads has its last event marked so, not the next.
            ends = statuses.get(eval_id) in TERMINAL_STATUSES or _ends(transitions[eval_id])
            last = (position.transitions + len(transitions[eval_id]), position.tests + len(tests[eval_id]))

            def event_id(position=position, ends=ends, last=last) -> str:
                # An ended evaluation's last event already says so: the cursor stays short.
                position.ended = ends and (position.transitions, position.tests) == last
                return self.event_id()

            events = _in_order(position, transitions[eval_id], tests[eval_id], {"eval_id": str(eval_id)}, event_id)
            frames.extend(frame(*event) for event in events)
            position.ended = ends
        self.ended = finished is not None
        return frames

    logs = False
    log_behind = False

    def read_log(self):
        return iter(())

    def done(self) -> bytes:
        return frame("done", cursor.DONE, self.done_body())

    def close(self) -> None:
        pass


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` start a UTF-8 character it does not finish."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return back if need > back else 0
    return 0


class EventStream:
    """The response's body: gunicorn pulls each event from it as it writes; ``close`` (Django calls
    it when the response ends, sent, dropped or never started) frees the slot and the subscription."""

    def __init__(self, feed, subscription: Subscription, slot: Slot, keepalive_secs: float):
        self.feed = feed
        self.subscription = subscription
        self.slot = slot
        self.keepalive_secs = keepalive_secs
        self.events = self._events()

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        return next(self.events)

    def _events(self):
        feed, subscription = self.feed, self.subscription
        yield OPENING
        rows_due, sent_since_tick = True, False
        next_tick, read_at = time.monotonic() + self.keepalive_secs, 0.0
        while True:
            frames = []
            if rows_due:
                frames, read_at = feed.read_rows(), time.monotonic()  # on the connection ``_wait`` kept, if any
            yield from frames
            sent = len(frames)
            for chunk in feed.read_log():
                yield chunk
                sent += 1
            sent_since_tick = sent_since_tick or sent > 0
            if feed.ended and rows_due:  # the rows read as ended, the log drained: the last event
                try:
                    yield feed.done()
                finally:
                    connection.close()
                return
            now = time.monotonic()
            wait = next_tick - now
            if feed.logs:
                wait = 0.0 if feed.log_behind else min(wait, LOG_POLL_SECS)
            rows_due = _wait(subscription, max(0.0, wait), read_at)
            if subscription.stopping:
                return  # the process is stopping: the client resumes elsewhere with Last-Event-ID
            if time.monotonic() >= next_tick:
                if not sent_since_tick:
                    yield KEEPALIVE
                rows_due, sent_since_tick = True, False
                next_tick = time.monotonic() + self.keepalive_secs

    def close(self) -> None:
        self.events.close()
        connection.close()  # kept since the last read, if it was recent (``_wait``)
        self.subscription.close()
        self.feed.close()
        self.slot.release()


def _wait(subscription: Subscription, seconds: float, read_at: float) -> bool:
    """Whether the hub woke the stream within ``seconds``; the database connection kept until
    IDLE_SECS after the last read (``read_at``), closed once they pass without a wake (an idle
    stream holds none)."""
    if connection.connection is not None:
        kept = max(0.0, read_at + IDLE_SECS - time.monotonic())
        if seconds <= kept:
            return subscription.wait(seconds)
        if kept > 0 and subscription.wait(kept):
            return True
        connection.close()
        seconds -= kept
    return subscription.wait(seconds)
