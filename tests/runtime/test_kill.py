"""Escapees: setsid, double fork, a cleared environment. Nothing outlives a kill or a sweep."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from evaluations.runtime import killer
from evaluations.runtime.sandbox import InfoPipe
from tests.helpers.polling import wait_for
from tests.runtime.support import alive_with_cmdline, leftovers, tagged_alive


def _escapees(marker: str) -> str:
    """A script leaving three sleepers that left the process group, each another way."""
    return (
        f"setsid sleep 301.{marker} </dev/null >/dev/null 2>&1 &\n"  # own session and group
        f"( ( exec sleep 302.{marker} </dev/null >/dev/null 2>&1 ) & )\n"  # double fork: parent gone
        f"env -i setsid /bin/sleep 303.{marker} </dev/null >/dev/null 2>&1 &\n"  # no tag either
        "sleep 0.3\n"
    )


def _wait_for(predicate, timeout=2.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def _untagged(marker):
    return alive_with_cmdline("/bin/sleep", f"303.{marker}")


def test_escapees_left_after_a_normal_exit_are_killed_by_sweep(sp):
    marker = uuid.uuid4().int % 10**6
    result = sp.run(_escapees(marker) + "echo started")
    assert (result.exit_code, result.output) == (0, "started\n")
    if sp.sandboxed:
        # The command's exit ended the sandbox's pid namespace, and all inside it: run() waited
        # for its pid 1, which ends after the kernel has killed the rest (in a phase: its
        # sandbox was cleared when the exec ended). No sweep needed.
        assert not leftovers(sp.eval_id, sp.own)
        assert sp.spawner.sweep() == 0
    else:
        assert len(tagged_alive(sp.eval_id, sp.own)) == 2
        assert len(_untagged(marker)) == 1
        assert sp.spawner.sweep() == 3
    assert not tagged_alive(sp.eval_id, sp.own)
    assert not _untagged(marker)


def test_escapees_of_a_killed_command_die_before_run_returns(sp):
    marker = uuid.uuid4().int % 10**6
    result = sp.run(_escapees(marker) + "trap '' TERM; sleep 100", timeout_secs=1)
    assert result.limit == "timeout"
    assert not tagged_alive(sp.eval_id, sp.own)  # checked before any sweep
    assert not _untagged(marker)
    assert not leftovers(sp.eval_id, sp.own)


def test_a_background_process_holding_the_pipe_does_not_hold_run(sp):
    result = sp.run("sleep 60 & echo done")
    assert (result.exit_code, result.output) == (0, "done\n")
    assert result.duration_ms < 1500
    if sp.sandboxed:  # the pid namespace ended with the command, before run() returned
        assert not leftovers(sp.eval_id, sp.own)
    assert sp.spawner.sweep() == (0 if sp.sandboxed else 1)


def test_no_zombie_is_left_behind(sp):
    for _ in range(3):
        sp.run("for i in 1 2 3; do (sleep 0.1 &) ; done; setsid sleep 60 & sleep 0.3")
        sp.spawner.sweep()
    # A sandbox's pid 1 is reparented to us when bwrap exits: run() reaps it once it has ended.
    zombies = [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []
    assert killer.reap_orphans() == 0


def test_sweep_with_nothing_left_kills_nothing(sp):
    assert sp.run("true").exit_code == 0
    assert not leftovers(sp.eval_id, sp.own)
    assert sp.spawner.sweep() == 0


def test_sandboxed_sweeps_scan_only_once_a_sandbox_was_not_seen_to_end(bwrap_sp, monkeypatch):
    """Each sandbox seen to end proves its processes gone, so a sweep need not scan /proc;
    a sandbox that did not report its pid 1 leaves a doubt, and every later sweep scans."""
    scans = []
    real_scan = killer.evaluation_processes
    monkeypatch.setattr(killer, "evaluation_processes", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    marker = uuid.uuid4().int % 10**6
    assert bwrap_sp.run(_escapees(marker)).exit_code == 0
    assert bwrap_sp.spawner.sweep() == 0 and scans == []
    monkeypatch.setattr(InfoPipe, "sandbox_init", lambda self: None)  # as if bwrap died before reporting
    assert bwrap_sp.run("true").exit_code == 0
    assert bwrap_sp.spawner.sweep() == 0 and len(scans) == 1
    assert bwrap_sp.spawner.sweep() == 0 and len(scans) == 2
    # The sandbox whose pid 1 went unreported may still be exiting (seen under load: a bwrap
    # that was a zombie a moment later); what must not be is a process that stays.
    wait_for(lambda: not leftovers(bwrap_sp.eval_id), timeout=10, what="the sandbox's processes to end")
    assert not _untagged(marker)


def test_a_kill_never_hits_a_later_process_that_reused_the_pid():
    me = killer._stat(os.getpid())
    stale = dataclasses.replace(me, start=me.start - 1)  # "the process that had this pid before"
    assert stale.kill() is False  # and we are still here to say so
    gone = subprocess.Popen(["/bin/true"])
    gone.wait()
    assert killer.Proc(gone.pid, os.getpid(), False, 0, 0).kill() is False


def test_the_scan_reads_a_process_whose_name_has_spaces_and_parentheses():
    script = (
        "import ctypes, time; ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0); print(1, flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()
        proc = next(p for p in killer.processes() if p.pid == child.pid)
        assert (proc.ppid, proc.zombie, proc.kernel_thread) == (os.getpid(), False, False)
        assert proc.rss > 1024 * 1024
        assert Path(f"/proc/{child.pid}/comm").read_text() == "a) b (c\n"
    finally:
        child.kill()
        child.wait()


def test_the_scan_leaves_kernel_threads_out():
    kthreadd = killer._stat(2)  # the kernel's thread spawner, parent of every kernel thread
    assert kthreadd is not None and kthreadd.kernel_thread
    table = killer.processes()
    assert not any(p.kernel_thread or p.pid == 2 or p.ppid == 2 for p in table)
    assert os.getpid() in {p.pid for p in table} and 1 in {p.pid for p in table}


def test_the_report_pipe_closes_each_end_once(tmp_path):
    """Closing twice would close whatever file took the number meanwhile (another thread's)."""
    info = InfoPipe()
    info.close_write_end()
    with open(tmp_path / "other", "wb") as other:  # the lowest free number: the write end's
        info.close_write_end()
        info.close()
        info.close()
        other.write(b"still open")  # would raise EBADF had a close hit it
        other.flush()
    assert (tmp_path / "other").read_bytes() == b"still open"


def test_a_protected_child_is_never_counted_killed_or_reaped():
    helper = subprocess.Popen(["sleep", "30"])
    try:
        killer.protect(helper.pid)
        assert helper.pid not in {p.pid for p in killer.descendants()}
        helper.kill()
        assert _wait_for(lambda: killer._stat(helper.pid).exited)
        assert killer.reap_orphans() == 0  # its zombie is its Popen's to collect
        assert helper.wait(timeout=5) == -9
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()


def test_multiprocessing_helpers_are_not_taken_for_commands(tmp_path):
    """The resource tracker and the forkserver are this process's children, but not commands:
    killer finds their pids through multiprocessing's private names (docs/internals.md)."""
    script = (
        "import json\n"
        "from multiprocessing import forkserver, resource_tracker\n"
        "from evaluations.runtime import killer\n"
        "resource_tracker.ensure_running()\n"
        "forkserver.ensure_running()\n"
        "helpers = [resource_tracker._resource_tracker._pid, forkserver._forkserver._forkserver_pid]\n"
        "print(json.dumps({'helpers': helpers, 'foreign': sorted(killer._foreign_pids())}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=Path(killer.__file__).parents[2], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert all(found["helpers"]) and set(found["helpers"]) <= set(found["foreign"])


def test_reaping_beside_an_awaited_zombie_reads_this_process_children_not_the_host(monkeypatch):
    """A zombie of one of our threads' children (a helper thread's, the thread gone) is reaped,
    an awaited one (a command's, its Popen's to collect) is left, and only our children are read."""
    import threading

    killer.reap_orphans()  # what earlier tests left
    started = []
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "30"])))
    thread.start()
    thread.join()
    orphan = started[0]
    awaited = subprocess.Popen(["sleep", "30"])
    killer.adopt(awaited.pid)
    read: list = []
    scan = killer.processes
    monkeypatch.setattr(killer, "processes", lambda pids=None: read.append(pids) or scan(pids))
    try:
        assert {orphan.pid, awaited.pid} <= set(killer.own_children())
        orphan.kill()
        awaited.kill()
        assert _wait_for(lambda: killer._stat(orphan.pid).exited and killer._stat(awaited.pid).exited)
        assert killer.reap_orphans() >= 1  # (an earlier test's exiting sandbox may be among them)
        assert read and all(pids is not None for pids in read)  # never the whole host
        assert killer._stat(orphan.pid) is None  # reaped
        assert killer._stat(awaited.pid).exited  # still its Popen's
        assert awaited.wait(timeout=5) == -9
    finally:
        killer.release(awaited.pid)
        for proc in (orphan, awaited):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_without_children_files_reaping_scans_the_host(monkeypatch):
    real_open = open

    def no_children(path, *args, **kwargs):
        if str(path).endswith("/children"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    killer.reap_orphans()  # what earlier tests left
    monkeypatch.setattr("builtins.open", no_children)
    assert killer.own_children() is None
    orphan = subprocess.Popen(["true"])
    awaited = subprocess.Popen(["true"])
    killer.adopt(awaited.pid)
    try:
        assert _wait_for(lambda: killer._stat(orphan.pid).exited and killer._stat(awaited.pid).exited)
        assert killer.reap_orphans() >= 1  # (an earlier test's exiting sandbox may be among them)
        assert killer._stat(orphan.pid) is None
        assert awaited.wait(timeout=5) == 0
    finally:
        killer.release(awaited.pid)
