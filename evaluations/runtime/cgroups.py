"""Kernel-enforced limits: each evaluation's commands in a cgroup of its own (SPEC §12).

The monitor samples; the kernel does not: a burst allocation by many
processes at once is stopped at ``memory.max`` (``memory.limit_in_bytes`` on
v1) before any sampler looks, and a fork bomb at ``pids.max``. The recipe is
isolate's and nsjail's:

1. ``detect()`` (once per process) finds what the host offers. v2: the
   service's own cgroup must be a delegated subtree (systemd ``Delegate=yes``,
   or a container given its cgroup read-write); the service's processes move
   into the leaf ``<root>/service`` before ``+memory +pids`` goes into
   ``subtree_control`` (a cgroup with controllers for its children may hold
   no processes itself: EBUSY otherwise). v1 (this machine): the ``memory``
   and ``pids`` hierarchies, plus ``cpuacct`` (CPU time of exited processes
   too) and ``freezer`` (stops a fork storm while it is killed) where mounted.
   Neither: the monitor alone, and ``CgroupSupport.warning`` says so.
2. ``EvalCgroup.create`` makes ``<parent>/<eval_id>`` in each hierarchy with
   the limits; swap 0; the kernel's OOM killer stays enabled (v2 kills the
   whole cgroup: ``memory.oom.group``).
3. A command joins before it runs anything, the first of its launch's steps
   (policy.py): the static init's ``--launch --cgroup FILE``, or, where the
   init cannot be built, ``join_prefix()``, an argv prefix (``sh`` writes its
   own pid into each ``cgroup.procs``, then execs the rest) put in front of
   setpriv/prlimit/bwrap; either way as root, before anything has forked. Writing the pid from the parent after ``Popen``
   would race a fork storm; ``preexec_fn`` forbids vfork and is unsafe with
   threads; ``CLONE_INTO_CGROUP`` (v2 only) has no binding in Python 3.11.
4. Kills go through the cgroup (``cgroup.kill`` on v2; on v1 freeze, SIGKILL
   every member, thaw, until empty); ``remove()`` kills what is left and
   removes the folders; ``remove_stale`` does it for a crashed worker's.

``pids.max`` counts threads as well as processes, as RLIMIT_NPROC does.
Memory figures are the kernel's charge: anonymous memory plus page cache,
which the kernel reclaims before it OOM-kills, so an I/O-heavy command can
show a peak near the limit without having been in danger.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from evaluations.runtime.cgroupfs import (
    DEFAULT_PARENT,
    NAME,
    CgroupError,
    CgroupMode,
    CgroupSupport,
    check_name,
    detect,
    read_int,
    read_keyed,
    read_text,
    why,
    write,
)

__all__ = [
    "DEFAULT_PARENT",
    "JOIN_FAILED_EXIT",
    "CgroupError",
    "CgroupMode",
    "CgroupSupport",
    "EvalCgroup",
    "Figures",
    "Usage",
    "detect",
    "memory_exceeded_detail",
    "remove_stale",
    "stale_cgroups",
]

MIB = 1024 * 1024
JOIN_FAILED_EXIT = 125  # the command did not run: it could not join its cgroup
# $1.. are cgroup.procs files up to "--", then the command. "$$" quoted: IFS comes from the caller's env.
_JOIN_SCRIPT = (
    'while [ "$1" != -- ]; do echo "$$" > "$1" || '
    f'{{ echo "term-executor: cannot join cgroup $1" >&2; exit {JOIN_FAILED_EXIT}; }}; shift; done; shift; exec "$@"'
)


class Usage(NamedTuple):
    memory_bytes: int
    processes: int


class Figures(NamedTuple):
    """What the evaluation's ``resources`` takes from the cgroup (read before ``remove``)."""

    peak_memory_bytes: int
    cpu_seconds: float | None
    peak_processes: int
    oom_kills: int


class EvalCgroup:
    """One evaluation's cgroup (a folder per hierarchy on v1, one on v2)."""

    def __init__(self, eval_id: str, *, support: CgroupSupport | None = None):
        """A handle on the cgroup, made or not: ``create`` makes it, ``remove`` removes it."""
        self.support = support or detect()
        if not self.support.enforced:
            raise CgroupError(f"no cgroup to create: {self.support.detail}")
        self.eval_id = check_name(eval_id)
        self.dirs = {controller: parent / eval_id for controller, parent in self.support.parents.items()}
        self._v2 = self.support.mode is CgroupMode.V2
        self._sampled = Usage(0, 0)
        # Processes of the executor's own in the cgroup (the spawner's held launcher): pids.max allows
        # for them, and the counts (the limit's, the peaks) leave them out.
        self.reserved = 0

    @classmethod
    def create(
        cls, eval_id: str, memory_bytes: int, max_processes: int, *, support: CgroupSupport | None = None
    ) -> EvalCgroup:
        """Make the cgroup with its limits; one left by an earlier attempt is killed and replaced."""
        _check_limits(memory_bytes, max_processes)
        cgroup = cls(eval_id, support=support)
        if any(path.exists() for path in cgroup.dirs.values()) and not cgroup.remove():
            raise CgroupError(f"cgroup {cgroup.eval_id} is left from an earlier attempt and cannot be removed")
        try:
            for path in cgroup.dirs.values():
                path.mkdir()
            cgroup.set_limits(memory_bytes, max_processes)
        except OSError as e:
            cgroup.remove()
            raise CgroupError(f"cannot create cgroup {cgroup.eval_id}: {why(e)}") from e
        except BaseException:
            cgroup.remove()
            raise
        return cgroup

    def set_limits(self, memory_bytes: int, max_processes: int) -> None:
        _check_limits(memory_bytes, max_processes)
        has = self.support.features.__contains__
        if self._v2:
            unified = self.dirs["unified"]
            write(unified / "memory.max", memory_bytes)
            if has("memory.swap.max"):
                write(unified / "memory.swap.max", 0)
            if has("memory.oom.group"):
                write(unified / "memory.oom.group", 1)  # an OOM kills the whole command, not one victim
            write(unified / "pids.max", max_processes + self.reserved)
            return
        memory = self.dirs["memory"]
        if has("memory.memsw.limit_in_bytes"):
            # memory+swap >= memory at every moment: raise memsw first when raising.
            current = read_int(memory / "memory.limit_in_bytes")
            order = ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
            for name in order if memory_bytes > current else reversed(order):
                write(memory / name, memory_bytes)  # memsw = memory: swap 0
        else:
            write(memory / "memory.limit_in_bytes", memory_bytes)
        if has("memory.swappiness"):
            write(memory / "memory.swappiness", 0)
        write(memory / "memory.oom_control", 0)  # oom_kill_disable 0: the kernel kills, nothing waits
        write(self.dirs["pids"] / "pids.max", max_processes + self.reserved)

    def reserve(self, processes: int) -> None:
        """``processes`` of the executor's own in the cgroup from now on, beside the evaluation's."""
        pids_max = self._file("pids.max")
        write(pids_max, read_int(pids_max) - self.reserved + processes)
        self.reserved = processes

    def procs_files(self) -> list[Path]:
        """The files a process writes its pid into to join (every hierarchy's ``cgroup.procs``)."""
        return [path / "cgroup.procs" for path in self.dirs.values()]

    def join_prefix(self) -> list[str]:
        """argv prefix: the command joins this cgroup, then execs the rest (exit 125 if it cannot).

        Must run as root and come first, before setpriv drops the uid.
        """
        return join_prefix(self.procs_files())

    def pids(self) -> list[int]:
        """Every process in the cgroup (any hierarchy), as seen from this pid namespace."""
        found: set[int] = set()
        for path in self.procs_files():
            found.update(int(pid) for pid in read_text(path, "").split())
        return sorted(found)

    # Readings (the monitor's figures).

    def usage(self) -> Usage:
        """Memory charged now, and processes now (zombies not yet reaped included)."""
        processes = max(0, read_int(self._file("pids.current")) - self.reserved)
        if self._v2:
            now = Usage(read_int(self._file("memory.current")), processes)
        else:
            now = Usage(read_int(self._file("memory.usage_in_bytes")), processes)
        self._sampled = Usage(
            max(self._sampled.memory_bytes, now.memory_bytes), max(self._sampled.processes, now.processes)
        )
        return now

    @property
    def memory_limit_bytes(self) -> int:
        return read_int(self._file("memory.max" if self._v2 else "memory.limit_in_bytes"))

    def peak_memory_bytes(self) -> int:
        """The kernel's high-water mark since creation (sampled where the kernel keeps none)."""
        if not self._v2:
            return read_int(self._file("memory.max_usage_in_bytes"))
        if "memory.peak" in self.support.features:
            return read_int(self._file("memory.peak"))
        return self._sampled.memory_bytes

    def peak_processes(self) -> int:
        """``pids.peak`` (kernel 6.1+ on v2, 6.13+ on v1), else the largest ``usage()`` sample."""
        if "pids.peak" in self.support.features:
            return max(0, read_int(self._file("pids.peak")) - self.reserved)
        return self._sampled.processes

    def oom_kills(self) -> int:
        """Processes the kernel killed for the memory limit, since creation.

        v1 kernels before 4.13 have no ``oom_kill`` count: there it is whether
        the limit was ever hit (``memory.failcnt``), which reclaim alone can do.
        """
        if self._v2:
            return read_keyed(self._file("memory.events")).get("oom_kill", 0)
        control = read_keyed(self._file("memory.oom_control"))
        if "oom_kill" in control:
            return control["oom_kill"]
        return int(read_int(self._file("memory.failcnt")) > 0)

    def oom_killed(self) -> bool:
        return self.oom_kills() > 0

    def process_limit_hits(self) -> int:
        """Forks refused at ``pids.max`` since creation."""
        return read_keyed(self._file("pids.events")).get("max", 0)

    def cpu_seconds(self) -> float | None:
        """CPU time of every process that ran in it, exited ones included; None on v1 without cpuacct."""
        if self._v2:
            return read_keyed(self._file("cpu.stat"))["usage_usec"] / 1e6
        if "cpuacct" not in self.dirs:
            return None
        return read_int(self.dirs["cpuacct"] / "cpuacct.usage") / 1e9

    def figures(self) -> Figures:
        return Figures(self.peak_memory_bytes(), self.cpu_seconds(), self.peak_processes(), self.oom_kills())

    def oom_message(self) -> str:
        return memory_exceeded_detail(self.peak_memory_bytes(), self.memory_limit_bytes)

    # Ending.

    def kill(self, timeout: float = 5.0) -> int:
        """SIGKILL every process in the cgroup until it is empty (bounded); return how many were signalled."""
        deadline = time.monotonic() + timeout
        if self._v2 and "cgroup.kill" in self.support.features:
            count = len(self.pids())
            if count:
                write(self._file("cgroup.kill"), 1)
                while _populated(self._file("cgroup.events")) and time.monotonic() < deadline:
                    time.sleep(0.005)
            return count
        freezer = self.dirs.get("freezer") if not self._v2 else self.dirs["unified"]
        frozen = freezer is not None and self.pids() and _freeze(freezer, self._v2, deadline)
        signalled: set[int] = set()
        try:
            while pids := self.pids():
                for pid in pids:
                    with _gone_ok():
                        os.kill(pid, signal.SIGKILL)
                signalled.update(pids)
                if frozen:  # a frozen process dies only once thawed; none could fork meanwhile
                    _thaw(freezer, self._v2)
                    frozen = False
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)
        finally:
            if frozen:
                _thaw(freezer, self._v2)
        return len(signalled)

    def remove(self, timeout: float = 5.0) -> bool:
        """Kill what is left and remove the folders; True once none remains. Safe to call twice."""
        deadline = time.monotonic() + timeout
        remaining = [path for path in self.dirs.values() if path.exists()]
        if remaining and self.pids():
            self.kill(timeout)
        while remaining:
            path = remaining[0]
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return False
                self.kill(max(0.0, deadline - time.monotonic()))
                time.sleep(0.005)
                continue
            remaining.pop(0)
        return True

    def _file(self, name: str) -> Path:
        if self._v2:
            return self.dirs["unified"] / name
        return self.dirs[name.split(".", 1)[0]] / name  # v1: "memory.x" lives in the memory hierarchy


def join_prefix(procs_files: Iterable[Path]) -> list[str]:
    """argv prefix that writes its own pid into each ``cgroup.procs`` file, then execs the rest."""
    return ["/bin/sh", "-c", _JOIN_SCRIPT, "te-cgroup-join", *map(str, procs_files), "--"]


def memory_exceeded_detail(peak_bytes: int, limit_bytes: int) -> str:
    """SPEC §12's wording for a kernel OOM kill; the peak rounded up, as the monitor's figures."""
    return f"memory limit exceeded (peak {-(-peak_bytes // MIB)} MiB > {limit_bytes // MIB} MiB)"


def stale_cgroups(live_eval_ids: Iterable[str], *, support: CgroupSupport | None = None) -> list[str]:
    """Evaluation cgroups under our parent whose evaluation is not in ``live_eval_ids``."""
    support = support or detect()
    live = set(live_eval_ids)
    names = {
        entry.name
        for parent in support.parents.values()
        if parent.is_dir()
        for entry in parent.iterdir()
        if entry.is_dir()  # the parent's own interface files sit beside them
    }
    return sorted(name for name in names if name not in live and NAME.fullmatch(name))


def remove_stale(live_eval_ids: Iterable[str], *, support: CgroupSupport | None = None) -> list[str]:
    """Kill and remove every stale cgroup (a crashed worker's); return the eval ids removed."""
    support = support or detect()
    if not support.enforced:
        return []
    removed = []
    for name in stale_cgroups(live_eval_ids, support=support):
        if EvalCgroup(name, support=support).remove():
            removed.append(name)
    return removed


def _check_limits(memory_bytes: int, max_processes: int) -> None:
    if memory_bytes <= 0 or max_processes <= 0:
        raise ValueError(f"limits must be positive: memory {memory_bytes} bytes, {max_processes} processes")


def _freeze(path: Path, v2: bool, deadline: float) -> bool:
    """Freeze (bounded: a process in uninterruptible sleep can hold it at FREEZING); True if asked."""
    try:
        write(path / ("cgroup.freeze" if v2 else "freezer.state"), 1 if v2 else "FROZEN")
    except OSError:
        return False
    settle = min(deadline, time.monotonic() + 1.0)
    while time.monotonic() < settle:
        if v2 and read_keyed(path / "cgroup.events").get("frozen") == 1:
            break
        if not v2 and read_text(path / "freezer.state", "").strip() == "FROZEN":
            break
        time.sleep(0.002)
    return True


def _thaw(path: Path, v2: bool) -> None:
    with _gone_ok():
        write(path / ("cgroup.freeze" if v2 else "freezer.state"), 0 if v2 else "THAWED")


def _populated(events: Path) -> bool:
    return read_keyed(events).get("populated", 0) == 1


# A process or cgroup that went away meanwhile.
_gone_ok = functools.partial(contextlib.suppress, ProcessLookupError, FileNotFoundError)
