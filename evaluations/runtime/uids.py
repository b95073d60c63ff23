"""A uid of its own for every running evaluation (when the service runs as root).

Why: without bubblewrap the uid is the only wall between two evaluations.

1. Signals, ``/proc/<pid>/environ``, ptrace and 0700 folders are guarded by
   the uid: two agents sharing one could read, write and kill each other's
   repository, home and processes.
2. RLIMIT_NPROC counts the processes of a uid: with a uid of its own, an
   evaluation at its limit (or hoarding zombies) cannot stop another from
   forking, and the kernel can hold the limit tight.
3. Whatever the uid owns is the evaluation's: a sweep kills every process of
   the uid and removes every file it left in the host's shared temporary
   folders (``/tmp``, ``/dev/shm``, ...), at any depth, without having to
   know where.

The pool is ``SANDBOX_UID`` .. ``SANDBOX_UID + SANDBOX_UID_COUNT - 1`` (the
gid is the same number). A uid is taken by ``flock``-ing its lock file in a
root-only folder shared by every worker of the host; the kernel drops the
lock when its holder dies, however it dies. Taking a uid first scrubs it, so
the strays of a holder that died never meet the next evaluation.

The scrub (a scan of every process on the host) is skipped when the lock file
says ``clean``: a holder writes that only as it lets go of a uid it knows holds
nothing (``release(clean=True)``: scrubbed, or every command was seen to end
with all its processes, see ``Spawner.scrub``), and every taker erases it
first. A holder that dies leaves the mark erased, so its strays are scrubbed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evaluations.runtime import killer
from evaluations.runtime.sysvipc import remove_sysv_ipc
from evaluations.safefs import TreeUsage, remove_entry_nofollow

log = logging.getLogger(__name__)

# Host folders any uid may write into (mode 1777): without the sandbox, a command's
# files there are outside its session folder, so they are counted and scrubbed by owner.
SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
RUN_LOCK_DIR = Path("/run/term-executor/uids")


class UidPoolExhausted(RuntimeError):
    """Every uid of the pool is held by a running evaluation."""


_CLEAN = b"clean\n"


@dataclass
class UidLease:
    uid: int
    _fd: int | None

    def release(self, *, clean: bool = False) -> None:
        """Let go of the uid; ``clean``: it holds no process, file or IPC of ours (the next
        holder need not scrub it)."""
        if self._fd is not None:
            if clean:
                _mark(self._fd, _CLEAN)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> UidLease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_dir(data_dir: Path) -> Path:
    """``/run/term-executor/uids`` (one pool per host), else ``<data_dir>/uid-locks``."""
    for candidate in (RUN_LOCK_DIR, Path(data_dir) / "uid-locks"):
        try:
            _root_only_dir(candidate)
            return candidate
        except OSError as exc:
            log.warning("uid lock folder %s unusable (%s)", candidate, exc)
    raise RuntimeError("no usable folder for the uid lock files")


def _root_only_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(errno.EPERM, "not a folder of ours (a link, or owned by another uid)")
    if stat.S_IMODE(st.st_mode) & 0o022:
        os.chmod(path, 0o700)


def acquire(first: int, count: int, folder: Path) -> UidLease:
    """Take the lowest free uid of ``first .. first+count-1``, scrubbed; raise if none is free."""
    if first <= 0:
        raise ValueError("the uid pool must not contain root")
    for uid in range(first, first + count):
        fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        lease = UidLease(uid, fd)
        try:
            if os.pread(fd, len(_CLEAN) + 1, 0) != _CLEAN:
                scrub(uid)
            _mark(fd, b"")  # in use: if we die holding it, the next holder scrubs
        except BaseException:
            lease.release()
            raise
        return lease
    raise UidPoolExhausted(
        f"all {count} sandbox uids ({first}..{first + count - 1}) are in use; raise SANDBOX_UID_COUNT"
    )


def _mark(fd: int, state: bytes) -> None:
    os.ftruncate(fd, 0)
    if state:
        os.pwrite(fd, state, 0)


def scrub(
    uid: int,
    shared_dirs: tuple[str, ...] = SHARED_TMP_DIRS,
    *,
    keep: tuple[Path, ...] = (),
    spare: Callable[[], set[int]] | None = None,
) -> None:
    """Kill every process of ``uid`` (but those ``spare`` names), then remove its files in the
    shared folders (at any depth, ``keep`` excepted) and its SysV IPC."""
    kill_owned(uid, spare=spare)
    for folder in shared_dirs:
        remove_owned(uid, folder, keep=keep)
    remove_sysv_ipc(uid)


def kill_owned(uid: int, *, spare: Callable[[], set[int]] | None = None) -> int:
    """SIGKILL every process of ``uid`` until none is left (a fork storm forks while we kill);
    ``spare``: pids to leave alone (the spawner's background processes)."""
    if uid <= 0:
        raise ValueError("refusing to kill by uid 0")

    def find() -> list[killer.Proc]:
        kept = spare() if spare is not None else set()
        return [proc for proc in killer.owned_by(uid) if proc.pid not in kept]

    return killer.kill_until_none(find, f"uid {uid}")


def remove_owned(uid: int, folder: str, *, keep: tuple[Path, ...] = ()) -> int:
    """Remove what ``uid`` owns in ``folder``, at any depth, links never followed; return how many.

    An entry of the uid's goes with everything below it, whoever owns that (it was the uid's
    folder). Folders of others are searched, not removed: a root-owned 1777 folder (``/tmp/.X11-unix``)
    or one bubblewrap was once misled into making holds the uid's files as well as anyone's
    (issue 23: the scrub looked only at the top level). A folder the uid cannot search is
    skipped (nothing of its can be in it), as are ``keep`` (the evaluation's own session
    folder), other file systems and mount points (a bind mount of /usr on the same disk would
    otherwise be walked whole: seconds on every release), and anything deeper than
    ``SCRUB_DEPTH`` folders of others.
    """
    mounts = _mount_points()
    kept = set()
    for path in keep:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        kept.add((st.st_dev, st.st_ino))
    try:
        top_fd = os.open(folder, _DIR_FLAGS)
    except OSError:
        return 0
    try:
        return _remove_owned_below(uid, top_fd, folder, os.fstat(top_fd).st_dev, kept, mounts, SCRUB_DEPTH)
    finally:
        os.close(top_fd)


SCRUB_DEPTH = 64
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _mount_points() -> frozenset[str]:
    """Every mount point of this mount namespace (/proc/self/mountinfo's fifth field, unescaped)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
            fields = [line.split(" ", 5)[4] for line in handle if line.count(" ") >= 5]
    except OSError:
        return frozenset()
    return frozenset(_unescape_mountinfo(field) for field in fields)


def _unescape_mountinfo(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in a path as \\ooo (octal)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _remove_owned_below(
    uid: int, dir_fd: int, shown: str, dev: int, kept: set, mounts: frozenset[str], depth: int
) -> int:
    removed = 0
    try:
        with os.scandir(dir_fd) as it:
            entries = list(it)
    except OSError:
        return 0
    for entry in entries:
        path = f"{shown}/{entry.name}"
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid:
            try:
                remove_entry_nofollow(dir_fd, entry.name)
                removed += 1
            except OSError as exc:
                log.warning("could not remove %s left by uid %s: %s", path, uid, exc)
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_dev != dev or (st.st_dev, st.st_ino) in kept or path in mounts:
            continue
        if not _searchable_by(st, uid):
            continue
        if depth <= 0:
            log.warning("uid %s scrub: not searching below %s (deeper than %s folders)", uid, path, SCRUB_DEPTH)
            continue
        try:
            child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue  # gone, or swapped for a link since the scan
        try:
            removed += _remove_owned_below(uid, child, path, dev, kept, mounts, depth - 1)
        finally:
            os.close(child)
    return removed


def _searchable_by(st: os.stat_result, uid: int) -> bool:
    """Whether ``uid`` (its group the same number, no other groups) may pass through this folder."""
    bit = stat.S_IXGRP if st.st_gid == uid else stat.S_IXOTH
    return bool(st.st_mode & bit)


def owned_usage(uid: int, folders: tuple[str, ...] = SHARED_TMP_DIRS) -> TreeUsage:
    """Bytes and files of what ``uid`` owns directly under ``folders`` (for the disk quota and the
    file count)."""
    from evaluations.runtime.monitor import folder_usage

    total = TreeUsage()
    for folder in folders:
        for entry in _owned_entries(uid, folder):
            total += folder_usage(Path(entry.path))
    return total


def _owned_entries(uid: int, folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError:
        return []
    owned = []
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid == uid:
                owned.append(entry)
        except OSError:
            continue
    return owned
