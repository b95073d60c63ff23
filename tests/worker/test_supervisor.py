"""serve's supervisor (executor_project/supervisor.py) on its own: what serve execs into once it has
forked its two children, here with plain commands for children. serve's own run is in test_worker.py.

Each test starts a small parent that does what serve does around the exec (block the signals, fork
the children, which unblock them, exec the supervisor) and reads the children's pids from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.helpers.polling import wait_for
from tests.helpers.service import PROJECT

# argv: children as JSON {name: argv}, the stop timeout, the metrics folder, and what the parent does
# before it execs: "" (nothing), "sigterm" (a SIGTERM to itself, pending across the exec) or
# "exited-and-sigterm" (waits until every child has exited, without reaping them, then the same).
PARENT = """
import json, os, signal, sys
from executor_project import supervisor

specs, stop_timeout, metrics_dir, before = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, supervisor.SIGNALS)
children = {}
for name, argv in specs.items():
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        os.execvp(argv[0], argv)
    children[name] = pid
print(json.dumps(children), flush=True)
if before == "exited-and-sigterm":
    for pid in children.values():
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
if before in ("sigterm", "exited-and-sigterm"):
    os.kill(os.getpid(), signal.SIGTERM)
os.execv(sys.executable, supervisor.command(supervisor.arguments(children, float(stop_timeout), metrics_dir)))
"""

SLEEPER = ["sleep", "300"]
# Ignores SIGTERM (an ignored signal stays ignored across the exec): only SIGKILL stops it.
STUBBORN = ["sh", "-c", "trap '' TERM; exec sleep 300"]


class Supervised:
    def __init__(self, tmp_path, children: dict[str, list[str]], *, stop_timeout: float = 30, before: str = ""):
        self.metrics_dir = tmp_path / "prometheus" / "serve-1"
        self.metrics_dir.mkdir(parents=True)
        (self.metrics_dir / "counter_1.db").write_bytes(b"x")
        self.stderr_path = tmp_path / "stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", PARENT, json.dumps(children), str(stop_timeout), str(self.metrics_dir), before],
                cwd=PROJECT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.children = json.loads(self.process.stdout.readline())

    def wait_supervising(self) -> psutil.Process:
        """The supervisor, once it has named itself (it has blocked its signals long before)."""
        process = psutil.Process(self.process.pid)
        wait_for(lambda: process.name() == "te-serve", 30, what="the supervisor")
        return process

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def close(self) -> None:
        for pid in [self.process.pid, *self.children.values()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=30)


@pytest.fixture
def supervised(tmp_path):
    started = []

    def start(children, **options) -> Supervised:
        started.append(Supervised(tmp_path, children, **options))
        return started[-1]

    yield start
    for one in started:
        one.close()


def gone(pid: int) -> bool:
    """Exited and reaped: a pid the supervisor failed to reap would stay a zombie of its parent."""
    return not psutil.pid_exists(pid)


def test_a_child_that_exits_stops_the_other_and_the_supervisor_exits_1_saying_which(supervised):
    run = supervised({"gunicorn": SLEEPER, "worker": ["sh", "-c", "exit 3"]})
    assert run.process.wait(timeout=30) == 1
    assert run.stderr() == "serve: worker exited with code 3; stopped the rest\n"
    assert gone(run.children["gunicorn"]) and gone(run.children["worker"])
    assert not run.metrics_dir.exists()


def test_a_child_killed_by_a_signal_is_reported_with_its_negative_code(supervised):
    run = supervised({"gunicorn": SLEEPER, "worker": SLEEPER})
    run.wait_supervising()
    os.kill(run.children["gunicorn"], signal.SIGKILL)
    assert run.process.wait(timeout=30) == 1
    assert run.stderr() == "serve: gunicorn exited with code -9; stopped the rest\n"
    assert gone(run.children["worker"])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_stops_both_children_and_the_supervisor_exits_0(supervised, signum):
    run = supervised({"gunicorn": SLEEPER, "worker": SLEEPER})
    run.wait_supervising().send_signal(signum)
    assert run.process.wait(timeout=30) == 0
    assert run.stderr() == ""
    assert gone(run.children["gunicorn"]) and gone(run.children["worker"])
    assert not run.metrics_dir.exists()


def test_a_sigterm_that_comes_before_the_exec_is_not_lost(supervised):
    # Sent while serve (here its stand-in) is still to exec: blocked, so pending across the exec.
    run = supervised({"gunicorn": SLEEPER, "worker": SLEEPER}, before="sigterm")
    assert run.process.wait(timeout=30) == 0
    assert gone(run.children["gunicorn"]) and gone(run.children["worker"])
    assert not run.metrics_dir.exists()


def test_children_that_exit_on_the_stop_signal_as_with_ctrl_c_count_as_stopped(supervised):
    # Ctrl-C reaches the whole process group: the children may be gone before the supervisor takes
    # its own SIGINT. A stop, not a child that died first.
    run = supervised({"gunicorn": ["true"], "worker": ["true"]}, before="exited-and-sigterm")
    assert run.process.wait(timeout=30) == 0
    assert run.stderr() == ""


def test_a_child_that_ignores_sigterm_is_killed_after_the_stop_timeout(supervised):
    run = supervised({"gunicorn": STUBBORN, "worker": SLEEPER}, stop_timeout=1)
    stubborn = psutil.Process(run.children["gunicorn"])
    wait_for(lambda: stubborn.name() == "sleep", 30, what="the stubborn child to run sleep")
    run.wait_supervising().send_signal(signal.SIGTERM)
    assert run.process.wait(timeout=60) == 0
    assert gone(run.children["gunicorn"]) and gone(run.children["worker"])


def test_the_children_run_with_no_signal_blocked(supervised):
    run = supervised({"gunicorn": SLEEPER, "worker": SLEEPER})
    run.wait_supervising()
    for pid in run.children.values():
        assert blocked_signals(pid) == 0


def test_the_supervisor_holds_a_bare_interpreter_and_its_standard_descriptors(supervised):
    run = supervised({"gunicorn": SLEEPER, "worker": SLEEPER})
    supervisor = run.wait_supervising()
    assert sorted(int(fd) for fd in os.listdir(f"/proc/{supervisor.pid}/fd")) == [0, 1, 2]
    # No site, no Django: a Python process that imported Django holds ~70 MB resident (bench/RESULTS.md).
    assert supervisor.memory_info().rss < 15 << 20


def blocked_signals(pid: int) -> int:
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    return int(status["SigBlk"].strip(), 16)
