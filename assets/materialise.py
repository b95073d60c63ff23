"""Putting an asset's files somewhere without ever following a link the wrong way.

``copy_asset`` copies an asset to ``<dest>/<save_path>``: the agent's copy
in the repository (owned by the sandbox uid) and the readable staging copy
of a task asset (owned by root). The destination may hold links planted by
the repository or by install commands, and the source may hold links of its
own, so:

1. The parents of ``save_path`` are walked from ``dest`` one component at a
   time with ``O_NOFOLLOW``; missing ones are created (and given to
   ``owner``); a link or a file on the way is refused, never written through.
2. A file is written to a fresh name (``O_EXCL|O_NOFOLLOW``) and renamed
   over the final one, so a link planted there is replaced, not followed.
   A folder is created, or merged into a folder already there; a file or
   link in its place is removed first.
3. Inside a folder asset, files and folders are copied; a link is recreated
   only when it is relative and resolves inside the asset's folder (so it
   points at the copy), any other link is left out; sockets, FIFOs and
   devices are left out. Source entries are opened relative to their
   folder's descriptor with ``O_NOFOLLOW``.
4. Files get mode 0644 (0755 when the source is executable by anyone),
   folders 0755: readable by the sandbox uid, writable only by ``owner``.
5. ``max_bytes`` caps what one call copies (the session's disk quota).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from assets.model import Asset, AssetError
from evaluations.safefs import replace_at

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1024 * 1024
DIR_MODE = 0o755


def copy_asset(asset: Asset, dest: Path | int, *, owner: int | None, max_bytes: int | None = None) -> int:
    """Copy ``asset.source`` to ``dest/<asset.save_path>``; return the bytes copied. ``dest``: a
    folder, or a handle of one the caller holds (a WorkingDir resolved in an image's root)."""
    copier = _Copier(asset, owner, max_bytes)
    try:
        _copy(copier, asset, dest)
    except AssetError:
        raise
    except OSError as exc:
        raise copier.fail(exc.strerror or str(exc)) from None
    return copier.copied


def _copy(copier: _Copier, asset: Asset, dest: Path | int) -> None:
    parts = asset.save_path.split("/")
    parent_fd = copier.open_parents(dest, parts[:-1])
    try:
        if asset.kind == "file":
            src_fd = copier.open_source(str(asset.source), os.O_RDONLY)
            try:
                copier.copy_file(src_fd, os.fstat(src_fd), parent_fd, parts[-1], asset.save_path)
            finally:
                os.close(src_fd)
        else:
            top_fd = copier.open_source(str(asset.source), _DIR_FLAGS)
            try:
                copier.copy_tree(top_fd, copier.folder_at(parent_fd, parts[-1], asset.save_path))
            finally:
                os.close(top_fd)
    finally:
        os.close(parent_fd)


def link_asset(asset: Asset, dest: Path, target: Path) -> None:
    """Make ``dest/<asset.save_path>`` a symbolic link to ``target`` (parents created, never followed)."""
    copier = _Copier(asset, None, None)
    parts = asset.save_path.split("/")
    try:
        parent_fd = copier.open_parents(dest, parts[:-1])
        try:
            copier.clear(parent_fd, parts[-1], asset.save_path)
            os.symlink(str(target), parts[-1], dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
    except AssetError:
        raise
    except OSError as exc:
        raise copier.fail(exc.strerror or str(exc)) from None


def tree_bytes(path: Path) -> int:
    """The apparent size of a file, or of every regular file below a folder (links not followed)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = 0
    for folder, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                entry = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(entry.st_mode):
                total += entry.st_size
    return total


class _Copier:
    def __init__(self, asset: Asset, owner: int | None, max_bytes: int | None):
        self.asset = asset
        self.owner = owner
        self.max_bytes = max_bytes
        self.copied = 0

    def fail(self, why: str) -> AssetError:
        return AssetError(f"static asset {self.asset.name!r}: cannot copy it to {self.asset.save_path!r}: {why}")

    def open_source(self, path: str, flags: int) -> int:
        try:
            return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise AssetError(
                f"static asset {self.asset.name!r}: cannot read {self.asset.path!r}: {exc.strerror}"
            ) from None

    def open_parents(self, dest: Path | int, parts: list[str]) -> int:
        try:
            fd = os.dup(dest) if isinstance(dest, int) else os.open(dest, _DIR_FLAGS)
        except OSError as exc:
            raise self.fail(f"cannot open {dest}: {exc.strerror}") from None
        try:
            for depth, part in enumerate(parts, 1):
                child = self.folder_at(fd, part, "/".join(parts[:depth]), replace=False)
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def folder_at(self, parent_fd: int, name: str, shown: str, *, replace: bool = True) -> int:
        """Open folder ``name`` below ``parent_fd``, creating it; a non-folder there is replaced or refused."""
        kind = _kind_at(parent_fd, name)
        if kind not in ("missing", "folder"):
            if not replace:
                raise self.fail(f"{shown} is {kind}")
            os.unlink(name, dir_fd=parent_fd)
            kind = "missing"
        if kind == "missing":
            try:
                os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self.fail(f"{shown} is {_kind_at(parent_fd, name)}") from None
            raise self.fail(f"cannot open {shown}: {exc.strerror}") from None
        if kind == "missing":
            os.fchmod(fd, DIR_MODE)  # whatever the umask
            if self.owner is not None:
                os.fchown(fd, self.owner, self.owner)
        return fd

    def clear(self, dir_fd: int, name: str, shown: str) -> None:
        """Remove a file or link at ``name``; a folder there is refused."""
        kind = _kind_at(dir_fd, name)
        if kind == "folder":
            raise self.fail(f"{shown} is a folder")
        if kind != "missing":
            os.unlink(name, dir_fd=dir_fd)

    def copy_file(self, src_fd: int, src_stat: os.stat_result, dir_fd: int, name: str, shown: str) -> None:
        if _kind_at(dir_fd, name) == "folder":
            raise self.fail(f"{shown} is a folder")

        def fill(out: int) -> None:
            while chunk := os.read(src_fd, _CHUNK):
                self._count(len(chunk))
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]

        replace_at(dir_fd, name, fill, 0o755 if src_stat.st_mode & 0o111 else 0o644, self.owner)

    def copy_tree(self, src_top: int, dst_top: int) -> None:
        """Copy the folder open at ``src_top`` into the one open at ``dst_top`` (closed here).

        Depth first, one pair of descriptors per level being copied.
        """
        try:
            src_dup = os.dup(src_top)
        except BaseException:
            os.close(dst_top)
            raise
        frames: list[tuple[int, int, str, list[os.DirEntry]]] = [(src_dup, dst_top, "", [])]
        try:
            frames[0] = (src_dup, dst_top, "", _entries(src_dup))
            while frames:
                src_fd, dst_fd, rel, entries = frames[-1]
                if not entries:
                    frames.pop()
                    os.close(src_fd)
                    os.close(dst_fd)
                    continue
                entry = entries.pop()
                shown = f"{self.asset.save_path}/{rel}{entry.name}"
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    child_src = os.open(entry.name, _DIR_FLAGS, dir_fd=src_fd)
                    try:
                        child_dst = self.folder_at(dst_fd, entry.name, shown)
                    except BaseException:
                        os.close(child_src)
                        raise
                    frames.append((child_src, child_dst, f"{rel}{entry.name}/", []))
                    frames[-1] = (child_src, child_dst, f"{rel}{entry.name}/", _entries(child_src))
                elif stat.S_ISREG(mode):
                    fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_fd)
                    try:
                        self.copy_file(fd, os.fstat(fd), dst_fd, entry.name, shown)
                    finally:
                        os.close(fd)
                elif stat.S_ISLNK(mode):
                    target = os.readlink(entry.name, dir_fd=src_fd)
                    if _stays_inside(str(self.asset.source), rel, target):
                        self.clear(dst_fd, entry.name, shown)
                        os.symlink(target, entry.name, dir_fd=dst_fd)
                        if self.owner is not None:
                            os.chown(entry.name, self.owner, self.owner, dir_fd=dst_fd, follow_symlinks=False)
        finally:
            for src_fd, dst_fd, _rel, _entries_left in frames:
                os.close(src_fd)
                os.close(dst_fd)

    def _count(self, size: int) -> None:
        self.copied += size
        if self.max_bytes is not None and self.copied > self.max_bytes:
            raise AssetError(
                f"static asset {self.asset.name!r}: copying it needs more than {self.max_bytes} bytes (the disk quota)"
            )


def _stays_inside(folder: str, rel: str, target: str) -> bool:
    """Whether a link at ``<folder>/<rel><name>`` to ``target`` is relative and resolves inside ``folder``.

    Resolved in the source, other links included, so a chain that leaves
    the folder (``up -> .`` then ``x -> up/..``) is caught. An absolute
    target is refused even when it points inside: in the copy it would
    point back at the source.
    """
    if not target or target.startswith("/"):
        return False
    resolved = os.path.realpath(os.path.join(folder, rel, target))
    return resolved == folder or resolved.startswith(folder.rstrip("/") + "/")


def _entries(dir_fd: int) -> list[os.DirEntry]:
    with os.scandir(dir_fd) as it:
        return sorted(it, key=lambda entry: entry.name)


def _kind_at(dir_fd: int, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a file" if stat.S_ISREG(mode) else "not a folder"
