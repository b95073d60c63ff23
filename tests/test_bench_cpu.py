"""bench/cpu.py: the CPU a process tree spends between two snapshots, reaped processes counted once."""

from __future__ import annotations

import os
import subprocess
import sys

from bench import cpu

# Burns `ms` of its own CPU, then (argv[2] == "1") starts a copy of itself that burns as much and
# waits for it; then waits for a line on stdin, so a snapshot can be taken while it lives.
BURNER = """
import subprocess, sys, time
ms = int(sys.argv[1])
while time.process_time() * 1000 < ms:
    pass
if sys.argv[2] == "1":
    subprocess.run([sys.executable, "-c", sys.argv[3], sys.argv[1], "0", sys.argv[3]], stdin=subprocess.DEVNULL, check=True)
print("burnt", flush=True)
sys.stdin.readline()
"""


def _times(pid: int, ppid: int, own: float, reaped: float = 0.0, started: int = 1) -> cpu.Times:
    return cpu.Times(ppid=ppid, started=started, own=own, reaped=reaped)


def test_spent_counts_a_reaped_process_once_and_a_reused_pid_as_new():
    before = {
        10: (_times(10, 1, own=100.0), "web"),
        20: (_times(20, 1, own=50.0), "worker"),
        21: (_times(21, 20, own=30.0, reaped=5.0), "evaluations"),  # reaped by 20 before `after`
        22: (_times(22, 20, own=40.0), "evaluations"),  # its pid used again by another process
    }
    after = {
        10: (_times(10, 1, own=110.0), "web"),
        # 20 reaped 21 (its whole life: 30 + 5 + 15 since) and the first 22 (40 + 10 since)
        20: (_times(20, 1, own=52.0, reaped=100.0), "worker"),
        22: (_times(22, 20, own=7.0, started=99), "evaluations"),
    }
    assert cpu.spent(before, after) == {"web": 10.0, "worker": 2.0, "evaluations": 100.0 - 35.0 - 40.0 + 7.0}


def test_a_real_tree_counts_each_process_once():
    process = subprocess.Popen(
        [sys.executable, "-c", BURNER, "300", "1", BURNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        before = cpu.snapshot(os.getpid())
        assert process.pid in before and before[process.pid][1] == "other"
        assert process.stdout.readline() == "burnt\n"  # its child burnt 300 ms and was reaped by it
        after = cpu.snapshot(os.getpid())
    finally:
        process.communicate("\n", timeout=60)
    used = cpu.spent(before, after)["other"]
    # Two burners of 300 ms each, minus what the first had spent at `before` (its start-up, a few
    # tens of ms), plus the second's start-up; a child counted twice (its own and as reaped) would
    # be over 900.
    assert 450 <= used <= 800, used
