"""Per-command and per-evaluation cost of the evaluation's cgroup (issue 15).

    .venv/bin/python -m bench.cgroups [RUNS]     # prints JSON (root, on a host with cgroups)

Medians of RUNS runs, in ms:

- ``plain``: ``subprocess.run(["/bin/true"])``; ``joined``: the same behind
  ``EvalCgroup.join_prefix()`` (sh writes its pid into each hierarchy's
  cgroup.procs, then execs); ``sh_exec``: behind ``sh -c 'exec "$@"'`` alone,
  to tell the exec of sh from the writes.
- ``create_remove``: one evaluation's cgroup made with its limits and removed
  (once per evaluation, not per command).
- ``usage_cgroup`` vs ``usage_proc_scan``: one reading of memory and processes
  with SLEEPERS processes running, from the cgroup's files vs the monitor's
  scan of /proc (``monitor.tree_usage``).
- ``kill_remove``: SLEEPERS sleeping processes killed through the cgroup and
  the cgroup removed (v1: freeze, SIGKILL, thaw, rmdir).

Its cgroups live under a parent of their own (``bench-<pid>``), removed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench.spawner import median_ms
from evaluations.runtime import cgroups, killer
from evaluations.runtime.monitor import tree_usage

SLEEPERS = 20
LIMITS = {"memory_bytes": 512 * 2**20, "max_processes": 256}


def wait_for(cgroup: cgroups.EvalCgroup, count: int) -> None:
    deadline = time.monotonic() + 30
    while cgroup.usage().processes < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sleepers did not all join: {cgroup.usage()}")
        time.sleep(0.01)


def measure(runs: int) -> dict:
    support = cgroups.detect(f"bench-{os.getpid()}")
    if not support.enforced:
        raise SystemExit(f"no cgroup here: {support.detail}")
    killer.become_subreaper()  # as the spawner's host: the scan sees the sleepers as its tree
    figures: dict = {"mode": support.mode.value, "hierarchies": sorted(support.parents)}
    try:
        cgroup = cgroups.EvalCgroup.create("bench", **LIMITS, support=support)
        prefix = cgroup.join_prefix()
        figures["plain"] = median_ms(lambda: subprocess.run(["/bin/true"], capture_output=True), runs)
        figures["sh_exec"] = median_ms(
            lambda: subprocess.run(["/bin/sh", "-c", 'exec "$@"', "sh", "/bin/true"], capture_output=True), runs
        )
        figures["joined"] = median_ms(lambda: subprocess.run([*prefix, "/bin/true"], capture_output=True), runs)
        sleepers = [subprocess.Popen([*prefix, "sleep", "600"]) for _ in range(SLEEPERS)]
        wait_for(cgroup, SLEEPERS)
        figures["usage_cgroup"] = median_ms(cgroup.usage, runs)
        figures["usage_proc_scan"] = median_ms(tree_usage, runs)
        cgroup.remove()
        for sleeper in sleepers:
            sleeper.wait()

        def create_remove():
            cgroups.EvalCgroup.create("bench", **LIMITS, support=support).remove()

        figures["create_remove"] = median_ms(create_remove, runs)
        kill_runs = max(3, runs // 10)
        kill_times: list[float] = []
        for _ in range(kill_runs):
            cgroup = cgroups.EvalCgroup.create("bench", **LIMITS, support=support)
            sleepers = [subprocess.Popen([*prefix, "sleep", "600"]) for _ in range(SLEEPERS)]
            wait_for(cgroup, SLEEPERS)
            started = time.perf_counter()
            cgroup.remove()
            kill_times.append((time.perf_counter() - started) * 1000)
            for sleeper in sleepers:
                sleeper.wait()
        figures["kill_remove"] = sorted(kill_times)[len(kill_times) // 2]
    finally:
        cgroups.remove_stale([], support=support)
        for parent in support.parents.values():
            parent.rmdir()
    return figures


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 200)))
