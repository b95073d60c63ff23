"""The admin in a real browser (Debian's chromium, headless) on a real service with real evaluations.

What an on-call engineer reads, asserted from the DOM at 1400 and 1024 px: the list fits with
no clipped column, the detail page's log opens at its end with each test under its name, a
10 MB output ships at most ~128 KiB inline, cancel and re-run are in the admin's history; the
sandboxes' list fits too, and a sandbox's page shows its execs (rows written in the service's
database: a live sandbox's own test is tests/sandboxes/).
TE_SHOTS_DIR=folder keeps the screenshots (tmp_path otherwise).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

from tests.helpers.archives import Exec
from tests.helpers.browser import browse
from tests.helpers.http import request
from tests.helpers.polling import evaluation, submit, wait_for, wait_terminal
from tests.helpers.tasks import ADD_TEST, NOOP, SOLVER

pytestmark = pytest.mark.slow

USER, PASSWORD = "ops", "browser-pw"
TESTS = {"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_echo.sh": Exec("#!/bin/bash\necho still-fine\n")}
# 10 MB in 100-byte lines, then the fix: the output is kept head and tail, the page ships its end.
FLOOD = "import sys\nblock = ('x' * 99 + '\\n') * 10000\nfor _ in range(10):\n    sys.stdout.write(block)\n" + SOLVER
SLOW = "import time\nprint('thinking', flush=True)\ntime.sleep(120)\n"
CHANGELIST = "/admin/evaluations/evaluation/"
SANDBOXES = "/admin/evaluations/sandbox/"
# Ended sandboxes as the API and their processes leave them (an ended one: no worker or reaper acts on it).
SANDBOX_ROWS = """
from datetime import timedelta
from django.utils import timezone
from evaluations.models import Sandbox, SandboxExec
now = timezone.now()
spec = {"environment": {"image": "registry.example.com/team/python-tools:3.12-bookworm-slim"},
        "network": {"mode": "allowlist", "allowed_hosts": ["pypi.org", "files.pythonhosted.org"]}}
env = {"kind": "image", "ref": spec["environment"]["image"], "digest": "sha256:" + "ab" * 32, "cached": False}
node = "https://executor-host-b.example.com:8443/"
stopped = Sandbox.objects.create(status="stopped", spec=spec, environment=env, network=spec["network"], node=node,
    created_at=now - timedelta(minutes=5), ready_at=now - timedelta(minutes=4), ended_at=now, exec_count=3)
for n, argv in enumerate([["/bin/sh", "-c", "pip install -r requirements.txt && pytest -x tests/" + "x" * 200],
                          ["python3", "-c", "print(1)"], ["sleep", "999"]], 1):
    SandboxExec.objects.create(sandbox=stopped, position=n, command=argv, cwd="/app", exit_code=[0, 0, 124][n - 1],
        timed_out=n == 3, duration_ms=1500 * n, user="nobody" if n == 2 else "")
failed = Sandbox.objects.create(status="failed", spec={**spec, "environment": {"task_url":
    "https://tasks.example.com/swe/django__django-11099.tar.gz"}}, node=node, ended_at=now,
    error="preparing_environment: the image's build failed at step 3 of 7: RUN apt-get install -y gcc (exit 100)",
    error_kind="task_invalid")
print(stopped.id, failed.id)
"""
INLINE_BUDGET = 128 * 1024
WHEN = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")


def detail(eval_id: str) -> str:
    return f"{CHANGELIST}{eval_id}/change/"


def at_end(log: dict) -> bool:
    return log["scrollTop"] + log["clientHeight"] >= log["scrollHeight"] - 2


def assert_fits(page: dict, width: int) -> None:
    assert page["viewport"] == width
    assert page["pageOverflow"] <= 0, page
    assert page["containerScroll"] <= 0 and page["tableRight"] <= width, page
    assert page["clippedCells"] == [], page["clippedCells"]


@pytest.fixture
def shots(tmp_path) -> Path:
    return Path(os.environ["TE_SHOTS_DIR"]) if os.environ.get("TE_SHOTS_DIR") else tmp_path / "shots"


def test_an_operator_reads_the_admin_in_a_browser(worker_service, tasks, shots):
    service = worker_service()
    service.env["DJANGO_SUPERUSER_PASSWORD"] = PASSWORD
    service.manage("createsuperuser", "--noinput", "--username", USER, "--email", "ops@example.com")
    ids = {
        "passed": submit(service, tasks.task(tests=TESTS), SOLVER),
        "failed": submit(service, tasks.task(tests=TESTS), NOOP),
        "flood": submit(service, tasks.task(tests=TESTS), FLOOD),
    }
    ended = {name: wait_terminal(service, eval_id, timeout=180) for name, eval_id in ids.items()}
    assert [ended[n]["status"] for n in ("passed", "failed", "flood")] == ["completed", "failed", "completed"]
    ids["slow"] = submit(service, tasks.task(tests=TESTS), SLOW)
    wait_for(lambda: evaluation(service, ids["slow"])["step"] == "running_agent", 90, what="the slow agent")

    def visit(name, path, probe, width=1400, **more):
        return {"name": name, "path": path, "probe": probe, "width": width, "shot": True, **more}

    first = browse(
        service.base_url,
        [
            visit("list-1400", CHANGELIST, "list", shot="full"),
            visit("list-1024", CHANGELIST, "list", 1024, shot="full"),
            visit("passed-1400", detail(ids["passed"]), "detail", shot="full"),
            visit("passed-1024", detail(ids["passed"]), "detail", 1024),
            visit("failed-1400", detail(ids["failed"]), "detail"),
            visit("flood-1400", detail(ids["flood"]), "detail", shot="full"),
            visit("flood-1024", detail(ids["flood"]), "detail", 1024),
            visit("slow-cancel", detail(ids["slow"]), "detail", click="form.te-tool button:text('Cancel')"),
        ],
        user=USER,
        password=PASSWORD,
        shots=shots,
    )
    pages = first["visits"]

    # The list: every column whole at 1400 px, and at 1024 px; short ids, tasks told apart, errors, elapsed time.
    assert_fits(pages["list-1400"], 1400)
    assert_fits(pages["list-1024"], 1024)
    listed = pages["list-1400"]
    assert listed["headers"][1:] == ["Id", "Status", "Passed", "Task", "Language", "Error", "Created (UTC)", "Time"]
    rows = {row["short_id"]: row for row in listed["rows"]}
    assert set(rows) == {eval_id[:8] for eval_id in ids.values()}
    assert len({row["task"] for row in rows.values()}) == 4  # four archives, one host
    assert all(re.fullmatch(r"task-[0-9a-f]{8}", row["task"]) for row in rows.values())
    assert rows[ids["passed"][:8]]["passed_text"] == "yes" and rows[ids["failed"][:8]]["passed_text"] == "no"
    running = rows[ids["slow"][:8]]
    assert (running["state"], running["passed_text"]) == ("running: running_agent", "pending")
    assert running["time"].endswith("so far")
    assert "tests failed" in rows[ids["failed"][:8]]["error_text"]
    assert WHEN.match(rows[ids["passed"][:8]]["created_short"] + " UTC")
    board = listed["dashboard"].lower()
    assert "pass rate" in board and "67 %" in board and "(2 of 3)" in board
    assert board.count("running") == 1  # once, as "running now"
    assert listed["siteLink"] is not None  # "View site" goes to /api/docs

    # A finished evaluation's page: neutral yes/no, times to the second, no duplicate captions, "none" when empty.
    passed = pages["passed-1400"]
    fields = passed["fields"]
    assert fields["Passed"] == "yes" and fields["Cancel requested"] == "no"
    for name in ("Created", "Started", "Finished"):
        assert WHEN.match(fields[name]), (name, fields[name])
    assert passed["booleanIcons"] == 0
    assert passed["inlineCaptions"] == []
    assert len(passed["headings"]) == len(set(passed["headings"])), passed["headings"]
    assert "Callback attempts" in passed["inlineEmpty"]
    assert [t["name"] for t in passed["tests"]] == ["fail_to_pass_add", "pass_to_pass_echo"]
    assert {t["timed_out_text"] for t in passed["tests"]} == {"no"}
    assert pages["failed-1400"]["fields"]["Passed"] == "no"
    assert pages["failed-1400"]["fields"]["Agent patch"] == "none"
    assert "tests failed" in pages["failed-1400"]["fields"]["Error"]

    # The log box: the stored log, opened at its end, each test under its name, the final status last.
    for name in ("passed-1400", "passed-1024", "failed-1400", "flood-1400", "flood-1024"):
        page = pages[name]
        assert page["logSource"] == "stored", name
        assert at_end(page["log"]), (name, page["log"]["scrollTop"], page["log"]["scrollHeight"])
        assert page["pageOverflow"] <= 0, name
    log = passed["log"]["text"]
    for marker in ("=== running_agent ===", "=== fail_to_pass_add ===", "add-ok", "=== pass_to_pass_echo ==="):
        assert marker in log, marker
    assert "--- fail_to_pass_add: passed (exit 0) ---" in log and "--- pass_to_pass_echo: passed (exit 0) ---" in log
    assert log.index("=== fail_to_pass_add ===") < log.index("add-ok") < log.index("=== pass_to_pass_echo ===")
    assert log.rstrip().endswith("=== completed ===")
    assert "--- fail_to_pass_add: failed (exit 1) ---" in pages["failed-1400"]["log"]["text"]
    assert pages["failed-1400"]["log"]["text"].rstrip().endswith("tests failed (fail_to_pass_add)")

    # 10 MB of output: the page ships at most ~128 KiB of it, the log box scrolls, and shows its end.
    flood = pages["flood-1400"]
    assert flood["preChars"] <= INLINE_BUDGET, flood["preChars"]
    assert flood["log"]["scrollHeight"] > flood["log"]["clientHeight"] and at_end(flood["log"])
    assert "are not shown here" in flood["logCaption"] and "Open the whole log" in flood["logCaption"]
    assert flood["log"]["text"].rstrip().endswith("=== completed ===")
    assert "=== fail_to_pass_add ===" in flood["log"]["text"]
    assert "Open the whole text" in flood["fields"]["Agent output (its end)"]

    # Cancel from the detail page: back on it, the worker told.
    assert pages["slow-cancel"]["url"].endswith(detail(ids["slow"]))
    assert wait_terminal(service, ids["slow"], timeout=60)["status"] == "cancelled"

    stopped_id, failed_id = service.manage("shell", "-c", SANDBOX_ROWS).stdout.splitlines()[-1].split()
    second = browse(
        service.base_url,
        [
            visit("slow-1400", detail(ids["slow"]), "detail", shot="full"),
            visit("slow-history", f"{CHANGELIST}{ids['slow']}/history/", "text"),
            visit("rerun", detail(ids["passed"]), "detail", click="form.te-tool button:text('Re-run')"),
            visit("index", "/admin/", "text"),
            visit("workers", "/admin/evaluations/workerheartbeat/", "text"),
            visit("sandboxes-1400", SANDBOXES, "list", shot="full"),
            visit("sandboxes-1024", SANDBOXES, "list", 1024, shot="full"),
            visit("sandbox-1400", f"{SANDBOXES}{stopped_id}/change/", "detail", shot="full"),
            visit("sandbox-1024", f"{SANDBOXES}{stopped_id}/change/", "detail", 1024),
        ],
        user=USER,
        password=PASSWORD,
        shots=shots,
    )
    pages = second["visits"]
    slow_log = pages["slow-1400"]["log"]["text"]
    assert "thinking" in slow_log and f"[killed: cancelled: cancelled by {USER} in the admin]" in slow_log
    assert slow_log.rstrip().endswith(f"=== cancelled ===\n␞ running_agent: cancelled by {USER} in the admin")
    assert pages["slow-1400"]["fields"]["Cancel requested"] == "yes"
    assert "Asked it to stop (it was running)." in pages["slow-history"]["text"]
    assert USER in pages["slow-history"]["text"]
    # Re-run from the detail page: the new evaluation's page, linked to its original.
    rerun = pages["rerun"]
    new_id = str(uuid.UUID(rerun["url"].rstrip("/").split("/")[-2]))
    assert new_id not in ids.values()
    assert rerun["fields"]["Re-runs"] == f"re-run of {ids['passed']}"
    assert "Re-run of" in pages["index"]["text"] or new_id[:8] in pages["index"]["text"]
    workers = pages["workers"]["text"]
    assert "alive" in workers and "stale" not in workers and "Delete" not in workers

    # The sandboxes: every column whole at 1400 and 1024 px; a sandbox's page, its execs oldest first.
    assert_fits(pages["sandboxes-1400"], 1400)
    assert_fits(pages["sandboxes-1024"], 1024)
    listed = pages["sandboxes-1400"]
    assert listed["headers"][1:] == [
        "Id", "Status", "Environment", "Node", "Created (UTC)", "Ready after", "Ended after", "Execs", "Error kind",
    ]  # fmt: skip
    rows = {row["short_id"]: row for row in listed["rows"]}
    assert set(rows) == {stopped_id[:8], failed_id[:8]}
    assert rows[failed_id[:8]]["environment_text"] == "django__django-11099"
    assert rows[failed_id[:8]]["error_kind_text"] == "task_invalid" and rows[failed_id[:8]]["ready_after"] == "-"
    assert rows[stopped_id[:8]]["node_text"] == "executor-host-b:8443"
    assert rows[stopped_id[:8]]["ready_after"] == "1 min 00 s" and rows[stopped_id[:8]]["ended_after"] == "5 min 00 s"
    assert "Sandboxes" in pages["index"]["text"]
    for name in ("sandbox-1400", "sandbox-1024"):
        page = pages[name]
        assert page["pageOverflow"] <= 0 and page["booleanIcons"] == 0 and page["inlineCaptions"] == [], name
        assert page["fields"]["Status"] == "stopped" and page["fields"]["Execs"].startswith("3 recorded"), name
        assert page["fields"]["Network"] == "allowlist: pypi.org, files.pythonhosted.org", name
        assert "Stop" not in page["buttons"], name  # ended
    assert WHEN.match(pages["sandbox-1400"]["fields"]["Ended"])
    assert "pip install -r requirements.txt" in pages["sandbox-1400"]["execs"][0]["command_text"]
    assert [e["exit_code_text"] for e in pages["sandbox-1400"]["execs"]] == ["0", "0", "124"]
    assert [e["timed_out_text"] for e in pages["sandbox-1400"]["execs"]] == ["no", "no", "yes"]

    # No page asked for something that is not there (favicon.ico included).
    assert first["failedRequests"] == [] and second["failedRequests"] == []
    home = request("GET", service.url("/"))
    assert home.status == 200 and b"/api/docs" in home.body
    icon = request("GET", service.url("/favicon.ico"))
    assert icon.status == 200 and icon.headers["Content-Type"] == "image/x-icon"
