"""Event streams (SPEC §18) over the live service (gunicorn's sync workers, streams handed to threads, + run_worker), with real clients:
httpx with httpx-sse, curl -N and a raw socket. No sleeps: every wait is on an event or a condition."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess

import httpx
import psutil
import pytest
from httpx_sse import connect_sse

from evaluations import signing
from tests.helpers.http import request
from tests.helpers.polling import submit, wait_for, wait_terminal
from tests.helpers.tasks import NOOP, SOLVER

pytestmark = pytest.mark.slow

# An agent that prints as it starts, then blocks until the evaluation is cancelled: a read of a pipe
# whose write end it holds itself never returns (no polling, nothing to wait out).
HELD = "import os\nprint('agent waiting', flush=True)\nreading, _writing = os.pipe()\nos.read(reading, 1)\n"


def stream(service, path, *, headers=None, stop=None, timeout=120.0):
    """The events of one connection (httpx-sse) as (id, event, data); ``stop(events)`` True drops it there."""
    events = []
    with httpx.Client(base_url=service.base_url, timeout=timeout) as client:
        with connect_sse(client, "GET", path, headers=headers or {}) as source:
            assert source.response.status_code == 200, source.response.read()
            assert source.response.headers["content-type"].startswith("text/event-stream")
            assert source.response.headers["cache-control"] == "no-cache"
            for sse in source.iter_sse():
                events.append((sse.id, sse.event, json.loads(sse.data)))
                if stop is not None and stop(events):
                    break
    return events


def expected_rows(body: dict, eval_id: str | None = None) -> tuple[list, list]:
    """The steps and tests a complete stream of this evaluation object must have sent, in order."""
    extra = {"eval_id": eval_id} if eval_id else {}
    steps = [{**extra, "step": t["step"], "status": t["status"], "at": t["at"]} for t in body["transitions"]]
    tests = [{**extra, **{k: r[k] for k in ("name", "kind", "passed", "exit_code")}} for r in body["test_results"]]
    return steps, tests


def of_kind(events, kind):
    return [data for _id, event, data in events if event == kind]


def assert_signed(service, document: dict) -> None:
    """done carries the signed object (SPEC §18): it verifies under the key /public-key lists."""
    keys = {k["key_id"]: k["public_key_pem"] for k in request("GET", service.url("/public-key")).json()["keys"]}
    public_key = signing.load_public_key(keys[document["signature"]["key_id"]].encode())
    assert signing.verify(document, public_key).valid


def assert_whole_evaluation(events, service, eval_id):
    """Every transition and test once, in order, then done with GET /evaluate/{id}'s body; nothing after."""
    body = request("GET", service.url(f"/evaluate/{eval_id}")).json()
    steps, tests = expected_rows(body)
    assert of_kind(events, "step") == steps
    assert of_kind(events, "test") == tests
    assert events[-1][:2] == ("done", "done") and events[-1][2] == body
    assert_signed(service, body)
    assert [e for e in events if e[1] == "done"] == [events[-1]]
    # The tests (if any ran) come before the step that ends the evaluation.
    kinds = [e[1] for e in events if e[1] != "log"]
    assert kinds[-2:] == ["step", "done"] and "test" not in kinds[kinds.index("step", len(kinds) - 2) :]


def test_an_evaluation_streams_every_step_and_test_then_done_and_resumes_after_a_drop(worker_service, tasks):
    service = worker_service()
    eval_id = submit(service, tasks.task(), SOLVER)
    first = stream(service, f"/evaluate/{eval_id}/events", stop=lambda events: len(events) == 3)
    assert [e[1] for e in first] == ["step"] * 3
    rest = stream(service, f"/evaluate/{eval_id}/events", headers={"Last-Event-ID": first[-1][0]})
    assert_whole_evaluation(first + rest, service, eval_id)
    ids = [e[0] for e in first + rest]
    assert ids[:3] == ["1.0.0", "2.0.0", "3.0.0"] and ids[-1] == "done"
    # A client that saw done is told to stop reconnecting; one that missed it gets only done.
    assert httpx.get(service.url(f"/evaluate/{eval_id}/events"), headers={"Last-Event-ID": "done"}).status_code == 204
    last_row = [e for e in first + rest if e[1] != "done"][-1][0]
    assert [e[1] for e in stream(service, f"/evaluate/{eval_id}/events", headers={"Last-Event-ID": last_row})] == [
        "done"
    ]


def curl_events(service, path, *headers: str) -> list[tuple[str, str, dict]]:
    """curl -N: the raw stream, parsed here (id/event/data lines, blank line ends an event)."""
    argv = ["curl", "-N", "-sS", "--max-time", "120", *sum((["-H", h] for h in headers), []), service.url(path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=130, check=True).stdout
    events = []
    for block in out.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if fields:
            events.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_follows_an_evaluation_with_its_log(worker_service, tasks):
    service = worker_service()
    eval_id = submit(service, tasks.task(), "print('héllo ✓ wörld' * 3000)\n" + SOLVER)
    events = curl_events(service, f"/evaluate/{eval_id}/events?logs=1")  # ends by itself after done
    assert_whole_evaluation(events, service, eval_id)
    logs = of_kind(events, "log")
    assert len(logs) > 3
    offset = 0
    for chunk in logs:  # contiguous, each chunk whole characters
        assert chunk["offset"] == offset
        offset += len(chunk["text"].encode())
    text = "".join(chunk["text"] for chunk in logs)
    assert text == request("GET", service.url(f"/evaluate/{eval_id}/logs")).body.decode()
    assert "héllo ✓ wörld" * 3000 in text and "=== completed ===" in text
    # Resuming from a log event's id sends the log from there on.
    middle = [e for e in events if e[1] == "log"][1]
    resumed = curl_events(service, f"/evaluate/{eval_id}/events?logs=1", f"Last-Event-ID: {middle[0]}")
    assert "".join(c["text"] for c in of_kind(resumed, "log")) == text.encode()[int(middle[0].split(".")[2]) :].decode()


def test_a_cancel_while_streaming_sends_the_cancelled_step_then_done(worker_service, tasks):
    service = worker_service()
    eval_id = submit(service, tasks.task(), HELD)

    def cancel_when_running_agent(events):
        if events[-1][2].get("step") == "running_agent":
            assert request("DELETE", service.url(f"/evaluate/{eval_id}")).status == 202
        return False

    events = stream(service, f"/evaluate/{eval_id}/events", stop=cancel_when_running_agent)
    assert_whole_evaluation(events, service, eval_id)
    assert events[-2][2]["status"] == "cancelled" and events[-1][2]["status"] == "cancelled"


def restart(service) -> None:
    """SIGTERM gunicorn and the worker, then start both again on the same data, database and port."""
    for process in service.processes:
        process.send_signal(signal.SIGTERM)
    for process in service.processes:
        process.wait(timeout=60)
    service.processes = []
    service.start()


def test_a_service_restart_mid_evaluation_ends_the_stream_at_once_and_the_client_resumes(worker_service, tasks):
    # A graceful stop that outlasts the wait below: only the stream ending at SIGTERM lets gunicorn exit in it.
    service = worker_service(SHUTDOWN_GRACE_SECS=1, GUNICORN_CMD_ARGS="--graceful-timeout 600")
    eval_id = submit(service, tasks.task(), HELD)
    events = stream(service, f"/evaluate/{eval_id}/events", stop=lambda e: e[-1][2].get("step") == "running_agent")
    held = httpx.Client(base_url=service.base_url, timeout=60)
    with connect_sse(held, "GET", f"/evaluate/{eval_id}/events", headers={"Last-Event-ID": events[-1][0]}) as source:
        lines = source.response.iter_lines()
        assert next(lines) == ": open"  # the stream is open and idle, the agent held
        service.gunicorn.send_signal(signal.SIGTERM)
        # The stream ended at SIGTERM: held, it would keep gunicorn for its graceful timeout (600 s).
        assert service.gunicorn.wait(timeout=60) == 0
        assert list(lines) == [""]  # the blank line after ": open", then the end: no event
    held.close()
    restart(service)  # the worker too: SHUTDOWN_GRACE_SECS=1 cancels the held evaluation
    rest = stream(service, f"/evaluate/{eval_id}/events", headers={"Last-Event-ID": events[-1][0]})
    assert_whole_evaluation(events + rest, service, eval_id)
    assert rest[-1][2]["status"] == "cancelled" and "shutting down" in rest[-1][2]["error"]


def test_a_batch_streams_each_evaluation_then_the_batch_and_resumes(worker_service, tasks):
    service = worker_service(MAX_CONCURRENT_EVALS=2)
    urls = [tasks.task() for _ in range(3)]
    reply = request("POST", service.url("/batches"), json_body={"agent_code": SOLVER, "task_urls": urls})
    assert reply.status == 202, reply.body
    batch_id, eval_ids = reply.json()["batch_id"], reply.json()["eval_ids"]
    assert request("GET", service.url(f"/batches/{batch_id}/events?logs=1")).status == 400
    first = stream(service, f"/batches/{batch_id}/events", stop=lambda events: len(events) == 7)
    rest = stream(service, f"/batches/{batch_id}/events", headers={"Last-Event-ID": first[-1][0]})
    events = first + rest
    for eval_id in eval_ids:
        body = request("GET", service.url(f"/evaluate/{eval_id}")).json()
        steps, tests = expected_rows(body, eval_id)
        assert [d for d in of_kind(events, "step") if d["eval_id"] == eval_id] == steps
        assert [d for d in of_kind(events, "test") if d["eval_id"] == eval_id] == tests
    assert events[-1][:2] == ("done", "done")
    assert events[-1][2] == request("GET", service.url(f"/batches/{batch_id}")).json()
    assert events[-1][2]["status"] == "completed" and events[-1][2]["finished"] == 3
    assert_signed(service, events[-1][2])
    assert events[-2][0] == "d*3"  # every evaluation ended and sent: the cursor says so in three bytes


def test_streams_beyond_max_event_streams_are_refused_and_a_closed_one_frees_its_slot(live_service):
    service = live_service(env={"MAX_EVENT_STREAMS": "2", "EVENT_KEEPALIVE_SECS": "1"})
    eval_id = request(
        "POST", service.url("/evaluate"), json_body={"task_url": "http://127.0.0.1:9/t.tar.gz", "agent_code": NOOP}
    ).json()["eval_id"]  # pending for good: no worker runs here
    path = service.url(f"/evaluate/{eval_id}/events")
    clients = [httpx.Client(timeout=30) for _ in range(3)]
    opened = [client.send(client.build_request("GET", path), stream=True) for client in clients[:2]]
    assert [r.status_code for r in opened] == [200, 200]
    refused = clients[2].get(path, headers={"Accept": "text/event-stream"})
    assert refused.status_code == 503 and refused.headers["content-type"] == "application/json"
    assert refused.json()["error"] == "at_capacity" and "MAX_EVENT_STREAMS" in refused.json()["detail"]
    assert int(refused.headers["Retry-After"]) >= 1
    # Keep-alive comments on an idle stream, one a second (EVENT_KEEPALIVE_SECS=1).
    lines = opened[0].iter_lines()
    head = [next(lines) for _ in range(10)]
    assert head[:4] == [": open", "", "id: 1.0.0", "event: step"] and head[5:] == [
        "",
        ": keep-alive",
        "",
        ": keep-alive",
        "",
    ]
    # The API answers while both streams are open (they hold no API thread).
    assert request("GET", service.url(f"/evaluate/{eval_id}")).status == 200
    opened[0].close()
    clients[0].close()
    wait_for(lambda: _opens(clients[2], path), timeout=30, what="the closed stream's slot to be free")
    for client in clients:
        client.close()


def _opens(client, path) -> bool:
    with client.stream("GET", path) as response:
        return response.status_code == 200


def test_errors_stay_json_and_tenants_see_only_their_own(live_service):
    service = live_service(env={"AUTH_TOKENS": "alice:a-token,bob:b-token"})
    alice, bob = {"Authorization": "Bearer a-token"}, {"Authorization": "Bearer b-token"}
    body = {"task_url": "http://127.0.0.1:9/t.tar.gz", "agent_code": NOOP}
    eval_id = request("POST", service.url("/evaluate"), json_body=body, headers=alice).json()["eval_id"]
    batch_id = request(
        "POST", service.url("/batches"), json_body={"agent_code": NOOP, "task_urls": [body["task_url"]]}, headers=alice
    ).json()["batch_id"]
    sse = {"Accept": "text/event-stream"}
    cases = [
        (f"/evaluate/{eval_id}/events", {}, 401, "unauthorized"),
        (f"/evaluate/{eval_id}/events", bob, 404, "not_found"),
        (f"/batches/{batch_id}/events", bob, 404, "not_found"),
        ("/evaluate/not-a-uuid/events", alice, 404, "not_found"),
        (f"/evaluate/{eval_id}/events", {**alice, "Last-Event-ID": "1.2"}, 400, "invalid_request"),
        (f"/evaluate/{eval_id}/events?logs=yes", alice, 400, "invalid_request"),
        (f"/batches/{batch_id}/events", {**alice, "Last-Event-ID": "1.0*2"}, 400, "invalid_request"),
        (f"/batches/{batch_id}/events", {**alice, "Last-Event-ID": "x"}, 400, "invalid_request"),
    ]
    for path, headers, status, code in cases:
        reply = request("GET", service.url(path), headers={**sse, **headers})
        assert (reply.status, reply.json()["error"]) == (status, code), (path, headers, reply.body)
        assert reply.headers["Content-Type"] == "application/json"
        if "Last-Event-ID" in headers:
            assert list(reply.json()["fields"]) == ["Last-Event-ID"]
    for path in (f"/evaluate/{eval_id}/events", f"/batches/{batch_id}/events"):  # HEAD would stream nothing for ever
        reply = httpx.head(service.url(path), headers=alice, timeout=30)
        assert reply.status_code == 405 and "GET" in reply.headers["Allow"]
    with httpx.Client(base_url=service.base_url, headers=alice, timeout=30) as client:
        with connect_sse(client, "GET", f"/batches/{batch_id}/events") as source:
            assert source.response.status_code == 200
        with client.stream("GET", f"/evaluate/{eval_id}/events", headers={"Last-Event-ID": "1.0.0"}) as response:
            assert response.status_code == 200 and next(response.iter_lines()) == ": open"


def gunicorn_rss(service) -> dict[int, int]:
    """RSS by pid of gunicorn's master and its workers."""
    master = psutil.Process(service.gunicorn.pid)
    return {p.pid: p.memory_info().rss for p in (master, *master.children())}


def test_a_client_that_stops_reading_is_dropped_and_costs_no_memory(worker_service, tasks):
    mib = 1024 * 1024
    service = worker_service(MAX_EVENT_STREAMS=1, EVENT_SEND_TIMEOUT_SECS=2, MAX_OUTPUT_BYTES=16 * mib)
    agent = "import sys\nfor i in range(16):\n    sys.stdout.write(chr(97 + i) * 1048575 + '\\n')\n" + HELD
    eval_id = submit(service, tasks.task(), agent)
    before = gunicorn_rss(service)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", service.port))
    sock.sendall(f"GET /evaluate/{eval_id}/events?logs=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = b""
    while b": open" not in head:  # the stream holds the slot; from here on the client reads nothing
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    path = service.url(f"/evaluate/{eval_id}/events")

    def slot_free() -> bool:
        with httpx.Client(timeout=30) as client, client.stream("GET", path) as response:
            return response.status_code == 200

    # The agent writes 16 MiB of log the client never takes: the stream blocks, times out, is dropped.
    wait_for(slot_free, timeout=120, interval=0.5, what="the stalled stream to be dropped")
    after = gunicorn_rss(service)
    # Growth of the processes there before: a web worker that had not forked yet when ``before`` was read
    # (a loaded machine starts them late) is a whole process, not what the stream cost (CI once counted one
    # as 71.6 MiB of growth). None of them may have ended: a replaced worker would hide what it had grown.
    assert set(before) <= set(after), f"gunicorn processes ended while the stream stalled: {set(before) - set(after)}"
    grown = sum(after[pid] - rss for pid, rss in before.items())
    assert grown < 8 * mib, f"gunicorn grew by {grown / mib:.1f} MiB for a client that stopped reading"
    sock.close()
    request("DELETE", service.url(f"/evaluate/{eval_id}"))
    assert wait_terminal(service, eval_id)["status"] == "cancelled"


def test_streams_hold_no_sync_worker_one_web_worker_serves_the_api_beside_five(live_service):
    """The body of each stream is written by a thread (executor_project/streamworker.py): with one
    sync worker and five streams open on it, the API still answers, and each stream still gets its events."""
    service = live_service(env={"EVENT_KEEPALIVE_SECS": "1"}, web_workers=1)
    eval_id = request(
        "POST", service.url("/evaluate"), json_body={"task_url": "http://127.0.0.1:9/t.tar.gz", "agent_code": NOOP}
    ).json()["eval_id"]  # pending for good: no worker runs here
    path = service.url(f"/evaluate/{eval_id}/events")
    clients = [httpx.Client(timeout=30) for _ in range(5)]
    try:
        opened = [client.send(client.build_request("GET", path), stream=True) for client in clients]
        assert [r.status_code for r in opened] == [200] * 5
        assert all(r.headers["connection"] == "close" and "content-length" not in r.headers for r in opened)
        for _ in range(3):
            assert request("GET", service.url(f"/evaluate/{eval_id}")).status == 200
        assert request("DELETE", service.url(f"/evaluate/{eval_id}")).status == 202
        for response in opened:  # every stream is served: the cancel, then done, then the end
            events = [line for line in response.iter_lines() if line.startswith("event: ")]
            assert events[-2:] == ["event: step", "event: done"]
    finally:
        for client in clients:
            client.close()
