"""Containment II at the service level (SPEC §12): cgroups after a crash, /status, refused start-up."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from evaluations.runtime import cgroups
from tests.helpers.http import request
from tests.helpers.polling import evaluation, submit, wait_for
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow

needs_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or not cgroups.detect().enforced, reason="needs root and cgroups (v1 or v2)"
)


def cgroup_folders(eval_id: str) -> list[str]:
    """The evaluation's cgroup in every hierarchy (v1) or the unified one (v2), whatever the parent."""
    return glob.glob(f"/sys/fs/cgroup/*/term-executor-*/{eval_id}") + glob.glob(
        f"/sys/fs/cgroup/term-executor-*/{eval_id}"
    )


@needs_cgroups
def test_a_killed_workers_cgroups_are_removed_by_the_reaper(worker_service, tasks):
    service = worker_service(WORKER_STALE_SECS=2)
    eval_id = submit(service, tasks.task(), "import time; time.sleep(300)")
    wait_for(lambda: evaluation(service, eval_id)["step"] == "running_agent", 30, what="running_agent")
    wait_for(lambda: cgroup_folders(eval_id), 10, what="the evaluation's cgroup")
    # The worker, its forkserver and the evaluation process die at once: nobody cleans up.
    worker = psutil.Process(service.worker.pid)
    for proc in [worker, *worker.children(recursive=True)]:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass  # a command of the evaluation that ended meanwhile
    service.worker.wait()
    assert cgroup_folders(eval_id), "the crash left its cgroup (this test would prove nothing otherwise)"
    wait_for(lambda: "lost=1" in service.manage("reap_sessions").stdout, 20, what="the reaper to fail it as lost")
    wait_for(lambda: not cgroup_folders(eval_id), 20, what="the reaper to remove its cgroup")
    assert "cgroups_removed=0" in service.manage("reap_sessions").stdout  # idempotent


def test_status_says_how_limits_are_enforced(worker_service):
    service = worker_service()
    wait_for(lambda: request("GET", service.url("/status")).json()["workers"] == 1, 30, what="the worker")
    body = request("GET", service.url("/status")).json()
    expected = cgroups.detect().mode.value if os.geteuid() == 0 else "monitor"
    assert body["limits"] == {"memory": expected, "processes": expected}
    assert any("no cgroup" in w for w in body["warnings"]) == (expected == "monitor")


def start(command: str, env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    return subprocess.run(
        [sys.executable, "manage.py", command],
        cwd=PROJECT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def closed_folder():
    """A folder of mode 0700 (as /root is): nothing below it is reachable by the sandbox uids."""
    folder = Path(tempfile.mkdtemp(prefix="te-closed-", dir="/tmp"))
    os.chmod(folder, 0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs commands as other uids")
@pytest.mark.parametrize("variable", ["WORKSPACE_BASE", "STATIC_ASSETS_ROOT", "ENVIRONMENTS_ROOT"])
@pytest.mark.parametrize("command", ["run_worker", "serve"])
def test_a_folder_the_sandbox_uids_cannot_reach_stops_start_up(closed_folder, tmp_path, variable, command):
    inside = closed_folder / "inside"
    inside.mkdir(mode=0o755)
    result = start(command, {"DATA_DIR": str(tmp_path / "data"), "SANDBOX": "auto", variable: str(inside)})
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"term-executor: configuration error: {variable}: "), lines
    assert str(closed_folder) in lines[0]
    assert "chmod o+x" in lines[0]
    # Not a quiet fall back to no sandbox: nothing ran.
    assert "without a sandbox" not in result.stderr + result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs commands as other uids")
def test_a_data_dir_open_to_other_users_stops_start_up():
    data = Path(tempfile.mkdtemp(prefix="te-open-data-", dir="/tmp"))
    sessions = Path(tempfile.mkdtemp(prefix="te-sessions-", dir="/tmp"))
    try:
        os.chown(data, 65534, 65534)  # not ours: the service cannot close it itself
        os.chmod(data, 0o777)
        result = start("run_worker", {"DATA_DIR": str(data), "WORKSPACE_BASE": str(sessions)})
        assert result.returncode == 2, (result.stdout, result.stderr)
        line = result.stderr.strip()
        assert line.startswith("term-executor: configuration error: DATA_DIR: ") and "chmod 0700" in line
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(sessions, ignore_errors=True)


def test_a_bad_egress_rule_stops_start_up_naming_it(tmp_path):
    result = start("run_worker", {"DATA_DIR": str(tmp_path / "data"), "EGRESS_ALLOW": "pypi.org,10.0.0.1/8"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "term-executor: configuration error: EGRESS_ALLOW entry '10.0.0.1/8': has host bits set; "
        "did you mean 10.0.0.0/8?"
    )
