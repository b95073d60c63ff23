"""File-system helpers that never follow a symbolic link.

The repository and the session folder are written by untrusted agent code
before the service writes into them again (test support files) or measures
and deletes them (disk quota and file count, cleanup, reaper). Any path
component there may be a planted symlink, so every helper here walks with
directory file descriptors (``openat``-style, ``O_NOFOLLOW``) instead of
path strings:

1. a symlink is never followed, whichever component it is;
2. walks are iterative with one descriptor open at a time, so a tree nested
   thousands of levels deep (longer than ``PATH_MAX``) cannot make cleanup
   or the disk check fail or undercount.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SafeFSError(OSError):
    """A write or walk refused because a path component is unsafe."""


def split_relpath(relpath: str) -> list[str]:
    """Split a relative path into components; refuse absolute paths and ``..``."""
    if not isinstance(relpath, str) or not relpath:
        raise SafeFSError(f"invalid relative path {relpath!r}")
    if "\0" in relpath:
        raise SafeFSError(f"path {relpath!r} contains a NUL byte")
    if relpath.startswith("/"):
        raise SafeFSError(f"path {relpath!r} is absolute")
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SafeFSError(f"path {relpath!r} contains '..'")
    if not parts:
        raise SafeFSError(f"path {relpath!r} names no file")
    return parts


def open_root_dir(root: Path | str | int) -> int:
    """Open ``root`` as a directory; its last component must not be a symlink. An ``int`` is a
    folder handle the caller holds (one resolved in an image's root: images/inroot.py): a copy."""
    if isinstance(root, int):
        return os.dup(root)
    try:
        return os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise SafeFSError(f"cannot open folder {root}: {_reason(exc)}") from None


def open_subdir(dir_fd: int, parts: list[str], *, create: bool, shown: str = "") -> int:
    """Walk ``parts`` below ``dir_fd`` one component at a time; return a new fd.

    Each component is opened with ``O_NOFOLLOW|O_DIRECTORY``: a symlink or a
    non-folder anywhere on the way is refused. Missing folders are created
    (mode 0o755) when ``create`` is true. The caller closes the returned fd.
    """
    fd = os.dup(dir_fd)
    walked: list[str] = []
    try:
        for part in parts:
            walked.append(part)
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                where = "/".join(walked)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    kind = _kind_at(fd, part)
                    raise SafeFSError(f"cannot write {shown or '/'.join(parts)}: {where} is {kind}") from None
                raise SafeFSError(f"cannot open folder {where}: {_reason(exc)}") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_parent(root: Path | str | int, relpath: str, *, create: bool, shown: str = "") -> tuple[int, str]:
    """The folder holding ``root/relpath``, opened without following a symlink, and the last name.

    The caller closes the descriptor. ``create``, ``shown``: as open_subdir's.
    """
    parts = split_relpath(relpath)
    root_fd = open_root_dir(root)
    try:
        return open_subdir(root_fd, parts[:-1], create=create, shown=shown), parts[-1]
    finally:
        os.close(root_fd)


def write_file_nofollow(root: Path | str | int, relpath: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``root/relpath`` without following any symlink.

    Missing parent folders are created. Any parent component that is a
    symlink or not a folder is refused. The file is written to a fresh
    temporary name (``O_EXCL|O_NOFOLLOW``) and renamed over the final name:
    an existing regular file is replaced atomically, and a symlink planted at
    the final name is replaced itself, never written through.
    """
    dir_fd, name = open_parent(root, relpath, create=True, shown=relpath)
    try:
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise SafeFSError(f"cannot write {relpath}: it is a folder")
        except FileNotFoundError:
            pass

        def fill(fd: int) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

        replace_at(dir_fd, name, fill, mode & 0o7777)
    except SafeFSError:
        raise
    except OSError as exc:
        raise SafeFSError(f"cannot write {relpath}: {_reason(exc)}") from None
    finally:
        os.close(dir_fd)


def read_file_at(dir_fd: int, name: str, *, max_bytes: int, shown: str) -> bytes | None:
    """The bytes of the regular file ``name`` in the folder open as ``dir_fd``; None if nothing has that name.

    For files untrusted code wrote: a link is refused, never followed (``O_NOFOLLOW``); a FIFO
    cannot block the reader (``O_NONBLOCK``) nor a device be opened (refused from ``lstat``
    first); a file over ``max_bytes`` is refused from its size, before a byte is read, and one
    that grows past it while being read is refused too. Every refusal is a ``SafeFSError``
    whose sentence names the file as ``shown``.
    """
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SafeFSError(f"{shown} cannot be read: {_reason(exc)}") from None
    if not stat.S_ISREG(mode):
        raise SafeFSError(f"{shown} is {_kind_of(mode)}, not a file")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: swapped for a link since the lstat
        raise SafeFSError(f"{shown} cannot be read: {_reason(exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SafeFSError(f"{shown} is {_kind_of(st.st_mode)}, not a file")
        if st.st_size > max_bytes:
            raise SafeFSError(f"{shown} is {st.st_size} bytes, over the cap of {max_bytes} bytes")
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise SafeFSError(f"{shown} grew over the cap of {max_bytes} bytes while it was read")
        return b"".join(chunks)
    except SafeFSError:
        raise
    except OSError as exc:
        raise SafeFSError(f"{shown} cannot be read: {_reason(exc)}") from None
    finally:
        os.close(fd)


def clear_way(root: Path | str | int, relpath: str) -> None:
    """Make room for a file the service writes at ``root/relpath``, whatever stands in its way.

    A parent component that is not a real folder (a link, a file, a FIFO) is unlinked, a
    folder at the final name removed with everything below it; links are never followed.
    For a tree no process is changing any more (a swept session), before
    ``write_file_nofollow``: the file then lands where it belongs instead of being refused.
    """
    parts = split_relpath(relpath)
    fd = open_root_dir(root)
    try:
        for depth, part in enumerate(parts):
            try:
                mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return  # nothing in the way from here on: the writer creates the rest
            last = depth == len(parts) - 1
            if not stat.S_ISDIR(mode):
                if not last:  # at the final name anything but a folder is renamed over
                    os.unlink(part, dir_fd=fd)
                return
            if last:
                remove_tree_nofollow(f"/proc/self/fd/{fd}/{part}")  # the fd's own folder, then no link
                return
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except PermissionError:  # a folder its owner made unreadable (a service without root)
                child = _open_forcing_access(fd, part)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def replace_at(dir_fd: int, name: str, fill, mode: int, owner: int | None = None) -> None:
    """Create ``name`` in the folder open at ``dir_fd`` as a new file: written by ``fill(fd)`` under a
    temporary name, then renamed over whatever is there (a planted link is replaced, never followed)."""
    tmp = f".{name[:200]}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            fill(fd)
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, owner, owner)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def remove_tree_nofollow(path: Path | str) -> None:
    """Delete ``path`` and everything below it, never following a symlink.

    A symlink at ``path`` itself is unlinked (its target is left alone).
    Symlinks inside are unlinked as entries. Folders the agent made
    unreadable or unwritable are given back owner permissions first. The
    walk does not cross into another file system (a stray mount point is an
    error, not something to empty). A missing ``path`` is not an error.

    ``shutil.rmtree`` is also symlink-safe on Linux (``avoids_symlink_attacks``)
    but recurses, so a tree a few thousand folders deep breaks it.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    top_fd = open_root_dir(path)
    try:
        _make_usable(top_fd)
        walk_nofollow(top_fd, on_entry=_unlink_entry, on_leave=_rmdir_entry)
    finally:
        os.close(top_fd)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


# How long the reapers keep trying to remove what a lost evaluation's or sandbox's process still
# writes into or holds: an evaluation's watch (pipeline/cancel.py, every 1 s) plus the kill of its
# command and its cleanup; a sandbox process's last moments after it stopped showing as tagged.
REMOVAL_PATIENCE_SECS = 3.0


def remove_patiently(remove: Callable[[], object], patience_secs: float = REMOVAL_PATIENCE_SECS) -> OSError | None:
    """Call ``remove`` until it succeeds, for up to ``patience_secs``: what a process that is still
    ending (its row ended a moment ago, or its kill not yet complete) writes into or holds can refuse
    a removal for a moment. A FileNotFoundError is success: another remover got there first. Returns
    the last error when patience ran out, None when it succeeded (the reapers log the error and leave
    the rest to their next pass)."""
    deadline = time.monotonic() + patience_secs
    while True:
        try:
            remove()
            return None
        except FileNotFoundError:
            return None
        except OSError as exc:
            if time.monotonic() >= deadline:
                return exc
            time.sleep(0.25)


def remove_entry_nofollow(dir_fd: int, name: str) -> None:
    """``remove_tree_nofollow`` for the entry ``name`` of the open folder ``dir_fd``: no path
    is resolved again, so a link swapped in above it cannot redirect the removal."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink_entry(dir_fd, name)
        return
    try:
        top_fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.EACCES:
            raise
        top_fd = _open_forcing_access(dir_fd, name)
    try:
        _make_usable(top_fd)
        walk_nofollow(top_fd, on_entry=_unlink_entry, on_leave=_rmdir_entry)
    finally:
        os.close(top_fd)
    _rmdir_entry(dir_fd, name)


def copy_tree_nofollow(src: Path | str, dst: Path | str, uid: int | None) -> None:
    """Copy the folder ``src`` to the new folder ``dst``, owned by ``uid`` (when given).

    Links are copied as links, never followed; FIFOs, sockets and devices are
    skipped. For a tree no process is changing any more (a swept session):
    it walks by path. A tree too deep to copy raises ``SafeFSError``.
    """

    def special(folder: str, names: list[str]) -> set[str]:
        skipped = set()
        for name in names:
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                skipped.add(name)
        return skipped

    try:
        shutil.copytree(src, dst, symlinks=True, ignore=special)
        if uid is not None:
            os.chown(dst, uid, uid, follow_symlinks=False)
            for folder, dirs, files in os.walk(dst):
                for name in (*dirs, *files):
                    os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
    except (RecursionError, shutil.Error) as exc:
        raise SafeFSError(f"cannot copy {src}: {str(exc)[:200]}") from None


@dataclass(frozen=True)
class TreeUsage:
    """What a tree holds on disk: allocated bytes, and inodes (files, folders, links)."""

    bytes: int = 0
    files: int = 0

    def __add__(self, other: TreeUsage) -> TreeUsage:
        return TreeUsage(self.bytes + other.bytes, self.files + other.files)

    def __sub__(self, other: TreeUsage) -> TreeUsage:
        return TreeUsage(self.bytes - other.bytes, self.files - other.files)


def tree_size(path: Path | str) -> int:
    """Bytes of disk used by ``path`` and everything below it (see ``tree_usage``)."""
    return tree_usage(path).bytes


def tree_usage(path: Path | str, *, one_device: bool = False) -> TreeUsage:
    """Bytes and inodes used by ``path`` and everything below it (links not followed), in one walk.
    ``one_device``: folders on another file system (a mount below ``path``) are not entered.

    Bytes are allocated blocks (``st_blocks * 512``): what a disk quota is about,
    so sparse files count what they really use. Files are inodes, ``path`` itself
    included: 300,000 empty files use a few MB of blocks but 300,000 inodes.
    Hard-linked files count once in both. Entries that vanish or cannot be read
    during the walk are skipped.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return TreeUsage()
    top = TreeUsage(st.st_blocks * 512, 1)
    if not stat.S_ISDIR(st.st_mode):
        return top
    seen: set[tuple[int, int]] = set()
    counts = [top.bytes, top.files]

    def on_entry(dir_fd: int, entry: os.DirEntry) -> None:
        try:
            est = entry.stat(follow_symlinks=False)
        except OSError:
            return
        if est.st_nlink > 1 and not stat.S_ISDIR(est.st_mode):
            key = (est.st_dev, est.st_ino)
            if key in seen:
                return
            seen.add(key)
        counts[0] += est.st_blocks * 512
        counts[1] += 1

    def on_dir(dir_fd: int, entry: os.DirEntry) -> bool:
        on_entry(dir_fd, entry)
        try:
            return not one_device or entry.stat(follow_symlinks=False).st_dev == st.st_dev
        except OSError:
            return False

    try:
        top_fd = open_root_dir(path)
    except SafeFSError:
        return top
    try:
        walk_nofollow(top_fd, on_entry=on_entry, on_dir=on_dir, on_leave=None, tolerant=True)
    finally:
        os.close(top_fd)
    return TreeUsage(counts[0], counts[1])


def up_to_parent(fd: int, ident: tuple[int, int], what: str) -> int:
    """A handle of the folder above ``fd``, reached through ``..``: it must be the folder (device,
    inode) ``ident`` the walk came down from, or the tree moved meanwhile and the walk stops
    (SafeFSError ``what``). ``fd`` stays the caller's to close."""
    parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
    st = os.fstat(parent)
    if (st.st_dev, st.st_ino) != ident:
        os.close(parent)
        raise SafeFSError(what)
    return parent


# -- the walker -------------------------------------------------------------


def walk_nofollow(
    top_fd: int,
    *,
    on_entry: Callable[[int, os.DirEntry], None],
    on_leave: Callable[[int, str], None] | None,
    on_dir: Callable[[int, os.DirEntry], bool | None] | None = None,
    tolerant: bool = False,
    on_enter: Callable[[int, str], None] | None = None,
) -> None:
    """Post-order walk below ``top_fd`` holding one directory fd at a time.

    1. Each folder is scanned once: ``on_entry(dir_fd, entry)`` for every
       non-folder, ``on_dir`` for every folder; sub-folders are queued
       (unless ``on_dir`` returned False: that one is not entered).
    2. A sub-folder is entered with ``openat(O_NOFOLLOW|O_DIRECTORY)``; the
       parent's (device, inode) is remembered on a stack of plain data;
       ``on_enter(its fd, its name)`` runs before it is scanned.
    3. Leaving goes back up through ``..`` and checks the identity, so a
       folder moved during the walk stops it instead of misdirecting it;
       then ``on_leave(parent_fd, name)`` runs (rmdir for removal).
    """
    top_dev = os.fstat(top_fd).st_dev
    fd = os.dup(top_fd)
    stack: list[tuple[list[str], str, tuple[int, int]]] = []
    name = ""
    try:
        pending = _scan(fd, on_entry, on_dir, tolerant)
        while True:
            if pending:
                child = pending.pop()
                try:
                    child_fd = os.open(child, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.EACCES and not tolerant:
                        child_fd = _open_forcing_access(fd, child)
                    elif exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR) or tolerant:
                        continue  # vanished or replaced by a non-folder since the scan
                    else:
                        raise
                if os.fstat(child_fd).st_dev != top_dev:
                    os.close(child_fd)
                    if tolerant:
                        continue
                    raise SafeFSError(f"refusing to cross into another file system at {child}")
                if not tolerant:
                    _make_usable(child_fd)
                parent = os.fstat(fd)
                stack.append((pending, name, (parent.st_dev, parent.st_ino)))
                os.close(fd)
                fd, name = child_fd, child
                if on_enter is not None:
                    on_enter(fd, name)
                pending = _scan(fd, on_entry, on_dir, tolerant)
                continue
            if not stack:
                return
            pending, parent_name, ident = stack.pop()
            parent_fd = up_to_parent(fd, ident, "folder tree changed while it was being walked")
            os.close(fd)
            fd = parent_fd
            if on_leave is not None:
                on_leave(fd, name)
            name = parent_name
    finally:
        os.close(fd)


def _scan(dir_fd, on_entry, on_dir, tolerant) -> list[str]:
    subdirs = []
    try:
        with os.scandir(dir_fd) as it:
            entries = list(it)
    except OSError:
        if tolerant:
            return []
        raise
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir:
            if on_dir is None or on_dir(dir_fd, entry) is not False:
                subdirs.append(entry.name)
        else:
            on_entry(dir_fd, entry)
    subdirs.reverse()  # popped from the end: visit in scan order
    return subdirs


def _unlink_entry(dir_fd: int, entry: os.DirEntry | str) -> None:
    try:
        os.unlink(entry if isinstance(entry, str) else entry.name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _rmdir_entry(parent_fd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        pass


def _make_usable(dir_fd: int) -> None:
    """Give the owner rwx on a folder so its entries can be listed and removed."""
    mode = os.fstat(dir_fd).st_mode
    if mode & 0o700 != 0o700:
        try:
            os.fchmod(dir_fd, stat.S_IMODE(mode) | 0o700)
        except OSError:
            pass


def _open_forcing_access(dir_fd: int, name: str) -> int:
    """Open a folder whose mode forbids reading: chmod it through an O_PATH fd."""
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        # /proc/self/fd/N names the folder already opened without following links.
        os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(path_fd)


def _kind_at(dir_fd: int, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return "not a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a folder"


def _kind_of(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "a special file"


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def unix_address(folder_fd: int, name: str) -> str:
    """An AF_UNIX address for ``name`` in the folder open as ``folder_fd``, whatever the folder's
    path length: the kernel caps a socket path at 107 bytes, which a DATA_DIR a few folders deep
    passes (``AF_UNIX path too long``), while this path is always about 25 bytes."""
    return f"/proc/self/fd/{folder_fd}/{name}"
