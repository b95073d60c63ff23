"""Tailing an evaluation's log through the API while its agent prints slowly (gunicorn + run_worker)."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.archives import Exec
from tests.helpers.http import request
from tests.helpers.polling import submit, wait_terminal
from tests.helpers.tasks import ADD_TEST, SOLVER

pytestmark = pytest.mark.slow

TICKS = 8
SLOW_AGENT = (
    f"import time\nfor i in range({TICKS}):\n    print(f'tick {{i}}', flush=True)\n    time.sleep(0.4)\n"
) + SOLVER
# The tests step must last longer than the client's 0.1 s poll, or its marker may only show up
# in the final log: the step, its cleanup and the end can all fit between two polls.
SLOW_TEST = Exec(ADD_TEST.content.replace("#!/bin/bash\n", "#!/bin/bash\nsleep 0.5\n", 1))


def tail(service, eval_id, timeout=90):
    """GET .../logs from the last offset until complete; returns [(data, complete)] per non-empty reply."""
    offset, replies = 0, []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = request("GET", service.url(f"/evaluate/{eval_id}/logs?offset={offset}"))
        assert reply.status == 200, reply.body
        assert int(reply.headers["X-Log-Offset"]) == offset + len(reply.body)
        complete = reply.headers["X-Log-Complete"] == "true"
        if reply.body or complete:
            replies.append((reply.body.decode(), complete))
        if complete:
            return replies
        offset = int(reply.headers["X-Log-Offset"])
        time.sleep(0.1)
    raise AssertionError(f"the log never completed: {replies}")


def test_a_client_tails_the_live_log_while_the_agent_prints(worker_service, tasks):
    service = worker_service(LOG_FORMAT="json")
    eval_id = submit(service, tasks.task(tests={"fail_to_pass_add.sh": SLOW_TEST}), SLOW_AGENT)
    replies = tail(service, eval_id)
    whole = "".join(data for data, _complete in replies)
    # Each step's marker, then its commands' output, as it came. A step quicker than one poll
    # (the tests here) may only show up in the final chunk, so markers are checked on the whole.
    for marker in (
        "downloading_task",
        "preparing_environment",
        "cloning_repo",
        "installing_deps",
        "installing_agent",
        "running_agent",
        "running_tests",
    ):
        assert f"=== {marker} ===\n" in whole
    ticks = [f"tick {i}\n" for i in range(TICKS)]
    positions = [whole.index(tick) for tick in ticks]
    assert positions == sorted(positions) and whole.index("=== running_agent ===") < positions[0]
    with_ticks = [data for data, complete in replies if not complete and "tick" in data]
    assert len(with_ticks) >= 2, "the agent's output arrived in one piece: the log was not live"
    # Once ended: the stored log is the live log itself, so the offsets a client held carry on.
    final = request("GET", service.url(f"/evaluate/{eval_id}/logs"))
    assert final.headers["X-Log-Complete"] == "true"
    text = final.body.decode()
    assert text == whole  # the stored log is the live log: offsets a client held carry on
    assert wait_terminal(service, eval_id)["passed"] is True
    # LOG_FORMAT=json: every line a JSON object; the evaluation's lines carry its eval_id.
    lines = (service.folder / "worker.log").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    ours = [event for event in events if event.get("eval_id") == eval_id]
    assert any(event["logger"] == "term_executor.pipeline" and "finished completed" in event["msg"] for event in ours)
    assert any(event["logger"] == "term_executor.worker" for event in ours)  # "claimed", from the worker itself
    for event in events:
        if eval_id in event["msg"]:
            assert event.get("eval_id") == eval_id, event
    for line in (service.folder / "gunicorn.log").read_text().splitlines():
        assert json.loads(line)["level"]  # gunicorn's own lines too
