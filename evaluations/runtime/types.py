"""The values the runtime takes and gives back: no behaviour, no imports of the rest of it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

MIB = 1024 * 1024


class Limit(enum.StrEnum):
    """Why the runtime ended a command (the strings are stored and shown)."""

    TIMEOUT = "timeout"
    MEMORY = "memory"
    DISK = "disk"
    FILES = "files"
    PROCESSES = "processes"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Limits:
    timeout_secs: float
    memory_bytes: int  # of the whole process tree
    disk_quota_bytes: int  # blocks allocated under the session folder; also the largest single file
    max_processes: int
    max_output_bytes: int
    max_files: int  # inodes under the session folder (files, folders, links), as the disk quota
    monitor_interval_ms: int = 100

    @classmethod
    def of(cls, config, timeout_secs: float) -> Limits:
        """An evaluation's limits from its Config (any object with those settings), for ``timeout_secs``."""
        return cls(
            timeout_secs=max(0.001, timeout_secs),
            memory_bytes=config.memory_limit_bytes,
            disk_quota_bytes=config.disk_quota_bytes,
            max_processes=config.max_processes,
            max_output_bytes=config.max_output_bytes,
            max_files=config.max_files,
            monitor_interval_ms=config.monitor_interval_ms,
        )


@dataclass(frozen=True)
class Mount:
    """An extra bind under the sandbox, e.g. an asset at /static/<save_path>."""

    source: Path
    target: str
    writable: bool = False


@dataclass(frozen=True)
class ImageRoot:
    """An evaluation's root in an image: the merged overlay (its layers and its own writable layer)
    and the id map its commands run under (runtime/idmap.py; images/rootfs.py mounts it)."""

    rootfs: Path
    idmap: object  # an idmap.IdMap (types imports nothing of the runtime)
    run_as: tuple[int, int] | None = None  # (uid, gid) inside, when not the map's user (a verifier's user)

    @property
    def ids(self) -> tuple[int, int]:
        """The uid and gid its commands run as, inside: ``run_as``, else the map's user (the lease)."""
        return self.run_as if self.run_as is not None else (self.idmap.user, self.idmap.group)


@dataclass(frozen=True)
class Verdict:
    """A limit crossed, with the figures for the error sentence."""

    limit: Limit
    detail: str  # e.g. "memory limit exceeded (4213 MiB > 4096 MiB)"


@dataclass
class CommandResult:
    exit_code: int | None  # None if we killed it; 128 + N if signal N ended it
    output: str  # merged stdout+stderr, head + marker + tail, invalid UTF-8 replaced
    output_bytes: int  # everything the command printed
    duration_ms: int
    limit: Limit | None = None
    limit_detail: str | None = None
    peak_memory_bytes: int = 0
    peak_processes: int = 0

    @property
    def timed_out(self) -> bool:
        return self.limit is Limit.TIMEOUT

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None


class CancelEvent(Protocol):
    """What the runtime asks of a cancel: threading.Event, or the pipeline's cancel state."""

    def is_set(self) -> bool: ...


def mib_up(size: int) -> int:
    """Rounded up, so a figure just over a limit never reads as equal to it."""
    return -(-size // MIB)
