"""The watcher of one running command: time, memory, processes, disk, files, cancel.

It samples every ``monitor_interval_ms``; the session folder, which costs a
walk, about once a second. The first limit crossed wins: it is recorded as a
``Verdict`` with the figures for the error sentence, and the ``on_verdict``
callback kills everything.

What is measured, and why:

- Memory and processes: every descendant of this process. The host is
  a child subreaper, so escapees that ``setsid`` or double-fork are still in
  this tree. Zombies count as processes (each holds a pid and a slot of
  RLIMIT_NPROC: a zombie hoarder is a fork bomb the kernel sees); orphaned
  ones, reparented to us, are reaped before each count. RSS is summed per process, so pages shared between processes
  (the same binary, copy-on-write after fork) count once per process: the
  figure errs towards a kill, never towards a miss.
- Disk: the blocks actually allocated (``st_blocks * 512``), walked with
  ``os.scandir`` without following links, each inode once. A sparse 100 GB
  file counts what it occupies (a few KiB), so it causes no false kill, and
  every byte really written counts, so real usage is not missed. Apparent
  sizes are capped separately, per file, by ``RLIMIT_FSIZE`` (= the quota).
- Files: the inodes (files, folders, links) met in the same walk, against
  ``max_files``. Blocks alone let 300,000 empty files pass as a few MB; each
  one is an inode of the host's file system all the same, and a walk of
  every later command.
- Outside the tree and the folder: ``extra_memory`` adds SysV shared memory
  (``sysvipc.py``), ``extra_disk`` (without the sandbox, with a uid of the
  evaluation's own) the bytes and files the uid left in the host's temporary
  folders; in the sandbox, the files of its own ``/dev/shm`` (a tmpfs whose
  size caps its bytes, but not its inodes).
- With the evaluation's cgroup (``cgroups.py``), memory and processes are the
  kernel's own figures for it, read in two files instead of a /proc scan;
  the kernel enforces both limits, and the monitor names what it did: an OOM
  kill is the memory limit (with the peak), forks refused at ``pids.max``
  the process limit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evaluations import safefs
from evaluations.runtime import killer
from evaluations.runtime.cgroups import EvalCgroup
from evaluations.runtime.types import MIB, CancelEvent, Limit, Limits, Verdict, mib_up
from evaluations.safefs import TreeUsage

log = logging.getLogger(__name__)
_DISK_EVERY_SECS = 1.0


@dataclass
class Peaks:
    memory_bytes: int = 0
    processes: int = 0
    disk_bytes: int = 0
    files: int = 0


class Monitor(threading.Thread):
    def __init__(
        self,
        *,
        limits: Limits,
        session_dir: Path,
        cancel_event: CancelEvent | None,
        started_at: float,
        on_verdict: Callable[[Verdict], None],
        extra_disk: Callable[[], TreeUsage] | None = None,
        extra_memory: Callable[[], int] | None = None,
        cgroup: EvalCgroup | None = None,
    ):
        super().__init__(name="command-monitor", daemon=True)
        self.limits = limits
        self.session_dir = session_dir
        self.cancel_event = cancel_event
        self.started_at = started_at
        self.on_verdict = on_verdict
        self.extra_disk = extra_disk
        self.extra_memory = extra_memory
        self.cgroup = cgroup
        # What the cgroup counted before this command: only what it does now is its verdict.
        self._oom_kills = cgroup.oom_kills() if cgroup else 0
        self._fork_refusals = cgroup.process_limit_hits() if cgroup else 0
        self.verdict: Verdict | None = None
        self.peaks = Peaks()
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        self.join()

    def run(self) -> None:
        interval = self.limits.monitor_interval_ms / 1000
        next_disk_walk = 0.0
        while not self._stopped.wait(interval):
            verdict = self._check_cancel_and_time()
            try:
                verdict = verdict or self._check_tree()
                if verdict is None and time.monotonic() >= next_disk_walk:
                    verdict = self._check_folder()
                    next_disk_walk = time.monotonic() + _DISK_EVERY_SECS
            except Exception:  # a failed sample must not end the watch: time and cancel still hold
                log.exception("monitor sample failed; retrying at the next tick")
            if verdict is not None and not self._stopped.is_set():
                self.verdict = verdict
                self.on_verdict(verdict)
                return

    def _check_cancel_and_time(self) -> Verdict | None:
        if self.cancel_event is not None and self.cancel_event.is_set():
            return Verdict(Limit.CANCELLED, "cancelled")
        timeout = self.limits.timeout_secs
        if time.monotonic() - self.started_at > timeout:
            return Verdict(Limit.TIMEOUT, f"timed out after {timeout:g} s")
        return None

    def _check_tree(self) -> Verdict | None:
        killer.reap_orphans()
        if self.cgroup is not None:
            verdict = self.kernel_verdict()
            if verdict is not None:
                return verdict
            rss, count = self.cgroup.usage()  # SysV shared memory is charged to it too
        else:
            rss, count = tree_usage()
            if self.extra_memory is not None:
                rss += self.extra_memory()
        self.peaks.memory_bytes = max(self.peaks.memory_bytes, rss)
        self.peaks.processes = max(self.peaks.processes, count)
        limits = self.limits
        if count > limits.max_processes:
            return Verdict(Limit.PROCESSES, f"process limit exceeded ({count} > {limits.max_processes})")
        if rss > limits.memory_bytes:
            return Verdict(
                Limit.MEMORY,
                f"memory limit exceeded ({mib_up(rss)} MiB > {limits.memory_bytes // MIB} MiB)",
            )
        return None

    def kernel_verdict(self) -> Verdict | None:
        """What the kernel did to the command for the cgroup's limits since it started."""
        cgroup = self.cgroup
        if cgroup is None:
            return None
        if cgroup.oom_kills() > self._oom_kills:
            return Verdict(Limit.MEMORY, cgroup.oom_message())
        if cgroup.process_limit_hits() > self._fork_refusals:
            return Verdict(
                Limit.PROCESSES, f"process limit exceeded (a fork refused at {self.limits.max_processes} processes)"
            )
        return None

    def final_folder_check(self) -> Verdict | None:
        """After the command: one that filled the disk (or made too many files) and exited
        between two walks is still caught."""
        return self._check_folder()

    def _check_folder(self) -> Verdict | None:
        """One walk of the session folder: its bytes against the disk quota, its files against max_files."""
        used = folder_usage(self.session_dir)
        if self.extra_disk is not None:
            used += self.extra_disk()
        self.peaks.disk_bytes = max(self.peaks.disk_bytes, used.bytes)
        self.peaks.files = max(self.peaks.files, used.files)
        detail = disk_excess(used.bytes, self.limits.disk_quota_bytes)
        if detail:
            return Verdict(Limit.DISK, detail)
        if used.files > self.limits.max_files:
            return Verdict(Limit.FILES, f"file count limit exceeded ({used.files} > {self.limits.max_files})")
        return None


def disk_excess(used: int, quota: int) -> str | None:
    """The error sentence when `used` bytes break the quota, else None."""
    if used > quota:
        return f"disk quota exceeded ({mib_up(used)} MiB > {quota // MIB} MiB)"
    return None


def tree_usage() -> tuple[int, int]:
    """(summed RSS in bytes, number of processes) of every descendant, zombies counted."""
    tree = killer.descendants(zombies=True)  # a zombie has no memory, but is a process all the same
    return sum(proc.rss for proc in tree), len(tree)


def folder_usage(root: Path) -> TreeUsage:
    """Bytes allocated under ``root`` (st_blocks * 512) and its inodes, links not followed,
    each inode once, in one walk.

    One walker for the whole project (safefs): it goes through directory fds,
    so a tree nested deeper than PATH_MAX cannot hide from the quota.
    """
    return safefs.tree_usage(root)
