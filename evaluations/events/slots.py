"""MAX_EVENT_STREAMS for the whole host, and MAX_EVENT_STREAMS_PER_TOKEN for each tenant: a stream
holds an exclusive flock on one of that many files in each of its folders.

1. The web processes share nothing else, and a count in the database would outlive a killed
   process; a flock is the kernel's, and ends with the process that held it (both kinds).
2. A tenant's stream holds two: one of its tenant's files (``slots/tenants/<sha256 of the name>``,
   so no name becomes a path) and one of the host's. The tenant's is taken first: a tenant at its
   own cap is refused without touching the host's, so it cannot crowd out anyone else. An
   operator's (or anonymous) stream holds only the host's.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
from pathlib import Path

from evaluations.events.announce import hub_dir

HOST = "host"
TENANT = "tenant"


class Full(Exception):
    """Every slot of one cap is held; ``cap`` is HOST or TENANT."""

    def __init__(self, cap: str):
        super().__init__(cap)
        self.cap = cap


class Slot:
    """The locked files of one stream; ``release`` (once, idempotent) frees them all."""

    def __init__(self, fds: list[int]):
        self.fds = fds

    def release(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)  # the lock goes with the last descriptor of its open file


def take(data_dir: Path, limit: int, *, tenant: str | None = None, tenant_limit: int = 0) -> Slot:
    """A slot of the host's ``limit`` (and of ``tenant``'s ``tenant_limit`` when a tenant asks);
    ``Full`` naming the cap when every one of it is held."""
    held: list[int] = []
    try:
        if tenant is not None:
            name = hashlib.sha256(tenant.encode()).hexdigest()[:32]
            held.append(_lock_one(_folder(data_dir) / "tenants" / name, tenant_limit, TENANT))
        held.append(_lock_one(_folder(data_dir), limit, HOST))
    except BaseException:
        Slot(held).release()
        raise
    return Slot(held)


def _folder(data_dir: Path) -> Path:
    return hub_dir(data_dir) / "slots"


def _lock_one(folder: Path, limit: int, cap: str) -> int:
    """A descriptor holding the flock of one of files 0..limit-1 of ``folder``; Full(cap) if none is free."""
    folder.mkdir(parents=True, exist_ok=True)
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        start = random.randrange(limit)  # streams starting together try different files first
        for n in range(limit):
            fd = os.open(
                str((start + n) % limit), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder_fd
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        raise Full(cap)
    finally:
        os.close(folder_fd)
