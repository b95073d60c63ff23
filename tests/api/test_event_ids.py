"""Event ids (evaluations/events/cursor.py): what a client sends back as Last-Event-ID, and that the
largest batch's fits gunicorn's header line (8190 bytes) with its real parser and a real batch."""

from __future__ import annotations

import httpx
import pytest

from evaluations.events import cursor
from evaluations.events.cursor import BadCursor, Position
from tests.helpers.http import request

GUNICORN_FIELD_LIMIT = 8190  # gunicorn's default limit_request_field_size


def test_a_batch_cursor_round_trips_run_length_encoded():
    positions = [Position(ended=True)] * 40 + [Position(7, 2), Position(1, 0), Position(1, 0)] + [Position(ended=True)]
    raw = cursor.batch_id(positions)
    assert raw == "d*40,7.2,1.0*2,d"
    assert [p.entry() for p in cursor.parse_batch(raw, 44)] == [p.entry() for p in positions]
    assert cursor.batch_id([Position(1, 0)] * 1000) == "1.0*1000"


@pytest.mark.parametrize(
    ("raw", "evaluations"),
    [
        ("1.0*3", 2),
        ("1.0*2,d", 2),
        ("1.0", 2),
        ("1.0*0,1.0", 1),
        ("x", 1),
        ("1.0.0", 1),
        ("d*", 1),
        ("1.0,,1.0", 2),
        ("-1.0", 1),
    ],
)
def test_a_bad_batch_cursor_is_refused(raw, evaluations):
    with pytest.raises(BadCursor):
        cursor.parse_batch(raw, evaluations)


@pytest.mark.parametrize("raw", ["", "1.2", "1.2.3.4", "a.b.c", "1.2.-3", "1" * 16 + ".0.0", " 1.2.3"])
def test_a_bad_evaluation_cursor_is_refused(raw):
    with pytest.raises(BadCursor):
        cursor.parse_evaluation(raw)


def test_an_evaluation_cursor_round_trips():
    assert cursor.evaluation_id(cursor.parse_evaluation("11.3.4096")) == "11.3.4096"


def worst_batch_cursor(evaluations: int) -> str:
    """No two neighbours alike (run-length saves nothing), each at the most transitions and MAX_TESTS tests."""
    return cursor.batch_id([Position(12, 1000 - n % 2) for n in range(evaluations)])


def test_a_thousand_evaluation_batch_cursor_fits_a_header_line_and_opens_its_stream(live_service):
    # MAX_BATCH_TASKS counts evaluations (tasks x attempts): 100 by default; 1000 here, ten times that.
    service = live_service(env={"MAX_BATCH_TASKS": "1000", "MAX_ATTEMPTS": "10", "MAX_OPEN_BATCHES": "1"})
    urls = [f"http://127.0.0.1:9/t{n}.tar.gz" for n in range(100)]
    reply = request(
        "POST", service.url("/batches"), json_body={"agent_code": "print(1)", "task_urls": urls, "attempts": 10}
    )
    assert reply.status == 202, reply.body
    batch_id = reply.json()["batch_id"]
    assert len(reply.json()["eval_ids"]) == 1000
    raw = worst_batch_cursor(1000)
    assert len(f"Last-Event-ID: {raw}") < GUNICORN_FIELD_LIMIT
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        with client.stream("GET", f"/batches/{batch_id}/events", headers={"Last-Event-ID": raw}) as response:
            assert response.status_code == 200
            assert next(response.iter_lines()) == ": open"
        # One entry too many is this stream's 400, not a cut-off header's.
        refused = client.get(f"/batches/{batch_id}/events", headers={"Last-Event-ID": raw + ",d"})
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_request"
        assert "1000" in refused.json()["detail"]
