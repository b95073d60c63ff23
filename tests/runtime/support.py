"""Helpers for the runtime tests, independent of the code under test where it matters."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil

from evaluations.runtime import TAG_VAR, Limits, killer, sandbox_uid


def _own_uid() -> int:
    """65534 (nobody) for the first pytest-xdist worker, 65533 for the second, ...: RLIMIT_NPROC
    counts a uid's processes host-wide, so a fork storm held to 20 processes under one worker's
    tests failed to fork (and timed out instead of hitting the limit) while the other worker's
    sandboxes ran as the same uid."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return 65534 - int(worker.removeprefix("gw") or 0)


UID = sandbox_uid(_own_uid())
MIB = 1024 * 1024
DEFAULT_LIMITS = Limits(
    timeout_secs=20,
    memory_bytes=1024 * MIB,
    disk_quota_bytes=1024 * MIB,
    max_processes=200,
    max_output_bytes=MIB,
    max_files=100_000,
    monitor_interval_ms=20,
)


def tagged_alive(eval_id: str, keep: set[int] = frozenset()) -> list[psutil.Process]:
    """Live processes carrying the tag, found independently of the code under test, but ``keep``
    (a phase's own sandbox: ``Spawner.phase_pids``)."""
    alive = []
    for proc in psutil.process_iter():
        try:
            if proc.pid in keep:
                continue
            if proc.environ().get(TAG_VAR) == eval_id and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def alive_with_cmdline(*argv: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == list(argv) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def give_to_sandbox_uid(path: Path) -> Path:
    if UID is not None:
        os.chown(path, UID, UID)
    return path


def leftovers(eval_id: str, keep: set[int] = frozenset()) -> list[psutil.Process]:
    """Tagged processes, and live descendants of this process (escapees without the tag), but the
    ones the suite protected as not commands (tests/helpers/images.py's registry) and their own,
    and ``keep`` (a phase's own sandbox: ``Spawner.phase_pids``)."""
    kept = killer.protected_pids() | set(keep)
    mine = psutil.Process().children(recursive=False)
    children = []
    for child in mine:
        if child.pid in kept:
            continue
        with contextlib.suppress(psutil.Error):
            children += [child, *child.children(recursive=True)]
    return tagged_alive(eval_id, keep) + [p for p in children if _alive(p) and p.pid not in kept]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
