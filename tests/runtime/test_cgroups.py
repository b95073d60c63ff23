"""The evaluation's cgroup on this host's real cgroups (v1 here, v2 where that is what the host has).

As root only; skipped without root or cgroups, a failure with ``REQUIRE_SANDBOX=1``
(as in CI). Each test's cgroups live under a parent of its own, removed at the end.
Figures are read from the kernel's files by the tests themselves where it matters.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from evaluations.runtime import cgroups
from evaluations.runtime.cgroupfs import Mounts, probe
from tests.runtime.support import MIB, UID

PROJECT = Path(__file__).resolve().parents[2]
BOUND_SECS = 30  # every wait below ends by then


def new_id() -> str:
    return f"eval-{uuid.uuid4().hex[:8]}"


def wait_until(condition, what: str):
    deadline = time.monotonic() + BOUND_SECS
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {BOUND_SECS} s: {what}")
        time.sleep(0.02)
    return value


def gone(pid: int) -> bool:
    """Ended (a zombie no one has reaped yet counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def cgroup_lines(pid: int) -> dict[str, str]:
    """/proc/PID/cgroup as {controller or "": path}."""
    lines = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") or [""]:
            lines[controller] = path
    return lines


def in_cgroup(pid: int, cgroup: cgroups.EvalCgroup) -> bool:
    """/proc/PID/cgroup names the evaluation's folder in every hierarchy we made it in."""
    lines = cgroup_lines(pid)
    suffix = f"/{next(iter(cgroup.support.parents.values())).name}/{cgroup.eval_id}"
    wanted = [""] if cgroup.support.mode is cgroups.CgroupMode.V2 else list(cgroup.dirs)
    return all(lines.get(name, "").endswith(suffix) for name in wanted)


def test_detect_says_what_this_host_has(support):
    unified = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    hybrid = os.path.ismount("/sys/fs/cgroup/memory") and os.path.ismount("/sys/fs/cgroup/pids")
    if hybrid and not (unified.exists() and "memory" in unified.read_text().split()):
        assert support.mode is cgroups.CgroupMode.V1
        assert {"memory", "pids"} <= set(support.parents)
        assert support.parents["memory"] == Path("/sys/fs/cgroup/memory") / support.parents["memory"].name
    assert support.status() == {"memory": support.mode.value, "processes": support.mode.value}
    assert support.warning is None
    assert all(str(folder) in support.detail for folder in support.parents.values())
    assert cgroups.detect(support.parents["memory" if "memory" in support.parents else "unified"].name) == support


def test_a_command_joined_by_the_prefix_runs_in_the_cgroup_after_the_uid_switch(support):
    cgroup = cgroups.EvalCgroup.create(new_id(), 256 * MIB, 50, support=support)
    # The lead's order: join (as root), then setpriv to the sandbox uid, then the command.
    as_uid = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--"] if UID else []
    proc = subprocess.Popen([*cgroup.join_prefix(), *as_uid, "sh", "-c", "sleep 60 & wait"])
    try:
        wait_until(lambda: len(cgroup.pids()) == 2, "the command and its child in the cgroup")
        for pid in cgroup.pids():
            assert in_cgroup(pid, cgroup), cgroup_lines(pid)
            if UID:
                assert os.stat(f"/proc/{pid}").st_uid == UID
        assert proc.pid in cgroup.pids()
        assert cgroup.usage().processes == 2
    finally:
        cgroup.remove()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_a_command_that_cannot_join_does_not_run(support, tmp_path):
    cgroup = cgroups.EvalCgroup.create(new_id(), 256 * MIB, 50, support=support)
    prefix = cgroup.join_prefix()
    assert cgroup.remove()
    marker = tmp_path / "ran"
    result = subprocess.run([*prefix, "touch", str(marker)], capture_output=True, text=True)
    assert result.returncode == cgroups.JOIN_FAILED_EXIT
    assert "term-executor: cannot join cgroup" in result.stderr
    assert not marker.exists()


def test_a_burst_allocation_by_many_processes_stops_at_the_limit(support):
    limit = 256 * MIB
    cgroup = cgroups.EvalCgroup.create(new_id(), limit, 100, support=support)
    # Eight processes each touch 64 MiB at once (512 MiB together) and hold it.
    child = "python3 -c \"x = b'x' * (64 * 2**20); import time; time.sleep(2); print('kept')\""
    burst = f"for i in 1 2 3 4 5 6 7 8; do {child} & done; wait"
    result = subprocess.run([*cgroup.join_prefix(), "sh", "-c", burst], capture_output=True, text=True, timeout=120)
    peak = int(cgroup.dirs.get("memory", cgroup.dirs.get("unified")).joinpath(_peak_file(support)).read_text())
    assert 0 < peak <= limit * 1.05
    assert result.stdout.count("kept") < 8  # some were killed: together they could not fit
    assert cgroup.oom_killed() and cgroup.oom_kills() >= 1
    assert cgroup.peak_memory_bytes() == peak
    reported = re.fullmatch(r"memory limit exceeded \(peak (\d+) MiB > 256 MiB\)", cgroup.oom_message())
    assert reported and int(reported[1]) == -(-peak // MIB)
    assert cgroup.remove()


def _peak_file(support) -> str:
    return "memory.max_usage_in_bytes" if support.mode is cgroups.CgroupMode.V1 else "memory.peak"


# Never a bomb outside a cgroup with the limit: it checks first, and stops by itself after 60 s.
FORK_BOMB = """
import os, sys, time
cgroup, pids_max, limit = sys.argv[1:]
assert cgroup in open('/proc/self/cgroup').read() and open(pids_max).read().strip() == limit
deadline = time.time() + 60
while time.time() < deadline:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""


def test_a_fork_bomb_stops_at_the_process_limit_and_is_killed_through_the_cgroup(support):
    max_processes = 40
    cgroup = cgroups.EvalCgroup.create(new_id(), 512 * MIB, max_processes, support=support)
    pids_dir = cgroup.dirs.get("pids", cgroup.dirs.get("unified"))
    bomb = [sys.executable, "-c", FORK_BOMB, f"/{cgroup.eval_id}", str(pids_dir / "pids.max"), str(max_processes)]
    proc = subprocess.Popen([*cgroup.join_prefix(), *bomb])
    try:
        wait_until(lambda: cgroup.process_limit_hits() > 0, "forks refused at pids.max")
        assert int((pids_dir / "pids.current").read_text()) <= max_processes
        assert cgroup.peak_processes() == max_processes
        members = cgroup.pids()
        assert len(members) > max_processes // 2
        assert cgroup.kill() >= len(members)
        assert cgroup.pids() == []
        wait_until(lambda: all(gone(pid) for pid in members), "every member ended")
    finally:
        assert cgroup.remove()
        proc.wait()
    assert not any(folder.exists() for folder in cgroup.dirs.values())


# 11 processes: sh, three setsid groups of sh and two sleeps, one more sleep.
ESCAPEES = "for i in 1 2 3; do setsid sh -c 'sleep 300 & sleep 300 & wait' & done; sleep 300 & wait"


def test_kill_empties_the_cgroup_and_remove_removes_it_twice_safely(support):
    cgroup = cgroups.EvalCgroup.create(new_id(), 256 * MIB, 100, support=support)
    proc = subprocess.Popen([*cgroup.join_prefix(), "sh", "-c", ESCAPEES], start_new_session=True)
    wait_until(lambda: len(cgroup.pids()) == 11, "all eleven processes")
    members = cgroup.pids()
    assert cgroup.kill() == 11
    assert cgroup.pids() == []
    proc.wait(timeout=BOUND_SECS)
    wait_until(lambda: all(gone(pid) for pid in members), "every member ended, the setsid ones too")
    assert cgroup.remove()
    assert not any(folder.exists() for folder in cgroup.dirs.values())
    assert cgroup.remove()  # idempotent
    assert cgroup.kill() == 0


def test_cpu_seconds_count_processes_that_already_exited(support):
    cgroup = cgroups.EvalCgroup.create(new_id(), 256 * MIB, 50, support=support)
    spin = "import time\nwhile time.process_time() < 0.3: pass"
    subprocess.run([*cgroup.join_prefix(), sys.executable, "-c", spin], check=True, timeout=120)
    figures = cgroup.figures()
    if figures.cpu_seconds is None:
        assert "cpuacct" not in cgroup.dirs  # v1 without cpuacct: the spawner counts from its processes
    else:
        assert 0.3 <= figures.cpu_seconds < 60
    assert figures.peak_processes >= 1 and figures.peak_memory_bytes > 0 and figures.oom_kills == 0
    assert cgroup.remove()


HOLDER = """
import subprocess, sys, time
from evaluations.runtime import cgroups, killer
from evaluations.runtime.cgroupfs import probe, read_mounts
support = probe(read_mounts(), sys.argv[1])
cgroup = cgroups.EvalCgroup.create(sys.argv[2], 128 * 2**20, 20, support=support)
sleeper = subprocess.Popen([*cgroup.join_prefix(), "sleep", "300"], start_new_session=True)
print(sleeper.pid, flush=True)
time.sleep(300)
"""


def test_the_cgroups_of_a_sigkilled_holder_are_removed_by_remove_stale(support):
    live = cgroups.EvalCgroup.create(new_id(), 128 * MIB, 20, support=support)
    stale_id = new_id()
    parent = next(iter(support.parents.values())).name
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, parent, stale_id], cwd=PROJECT, stdout=subprocess.PIPE, text=True
    )
    sleeper = int(holder.stdout.readline())
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()
    assert not gone(sleeper)  # the worker died; what it started did not
    assert cgroups.stale_cgroups([live.eval_id], support=support) == [stale_id]
    assert cgroups.remove_stale([live.eval_id], support=support) == [stale_id]
    wait_until(lambda: gone(sleeper), "the stale cgroup's process ended")
    assert not any((folder / stale_id).exists() for folder in support.parents.values())
    assert all(folder.exists() for folder in live.dirs.values())
    assert cgroups.stale_cgroups([live.eval_id], support=support) == []
    assert live.remove()


def test_create_replaces_a_cgroup_left_by_an_earlier_attempt(support):
    eval_id = new_id()
    first = cgroups.EvalCgroup.create(eval_id, 128 * MIB, 20, support=support)
    proc = subprocess.Popen([*first.join_prefix(), "sleep", "300"])
    wait_until(lambda: first.pids(), "the first attempt's process")
    second = cgroups.EvalCgroup.create(eval_id, 64 * MIB, 10, support=support)
    proc.wait(timeout=BOUND_SECS)
    assert second.pids() == []
    assert second.memory_limit_bytes == 64 * MIB
    assert second.remove()


@pytest.mark.parametrize("eval_id", ["", "../x", "a/b", ".hidden", "-x", "service", "x" * 200, "a b"])
def test_names_that_are_not_a_plain_folder_are_refused(support, eval_id):
    with pytest.raises(ValueError, match="not usable as a cgroup name"):
        cgroups.EvalCgroup.create(eval_id, 128 * MIB, 20, support=support)
    assert cgroups.stale_cgroups([], support=support) == []


@pytest.mark.parametrize(("memory", "processes"), [(0, 20), (128 * MIB, 0), (-1, 20)])
def test_limits_that_are_not_positive_are_refused_and_leave_nothing(support, memory, processes):
    with pytest.raises(ValueError, match="limits must be positive"):
        cgroups.EvalCgroup.create(new_id(), memory, processes, support=support)
    assert cgroups.stale_cgroups([], support=support) == []


def test_swap_is_zero_and_the_kernel_oom_killer_stays_on(support):
    cgroup = cgroups.EvalCgroup.create(new_id(), 128 * MIB, 20, support=support)
    if support.mode is cgroups.CgroupMode.V1:
        memory = cgroup.dirs["memory"]
        assert int((memory / "memory.limit_in_bytes").read_text()) == 128 * MIB
        if (memory / "memory.memsw.limit_in_bytes").exists():
            assert int((memory / "memory.memsw.limit_in_bytes").read_text()) == 128 * MIB
        assert "oom_kill_disable 0" in (memory / "memory.oom_control").read_text()
        assert int((cgroup.dirs["pids"] / "pids.max").read_text()) == 20
    else:
        unified = cgroup.dirs["unified"]
        assert (unified / "memory.swap.max").read_text().strip() == "0"
        assert (unified / "memory.oom.group").read_text().strip() == "1"
    assert cgroup.remove()


def test_without_any_cgroup_it_is_the_monitor_and_says_so(tmp_path):
    support = probe(Mounts(None, {}), "te-test")
    assert support.mode is cgroups.CgroupMode.MONITOR and not support.enforced
    assert support.status() == {"memory": "monitor", "processes": "monitor"}
    assert "no cgroup2 mount" in support.warning and "no memory and no pids hierarchy" in support.warning
    with pytest.raises(cgroups.CgroupError, match="no cgroup to create"):
        cgroups.EvalCgroup.create("e1", 128 * MIB, 20, support=support)
    assert cgroups.remove_stale([], support=support) == []


def test_a_read_only_cgroup_mount_falls_back_to_the_monitor_and_names_it(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs takes root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(tmp_path)], check=True)
    try:
        support = probe(Mounts(None, {"memory": tmp_path, "pids": tmp_path}), "te-test")
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)
    assert support.mode is cgroups.CgroupMode.MONITOR
    assert f"cannot create {tmp_path}/te-test" in support.detail and "read-only" in support.detail
