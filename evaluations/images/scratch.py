"""The image store's ``tmp/``: what is in the making (a layer tree, a blob, an export's scratch), and
what killed processes left there (SPEC §21).

1. Each entry ``tmp/<name>`` has a lock ``tmp/<name>.lock`` that its owner creates and flocks
   *before* making the entry, and unlinks only after the entry is gone (removed, or renamed into
   the store). So an entry whose lock is free, or missing, was left by a dead owner.
2. ``remove_dead`` removes only such entries (a live pull's survive), then locks left without an
   entry whose owner is gone. An owner that finds its fresh lock removed between its create and
   its flock (a reaper took it for an orphan) takes another name.
3. ``usage`` is what the entries take of the disk (allocated blocks): the store counts it in its
   size, so what a killed pull left shows in ``image list`` and IMAGES_MAX_BYTES until reaped.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from evaluations import safefs

logger = logging.getLogger("term_executor.images")
LOCK = ".lock"


@contextlib.contextmanager
def entry(tmp: Path, prefix: str) -> Iterator[Path]:
    """A fresh name in ``tmp`` for the block to make (a file or a folder), its lock held until what
    is at the name is gone. Whatever is still at the name when the block ends is removed."""
    while True:
        name = f"{prefix}.{os.getpid()}.{os.urandom(6).hex()}"
        lock = tmp / f"{name}{LOCK}"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # a reaper that saw the lock before our flock removed it as an orphan: take another name
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    path = tmp / name
    try:
        yield path
    finally:
        try:
            if _is_folder(path):
                safefs.remove_tree_nofollow(path)
            elif os.path.lexists(path):
                path.unlink()
            lock.unlink()
        finally:
            os.close(fd)


def remove_dead(tmp: Path) -> tuple[int, int]:
    """Entries of ``tmp`` whose lock no process holds, and locks left without an entry: (entries
    removed, bytes freed). A live owner's entry and lock are never touched."""
    removed = freed = 0
    names = sorted(os.listdir(tmp))
    entries = [name for name in names if not name.endswith(LOCK)]
    for name in entries:
        path, lock = tmp / name, tmp / f"{name}{LOCK}"
        with _free_lock(lock) as free:
            if not free:
                continue
            size = _entry_bytes(path)
            try:
                if _is_folder(path):
                    safefs.remove_tree_nofollow(path)
                else:
                    path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                logger.warning("could not remove %s from the image store's tmp yet: %s", path, exc)
                continue
            removed, freed = removed + 1, freed + size
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
    for name in names:  # a lock whose owner died before making its entry, or while removing it
        if name.endswith(LOCK) and name.removesuffix(LOCK) not in entries:
            with _free_lock(tmp / name) as free:
                if free and not os.path.lexists(tmp / name.removesuffix(LOCK)):
                    with contextlib.suppress(FileNotFoundError):
                        (tmp / name).unlink()
    return removed, freed


def usage(tmp: Path) -> int:
    """Bytes of disk the entries of ``tmp`` use, live or dead."""
    return sum(_entry_bytes(tmp / name) for name in os.listdir(tmp) if not name.endswith(LOCK))


@contextlib.contextmanager
def _free_lock(lock: Path) -> Iterator[bool]:
    """Whether no process holds ``lock`` (a missing lock is free), holding it meanwhile if so."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _is_folder(path: Path) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return stat.S_ISDIR(os.lstat(path).st_mode)
    return False


def _entry_bytes(path: Path) -> int:
    try:
        return safefs.tree_size(path) if _is_folder(path) else os.lstat(path).st_blocks * 512
    except OSError:
        return 0
