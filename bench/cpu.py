"""The CPU a process's descendants spend between two moments: the throughput's CPU per evaluation.

On a machine whose CPUs a run keeps busy, evaluations a second is the CPUs'
time over the CPU one evaluation costs, so this is the figure that says why a
throughput ratio is what it is (bench/RESULTS.md, issue 38), steadier than the
rate itself, which moves with the disk's state from run to run.

``snapshot(root)`` reads every descendant of ``root`` from /proc (not ``root``
itself: the bench's client and its task server): its own user and system time
and what it has reaped (``cutime``/``cstime``: the whole lifetime of each child
it waited for, and of theirs). ``spent(before, after)`` is the difference:
each process of ``after`` counts what it spent and reaped since ``before``; one
of ``before`` that is gone was reaped by an ancestor of the tree, whose reaped
time then holds the whole of its life, so what it had spent by ``before`` is
taken off again. A process that ends unreaped by the tree (adopted by init) is
not counted; in the service none is (the worker and each evaluation process are
subreapers). Nor is the kernel's own work for the tree (its worker threads: a
network namespace's cleanup, the disk's writeback).

Each process counts under the kind of the root's child it descends from:
``web`` (gunicorn), ``worker`` (run_worker's loop, its own time) and
``evaluations`` (all below it: the forkserver, the evaluation processes and
every command they ran); anything else under ``other``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Times:
    ppid: int
    started: int  # clock ticks after boot: a pid used again is another process
    own: float  # ms of user and system time
    reaped: float  # ms of its waited-for children's (and theirs)


def _read(pid: int) -> Times | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:  # ended meanwhile
        return None
    ticks = [int(value) for value in fields[11:15]]  # utime, stime, cutime, cstime
    return Times(int(fields[1]), int(fields[19]), (ticks[0] + ticks[1]) * _TICK_MS, (ticks[2] + ticks[3]) * _TICK_MS)


def _kind(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().split(b"\0")
    except OSError:
        return "other"
    if any(b"gunicorn" in arg for arg in argv):
        return "web"
    if b"run_worker" in argv:
        return "worker"
    return "other"


Snapshot = dict[int, tuple[Times, str]]


def snapshot(root: int) -> Snapshot:
    """Every descendant of ``root`` now, with the kind of the subtree it is in."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (times := _read(int(name))) is not None:
            table[int(name)] = times
    children: dict[int, list[int]] = {}
    for pid, times in table.items():
        children.setdefault(times.ppid, []).append(pid)
    found: Snapshot = {}
    for top in children.get(root, []):
        kind = _kind(top)
        stack = [(top, kind)]
        while stack:
            pid, its_kind = stack.pop()
            found[pid] = (table[pid], its_kind)
            below = "evaluations" if its_kind == "worker" else its_kind  # the worker's loop is its top process only
            stack.extend((child, below) for child in children.get(pid, []))
    return found


def spent(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Milliseconds of CPU by kind between the two snapshots (``worker``: its loop's own, its
    reaped time under ``evaluations``)."""
    totals: dict[str, float] = {}

    def add(kind: str, ms: float) -> None:
        totals[kind] = totals.get(kind, 0.0) + ms

    for pid, (now, kind) in after.items():
        then = before.get(pid)
        same = then is not None and then[0].started == now.started
        own = now.own - (then[0].own if same else 0.0)
        reaped = now.reaped - (then[0].reaped if same else 0.0)
        add(kind, own)
        add("evaluations" if kind == "worker" else kind, reaped)
    for pid, (then, kind) in before.items():
        now = after.get(pid)
        if now is None or now[0].started != then.started:  # reaped since: its parent's time holds all of it
            add("evaluations" if kind == "worker" else kind, -(then.own + then.reaped))
    return totals
