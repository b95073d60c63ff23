"""MAX_EVENT_STREAMS for the whole host: a stream holds an exclusive flock on one of that many files.

The web processes share nothing else, and a count in the database would outlive a killed
process; a flock is the kernel's, and ends with the process that held it.
"""

from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path

from evaluations.events.announce import hub_dir


class Slot:
    def __init__(self, fd: int):
        self.fd = fd

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)  # the lock goes with the last descriptor of its open file


def take(data_dir: Path, limit: int) -> Slot | None:
    """A free slot of ``limit``, or None when every one is held."""
    folder = hub_dir(data_dir) / "slots"
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
            return Slot(fd)
        return None
    finally:
        os.close(folder_fd)
