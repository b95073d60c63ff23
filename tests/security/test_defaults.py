"""Containment III (SPEC §20): safe on a fresh machine with the README's command.

A fresh machine is this one with bubblewrap and the C compiler taken off ``PATH`` (a folder of links
to every system program but those). There, ``SANDBOX=auto`` (the default) must not run agent code
unsandboxed: ``run_worker``, ``serve`` and ``evaluate`` stop at start (exit 2, one sentence naming
the package); ``SANDBOX=none`` said explicitly starts them, and ``/status`` and the admin dashboard
say in words what runs agent code. ``bin/serve`` installs the packages itself as root with
apt-get (a stand-in apt-get here, which "installs" by linking the real programs into ``PATH``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from evaluations.models import WorkerHeartbeat
from evaluations.runtime.sandbox import SYSTEM_PATH
from tests.helpers.cli import EvaluateCli
from tests.helpers.http import request
from tests.helpers.polling import wait_for
from tests.helpers.service import PROJECT, LiveService
from tests.worker.test_containment import start

pytestmark = pytest.mark.slow

SANDBOX_PROGRAMS = ("bwrap", "cc", "gcc")  # gcc: the sandboxes' init, their egress relay too
REFUSAL = (
    "term-executor: configuration error: SANDBOX=auto but bubblewrap is not installed (bwrap: not found), "
    "and agent code does not run unsandboxed unless told to: install the bubblewrap package "
    "(apt-get install bubblewrap), or set SANDBOX=none to run it without a sandbox"
)


def uids() -> str:
    """Who runs commands, as the words say it: the uid range as root, else the service's uid."""
    if os.geteuid() != 0:
        return f"uid {os.geteuid()} (the service's own)"
    first, count = settings.EXECUTOR.sandbox_uid, settings.EXECUTOR.sandbox_uid_count
    return f"uids {first}-{first + count - 1} (one per evaluation)"


@pytest.fixture
def fresh_path():
    """A folder on PATH holding a link to every system program except bwrap and the C compiler."""
    folder = Path(tempfile.mkdtemp(prefix="te-fresh-bin-", dir="/tmp"))
    os.chmod(folder, 0o755)  # bwrap, once installed, is run from here as the sandbox uid
    for directory in SYSTEM_PATH.split(":"):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = folder / entry.name
            if entry.name in SANDBOX_PROGRAMS or link.exists() or link.is_symlink():
                continue
            if os.access(entry.path, os.X_OK) and not entry.is_dir():
                link.symlink_to(entry.path)
    assert all(shutil.which(name, path=str(folder)) is None for name in SANDBOX_PROGRAMS)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("command", ["run_worker", "serve"])
def test_without_bubblewrap_the_worker_and_serve_refuse_to_start(fresh_path, workspace_base, tmp_path, command):
    env = {"PATH": str(fresh_path), "SANDBOX": "auto", "DATA_DIR": str(tmp_path / "data"),
           "WORKSPACE_BASE": str(workspace_base)}  # fmt: skip
    result = start(command, env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines()[-1] == REFUSAL
    assert "started" not in result.stderr + result.stdout  # no worker, no gunicorn


def test_unset_sandbox_is_auto_and_refuses_too(fresh_path, workspace_base, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_")) and k != "SANDBOX"}
    env.update(PATH=str(fresh_path), DATA_DIR=str(tmp_path / "data"), WORKSPACE_BASE=str(workspace_base))
    result = subprocess.run([sys.executable, "manage.py", "run_worker"], cwd=PROJECT, env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == REFUSAL, result.stderr


@pytest.mark.database  # an EvaluateCli of its own, migrated
def test_without_bubblewrap_evaluate_refuses_to_start(fresh_path, tmp_path):
    cli = EvaluateCli(tmp_path / "cli", PATH=str(fresh_path), SANDBOX="auto").migrate()
    try:
        agent = PROJECT / "examples" / "calc" / "solve_agent.py"
        done = cli.evaluate("http://127.0.0.1:9/task.tar.gz", str(agent))
    finally:
        cli.close()
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == "CommandError: " + REFUSAL.split(": ", 2)[2]
    assert "evaluation " not in done.stdout  # nothing was created or run


def serve(service: LiveService, *argv: str) -> subprocess.Popen:
    """``argv`` (``manage.py serve`` or ``bin/serve``) started with the service's env, healthy."""
    process = subprocess.Popen(list(argv), cwd=PROJECT, env=service.env, stdout=subprocess.DEVNULL,
                               stderr=open(service.folder / "gunicorn.log", "ab"))  # fmt: skip
    service.gunicorn = process  # what wait_healthy watches
    service.processes.append(process)
    service.wait_healthy(timeout=90)
    wait_for(lambda: request("GET", service.url("/status")).json()["workers"] == 1, 30, what="the worker")
    return process


def stop(service: LiveService, process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    service.database.drop()


@pytest.mark.database  # a LiveService of its own
def test_sandbox_none_said_explicitly_starts_and_status_says_so(fresh_path, workspace_base, tmp_path):
    service = LiveService(tmp_path / "svc", env={"PATH": str(fresh_path), "SANDBOX": "none",
                                                 "WORKSPACE_BASE": str(workspace_base)})  # fmt: skip
    service.manage("migrate", "--noinput")
    process = serve(service, sys.executable, "manage.py", "serve")
    try:
        body = request("GET", service.url("/status")).json()
    finally:
        stop(service, process)
    assert body["sandbox"] == "none"
    assert body["sandbox_state"] == f"none: SANDBOX=none, agent code runs unsandboxed as {uids()}"
    assert any("without bubblewrap" in warning for warning in body["warnings"])


FAKE_APT_GET = """#!/bin/bash
# apt-get as a fresh machine has it: installing links the real programs into PATH.
echo "apt-get $*" >> {log}
if [ "$1" = install ]; then
  for package in "${{@:2}}"; do
    case "$package" in
      bubblewrap) ln -s {bwrap} {bin}/bwrap ;;
      gcc) ln -s {gcc} {bin}/gcc; ln -s {gcc} {bin}/cc ;;
    esac
  done
fi
"""
FAKE_APT_CACHE = """#!/bin/bash
echo "apt-cache $*" >> {log}
exit 100  # no package lists yet
"""


def fake_apt(fresh_path: Path, log: Path) -> None:
    values = {"log": log, "bin": fresh_path, "bwrap": shutil.which("bwrap"), "gcc": shutil.which("gcc")}
    for name, script in (("apt-get", FAKE_APT_GET), ("apt-cache", FAKE_APT_CACHE)):
        (fresh_path / name).unlink(missing_ok=True)
        (fresh_path / name).write_text(script.format(**values))
        (fresh_path / name).chmod(0o755)


@pytest.mark.database  # a LiveService of its own
@pytest.mark.skipif(os.geteuid() != 0, reason="bin/serve installs packages only as root")
def test_bin_serve_installs_the_sandbox_packages_and_runs_sandboxed(fresh_path, workspace_base, tmp_path):
    log = tmp_path / "apt.log"
    fake_apt(fresh_path, log)
    env = {"PATH": str(fresh_path), "SANDBOX": "auto", "WORKSPACE_BASE": str(workspace_base)}
    service = LiveService(tmp_path / "svc", env=env)
    process = serve(service, "bin/serve")
    try:
        body = request("GET", service.url("/status")).json()
    finally:
        stop(service, process)
    assert log.read_text().splitlines() == [
        "apt-cache show bubblewrap gcc libc6-dev",
        "apt-get update -qq",
        "apt-get install -y -qq --no-install-recommends bubblewrap gcc libc6-dev",
    ]
    assert body["sandbox"] == "bwrap"
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    assert body["sandbox_state"].startswith(f"{version}, {body['limits']['memory']}")
    installing = (service.folder / "gunicorn.log").read_text()
    assert "bin/serve: installing bubblewrap gcc libc6-dev (the sandbox's packages) with apt-get" in installing


@pytest.mark.parametrize("case", ["installed", "sandbox none", "not root"])
def test_bin_serve_installs_nothing_when_present_told_none_or_not_root(fresh_path, tmp_path, case):
    log = tmp_path / "apt.log"
    fake_apt(fresh_path, log)
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX"}
    env["PATH"] = str(fresh_path)
    owner = {}
    if case == "installed":
        for name in SANDBOX_PROGRAMS:
            (fresh_path / name).symlink_to(shutil.which(name))
    elif case == "sandbox none":
        env["SANDBOX"] = " None "
    elif os.geteuid() == 0:
        owner = {"user": 65534, "group": 65534, "extra_groups": []}
        os.chmod(tmp_path, 0o777)  # the log, were apt-get run
    else:
        pass  # not root already
    done = subprocess.run([str(PROJECT / "bin" / "sandbox-packages")], env=env, capture_output=True, text=True,
                          timeout=60, **owner)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not log.exists()


@pytest.mark.django_db
def test_the_admin_dashboard_shows_the_sandbox_in_words(admin_client):
    changelist = "/admin/evaluations/evaluation/"
    fields = {"hostname": "h", "pid": 1, "capacity": 4}
    WorkerHeartbeat.objects.create(worker_id="w1", sandbox="none", limits="monitor", **fields)
    board = admin_client.get(changelist).content.decode().split('id="evaluation-dashboard"', 1)[1]
    board = board.split("</div>", 1)[0]
    assert (
        '<p id="dashboard-sandbox" class="te-note">Sandbox: <span class="te-stale">'
        f"none: SANDBOX=none, agent code runs unsandboxed as {uids()}</span></p>"
    ) in board
    WorkerHeartbeat.objects.filter(worker_id="w1").update(sandbox="bwrap", limits="cgroup v1")
    board = admin_client.get(changelist).content.decode().split('id="dashboard-sandbox"', 1)[1].split("</p>", 1)[0]
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    assert f"<span>{version}, cgroup v1 memory+pids, commands run as {uids()}</span>" in board
