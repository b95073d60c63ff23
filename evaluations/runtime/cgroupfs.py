"""What the host's cgroup filesystem offers us (``detect``), and reading and writing its files.

Below ``cgroups.py``: it knows mounts, our parent folders and files, not evaluations.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PARENT = "term-executor"
V1_CONTROLLERS = ("memory", "pids", "cpuacct", "freezer")
SERVICE_LEAF = "service"  # v2: where the service's own processes live
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_V2_CONTROLLERS = ("memory", "pids")
_V2_OPTIONAL = ("memory.swap.max", "memory.oom.group", "memory.peak", "pids.peak", "cgroup.kill")
_V1_OPTIONAL = {"memory": ("memory.memsw.limit_in_bytes", "memory.swappiness"), "pids": ("pids.peak",)}
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class CgroupMode(enum.Enum):
    V2 = "cgroup v2"
    V1 = "cgroup v1"
    MONITOR = "monitor"


class CgroupError(RuntimeError):
    """A cgroup could not be set up as required; the message says what and where."""


@dataclass(frozen=True)
class CgroupSupport:
    """What this host offers, found once by ``detect()``.

    ``parents``: our folder in each hierarchy, keyed by controller (v1:
    memory, pids, and cpuacct/freezer where usable) or "unified" (v2).
    ``features``: the optional interface files every evaluation's cgroup has.
    """

    mode: CgroupMode
    detail: str
    parents: dict[str, Path] = field(default_factory=dict)
    features: frozenset[str] = frozenset()

    @property
    def enforced(self) -> bool:
        return self.mode is not CgroupMode.MONITOR

    def status(self) -> dict[str, str]:
        """/status ``limits``."""
        return {"memory": self.mode.value, "processes": self.mode.value}

    @property
    def warning(self) -> str | None:
        """For /status ``warnings`` when the kernel does not enforce the limits."""
        if self.enforced:
            return None
        return f"memory and process limits are not kernel-enforced, only sampled by the monitor ({self.detail})"


@dataclass(frozen=True)
class Mounts:
    """``v2_root``: the service's own cgroup in the cgroup2 mount (our delegated subtree), if any.
    ``v1``: the mount point of each v1 hierarchy we use, by controller."""

    v2_root: Path | None = None
    v1: dict[str, Path] = field(default_factory=dict)


def read_mounts(mountinfo: str | None = None, own_cgroup: str | None = None) -> Mounts:
    """From /proc/self/mountinfo and /proc/self/cgroup (or the texts given)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    if own_cgroup is None:
        own_cgroup = Path("/proc/self/cgroup").read_text()
    own_v2 = next((line[3:] for line in own_cgroup.splitlines() if line.startswith("0::")), None)
    v2_root, v1 = None, {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        mount_root, mount_point = _unescape(fields[3]), Path(_unescape(fields[4]))
        fstype, super_options = fields[dash + 1], fields[dash + 3].split(",") if len(fields) > dash + 3 else []
        if fstype == "cgroup2" and own_v2 is not None and v2_root is None:
            v2_root = _own_cgroup_folder(mount_point, mount_root, own_v2)
        elif fstype == "cgroup":
            for controller in V1_CONTROLLERS:
                if controller in super_options:
                    v1.setdefault(controller, mount_point)  # co-mounted controllers share a folder
    return Mounts(v2_root, v1)


def favors_dynmods(mountinfo: str | None = None) -> bool:
    """Whether a cgroup hierarchy is mounted with ``favordynmods`` (Linux 6.0+). Without it, moving
    a process into a cgroup waits for an RCU grace period (the write side of the kernel's
    cgroup_threadgroup_rwsem): every sandbox that joins the evaluation's cgroup pays it, 8 ms on an
    idle machine here and more under load (bench/RESULTS.md, issue 38); the option is host-wide."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" in fields and len(fields) > fields.index("-") + 3:
            dash = fields.index("-")
            if fields[dash + 1] in ("cgroup", "cgroup2") and "favordynmods" in fields[dash + 3].split(","):
                return True
    return False


def _own_cgroup_folder(mount_point: Path, mount_root: str, own: str) -> Path | None:
    """Our cgroup's folder; a process started after the move into the leaf counts its parent."""
    if not (own == mount_root or own.startswith(mount_root.rstrip("/") + "/")):
        return None  # our cgroup is outside what this mount shows
    relative = own[len(mount_root) :].strip("/")
    parts = [part for part in relative.split("/") if part]
    if parts and parts[-1] == SERVICE_LEAF:
        parts.pop()
    return mount_point.joinpath(*parts)


def _unescape(text: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), text)


@functools.cache
def detect(parent: str = DEFAULT_PARENT) -> CgroupSupport:
    """v2 where a delegated subtree can be made, else v1 memory+pids, else the monitor."""
    return probe(read_mounts(), parent)


def guess_mode() -> CgroupMode:
    """What ``detect`` would find, without making or moving anything (for a process that runs no
    evaluation, e.g. the web side's /status while no worker has said)."""
    if os.geteuid() != 0:
        return CgroupMode.MONITOR
    mounts = read_mounts()
    root = mounts.v2_root
    if root is not None and set(_V2_CONTROLLERS) <= set(read_text(root / "cgroup.controllers", "").split()):
        if os.access(root, os.W_OK):
            return CgroupMode.V2
    if all(c in mounts.v1 and os.access(mounts.v1[c], os.W_OK) for c in ("memory", "pids")):
        return CgroupMode.V1
    return CgroupMode.MONITOR


def probe(mounts: Mounts, parent: str) -> CgroupSupport:
    """``detect`` without the cache, on a given mount table (tests give a folder laid out like v2)."""
    check_name(parent)
    reasons = []
    if mounts.v2_root is None:
        reasons.append("no cgroup2 mount")
    else:
        try:
            return setup_v2(mounts.v2_root, parent)
        except CgroupError as e:
            reasons.append(str(e))
    try:
        return setup_v1(mounts.v1, parent)
    except CgroupError as e:
        reasons.append(str(e))
    return CgroupSupport(CgroupMode.MONITOR, "no cgroup: " + "; ".join(reasons))


def setup_v2(root: Path, parent: str) -> CgroupSupport:
    """Enable memory and pids below ``root`` (the service's own cgroup) and make ``<root>/<parent>``."""
    available = set(read_text(root / "cgroup.controllers", "").split())
    missing = [c for c in _V2_CONTROLLERS if c not in available]
    if missing:
        raise CgroupError(f"cgroup v2 at {root}: controller(s) {', '.join(missing)} not delegated to it")
    enable = " ".join(f"+{c}" for c in _V2_CONTROLLERS)
    try:
        if not _controllers_enabled(root):
            try:
                write(root / "cgroup.subtree_control", enable)
            except OSError as e:
                if e.errno != errno.EBUSY or not (root / "cgroup.type").exists():
                    raise  # only a non-root cgroup has cgroup.type: never move the host's processes
                _move_processes(root, root / SERVICE_LEAF)  # the "no internal processes" rule
                write(root / "cgroup.subtree_control", enable)
        ours = root / parent
        ours.mkdir(exist_ok=True)
        if not _controllers_enabled(ours):
            write(ours / "cgroup.subtree_control", enable)
    except OSError as e:
        raise CgroupError(f"cgroup v2 at {root}: {why(e)}") from e
    features = frozenset(name for name in _V2_OPTIONAL if (ours / name).exists())
    return CgroupSupport(CgroupMode.V2, f"cgroup v2 at {ours}", {"unified": ours}, features)


def setup_v1(hierarchies: dict[str, Path], parent: str) -> CgroupSupport:
    """Make ``<hierarchy>/<parent>`` in memory and pids (required), cpuacct and freezer (if they work)."""
    missing = [c for c in ("memory", "pids") if c not in hierarchies]
    if missing:
        raise CgroupError(f"cgroup v1: no {' and no '.join(missing)} hierarchy")
    parents = {}
    for controller in V1_CONTROLLERS:
        if controller not in hierarchies:
            continue
        ours = hierarchies[controller] / parent
        try:
            ours.mkdir(exist_ok=True)
        except OSError as e:
            if controller in ("memory", "pids"):
                raise CgroupError(f"cgroup v1: cannot create {ours}: {why(e)}") from e
            continue  # cpuacct and freezer only make figures and kills better
        parents[controller] = ours
    features = frozenset(
        name for controller, names in _V1_OPTIONAL.items() for name in names if (parents[controller] / name).exists()
    )
    where = ", ".join(f"{c} {p}" for c, p in parents.items())
    return CgroupSupport(CgroupMode.V1, f"cgroup v1: {where}", parents, features)


def write(path: Path, value: object) -> None:
    """One write(2): each write to a cgroup file is one command to the kernel."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # cgroupfs refuses a missing file
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def read_int(path: Path) -> int:
    """A one-number file; "max" (no limit) reads as -1."""
    text = path.read_text().strip()
    return -1 if text == "max" else int(text)


def read_keyed(path: Path) -> dict[str, int]:
    """A "key value" per line file (memory.events, cpu.stat, memory.oom_control, pids.events)."""
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def check_name(name: str) -> str:
    if not NAME.fullmatch(name or "") or name in (SERVICE_LEAF,):
        raise ValueError(f"not usable as a cgroup name: {name!r} (letters, digits, '_', '.', '-')")
    return name


def _controllers_enabled(path: Path) -> bool:
    enabled = {token.lstrip("+") for token in read_text(path / "cgroup.subtree_control", "").split()}
    return all(c in enabled for c in _V2_CONTROLLERS)


def _move_processes(source: Path, leaf: Path, rounds: int = 50) -> None:
    """Move every process of ``source`` into ``leaf``; processes forked meanwhile get the next round."""
    leaf.mkdir(exist_ok=True)
    for _ in range(rounds):
        pids = read_text(source / "cgroup.procs", "").split()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                write(leaf / "cgroup.procs", pid)
    raise CgroupError(f"processes keep appearing in {source}; cannot move them into {leaf}")


def read_text(path: Path, default: str) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return default


def why(error: OSError) -> str:
    if error.errno == errno.EROFS:
        return f"{error.filename} is read-only (in Docker: --cgroupns=host and a writable /sys/fs/cgroup)"
    return f"{error.strerror} ({error.filename})"
