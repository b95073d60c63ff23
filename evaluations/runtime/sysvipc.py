"""System V IPC an evaluation holds: counted against its memory limit, removed when it ends.

A SysV shared memory segment outlives every process that attached it: an
agent can fill one, detach, and keep the RAM while no process's RSS shows
it. So the monitor adds the segments' resident bytes to the memory figure:

- without the sandbox, the segments of the evaluation's own uid in the
  host's IPC namespace (``owned_shm_bytes``); ``remove_sysv_ipc`` removes
  its segments, queues and semaphore sets when the uid is scrubbed;
- under bubblewrap, every segment of the sandbox's own IPC namespace
  (``sandbox_shm_bytes``), read by entering that namespace from the
  monitor's thread for a moment (``setns`` changes only the calling
  thread's namespace). The namespace, and its segments, die with the
  command.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

_IPC_RMID = 0
_CLONE_NEWIPC = 0x08000000
_ID_COLUMN = {"shm": "shmid", "msg": "msqid", "sem": "semid"}


def _rows(kind: str) -> list[dict[str, str]]:
    try:
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
    except OSError:
        return []
    if not lines:
        return []
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]


def _owned(row: dict[str, str], uid: int) -> bool:
    return str(uid) in (row.get("uid"), row.get("cuid"))


def owned_shm_bytes(uid: int) -> int:
    """Resident bytes of the segments ``uid`` owns or created in our IPC namespace."""
    return sum(int(row.get("rss", 0)) for row in _rows("shm") if _owned(row, uid))


def remove_sysv_ipc(uid: int) -> int:
    """IPC_RMID every segment, queue and semaphore set ``uid`` owns or created."""
    libc = _libc()
    removed = 0
    for kind, column in _ID_COLUMN.items():
        for row in _rows(kind):
            if not _owned(row, uid) or column not in row:
                continue
            ipc_id = int(row[column])
            if kind == "sem":
                removed += libc.semctl(ipc_id, 0, _IPC_RMID) == 0
            else:
                removed += getattr(libc, f"{kind}ctl")(ipc_id, _IPC_RMID, None) == 0
    return removed


def sandbox_shm_bytes() -> int:
    """Resident bytes of every segment in the IPC namespaces of our sandboxed commands,
    found by a scan: our children are the bwrap processes (in our namespace); their
    children are the sandboxes' first processes, in the new ones. The spawner asks
    ``namespace_shm_bytes`` of the pid 1 bwrap reported instead, when it did."""
    own = os.readlink("/proc/thread-self/ns/ipc")
    sandboxes: dict[str, int] = {}
    for child in psutil.Process().children():
        try:
            inner = child.children()
        except psutil.Error:
            continue
        for proc in inner:
            try:
                namespace = os.readlink(f"/proc/{proc.pid}/ns/ipc")
            except OSError:
                continue
            if namespace != own:
                sandboxes.setdefault(namespace, proc.pid)
    return sum(namespace_shm_bytes(pid) for pid in sandboxes.values())


def namespace_shm_bytes(pid: int) -> int:
    """Resident bytes of every segment in ``pid``'s IPC namespace (0 if it has ended), read
    by entering it from this thread for a moment."""
    try:
        fd = os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0  # it ended meanwhile
    libc = _libc()
    home = os.open("/proc/thread-self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWIPC) != 0:
            return 0
        try:
            return sum(int(row.get("rss", 0)) for row in _rows("shm"))
        finally:
            if libc.setns(home, _CLONE_NEWIPC) != 0:
                log.error("could not return to our own IPC namespace (errno %s)", ctypes.get_errno())
    finally:
        os.close(fd)
        os.close(home)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
