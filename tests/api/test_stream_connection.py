"""An event stream's database connection between two reads (events/stream.py, point 2): kept while
the hub's wakes come within IDLE_SECS of the last read, closed once that long passed without one.
The connection is a stand-in that records its closing: the test database of SQLite is in memory,
which Django never closes."""

from __future__ import annotations

import time

import pytest

from evaluations.events import stream


class Hub:
    """A subscription whose wakes are given in advance; records how long each wait was asked for."""

    def __init__(self, *wakes: bool):
        self.wakes = list(wakes)
        self.asked: list[float] = []

    def wait(self, seconds: float) -> bool:
        self.asked.append(seconds)
        return self.wakes.pop(0) if self.wakes else False


class Connection:
    def __init__(self):
        self.connection = object()  # open

    def close(self) -> None:
        self.connection = None


@pytest.fixture
def db(monkeypatch) -> Connection:
    kept = Connection()
    monkeypatch.setattr(stream, "connection", kept)
    return kept


def test_a_wake_soon_after_a_read_finds_the_connection_open(db):
    hub = Hub(True)
    assert stream._wait(hub, 15.0, time.monotonic())
    assert db.connection is not None and len(hub.asked) == 1 and hub.asked[0] <= stream.IDLE_SECS


def test_a_wait_shorter_than_the_idle_time_keeps_the_connection(db):
    """A log stream's poll (0.2 s) right after a read: the connection stays for the next read."""
    hub = Hub(False)
    assert not stream._wait(hub, 0.2, time.monotonic())
    assert db.connection is not None and hub.asked == [0.2]


def test_no_wake_within_the_idle_time_closes_the_connection_and_waits_the_rest(db):
    hub = Hub(False, True)
    assert stream._wait(hub, 15.0, time.monotonic())  # the wake came in the second part of the wait
    assert db.connection is None
    assert len(hub.asked) == 2 and hub.asked[0] <= stream.IDLE_SECS and sum(hub.asked) == pytest.approx(15.0)


def test_a_read_long_ago_closes_the_connection_before_the_wait(db):
    hub = Hub(False)
    assert not stream._wait(hub, 15.0, time.monotonic() - 60)
    assert db.connection is None and hub.asked == [15.0]


def test_without_a_connection_the_wait_is_one(db):
    db.close()
    hub = Hub(False)
    assert not stream._wait(hub, 15.0, time.monotonic())
    assert hub.asked == [15.0]
