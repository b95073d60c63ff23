"""A cache entry's folders in a session: private, writable overlays, as the evaluation's uid.

Each session folder from an entry is an overlay: the entry, idmapped so
its root-owned files are the evaluation's uid's, under an upper folder in
the session (so the disk quota counts what the evaluation writes, not the
entry). Files recording the session path (venv launchers, ``.pth`` files of
editable installs) are rewritten in the overlay: session paths all have one
length (WORKSPACE_BASE/<uuid>), part of the key.

1. ``detached_folder(entry, name, root, uid, layers=...)``: an overlay of the
   entry's folder, attached nowhere until ``mounts.attach_closing`` puts it at
   ``<root>/<name>`` (so it can be made ahead of its use: the tests' HOME and
   venv, while the agent runs); its layers ``<root>/.layers/<layers>.upper``
   and ``.work`` (``make_layers``), the entry bound at ``.layers/lower`` while
   it is made.
2. ``unmount_folder`` and ``unmount_session``: one folder with its layers, or
   every mount below the session (its layers then go with the session folder).
3. ``rewrite_session_paths``: the building session's path, in the files the
   entry's manifest lists, becomes this session's (through the overlay before
   it is attached).
4. ``idmapped_bind``: a folder of root's (the mirror) bound for the time of a
   ``with`` block, as the evaluation's uid (cache/mounts.py has the kernel side).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evaluations.cache import mounts
from evaluations.cache.store import Entry
from evaluations.safefs import open_parent, remove_tree_nofollow

LAYERS = ".layers"  # <session>/.layers/: <layers>.upper and .work for each overlay, and lower; root's
LOWER = "lower"  # the mount point each overlay's idmapped lower layer is bound on while it is made


def detached_folder(
    entry: Entry, name: str, root: Path, uid: int, *, layers: str, manifest=None, old: str = ""
) -> int | None:
    """A private, writable overlay of the entry's folder ``name``, as ``uid``, attached nowhere: its
    mount descriptor (``mounts.attach_closing`` puts it at ``<root>/<name>``; closed unattached, it
    is gone); its layers ``make_layers(root, layers)``; the session paths its ``manifest`` lists
    rewritten from ``old`` through it (``rewrite_session_paths``). None if none is needed."""
    source = entry.folder(name)
    if name == "venv" and not any(source.iterdir()):
        return None  # no venv was made (no Python): the folder stays the session's empty, root-owned one
    # The overlay's root takes its owner and mode from the upper folder.
    upper, work = make_layers(root, layers, (uid, uid), stat.S_IMODE(os.lstat(source).st_mode))
    lower = root / LAYERS / LOWER  # one mount point for every overlay's lower, one at a time
    try:
        lower.mkdir(mode=0o700)
    except FileExistsError:
        pass
    mounts.bind_idmapped(source, lower, mounts.userns_fd(uid))
    try:
        ready = mounts.overlay_detached(lower, upper, work)
    finally:
        mounts.unmount(lower)  # the overlay keeps its own reference: the entry is reachable only through it
    try:
        if manifest is not None and old != str(root):
            rewrite_session_paths(ready, uid, name, old=old, new=str(root), manifest=manifest)
    except BaseException:
        os.close(ready)
        raise
    return ready


def make_layers(root: Path, name: str, owner: tuple[int, int], mode: int) -> tuple[Path, Path]:
    """An overlay's upper and work folders, ``<root>/.layers/<name>.upper`` and ``.work`` (two new
    folders an overlay, side by side: each is an inode to make and to remove), root's, 0700; the
    upper, which the overlay's root takes its owner and mode from, ``owner``'s with ``mode``.
    Raises FileExistsError if they are there."""
    layers = root / LAYERS
    try:
        layers.mkdir(mode=0o700)
    except FileExistsError:
        pass
    upper, work = layers / f"{name}.upper", layers / f"{name}.work"
    upper.mkdir(mode=0o700)
    work.mkdir(mode=0o700)
    os.chown(upper, *owner)
    os.chmod(upper, mode)
    return upper, work


def remove_layers(root: Path, name: str) -> None:
    """``make_layers``' folders, with what was written in them."""
    for suffix in (".upper", ".work"):
        remove_tree_nofollow(root / LAYERS / f"{name}{suffix}")


def unmount_folder(root: Path, name: str, layers: str | None = None) -> None:
    """Take ``<root>/<name>``'s overlay down, with its layers (``layers``', by default ``<name>``'s:
    what the evaluation wrote there goes)."""
    mounts.unmount(root / name)
    remove_layers(root, layers or name)


def unmount_session(root: Path) -> None:
    """Every mount at or under the session folder. The layers stay, root's, inside it: they go
    with the session folder (removed after the evaluation's end is written, ``remove_retired``; or
    kept with it), so the end does not wait for a walk of what the evaluation wrote in them."""
    mounts.unmount_below(root)


def rewrite_session_paths(folder: Path | int, uid: int, name: str, *, old: str, new: str, manifest: dict) -> None:
    """``old`` (the building session's path) becomes ``new`` (this session's) in the files of ``name``
    the manifest lists (paths that start with ``name/``); ``folder``: that folder (a path, or a
    handle of it: a mount not attached yet)."""
    old_b, new_b = os.fsencode(old), os.fsencode(new)
    for relpath in _below(manifest.get("rewrite", []), name):
        _edit_file(folder, relpath, lambda data: data.replace(old_b, new_b))
    for relpath in _below(manifest.get("links", []), name):
        dir_fd, name_in_dir = open_parent(folder, relpath, create=False)
        try:
            target = os.readlink(name_in_dir, dir_fd=dir_fd).replace(old, new)
            os.unlink(name_in_dir, dir_fd=dir_fd)
            os.symlink(target, name_in_dir, dir_fd=dir_fd)
            os.chown(name_in_dir, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(dir_fd)


def _below(relpaths: list[str], name: str) -> list[str]:
    """The manifest's paths of folder ``name``, relative to it."""
    return [relpath.split("/", 1)[1] for relpath in relpaths if "/" in relpath and relpath.split("/", 1)[0] == name]


def _edit_file(folder: Path | int, relpath: str, change) -> None:
    dir_fd, name = open_parent(folder, relpath, create=False)
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)  # copied up here
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "r+b") as handle:
        data = change(handle.read())
        handle.seek(0)
        handle.write(data)
        handle.truncate()


@contextmanager
def idmapped_bind(source: Path, point: Path, uid: int, *, writable: bool) -> Iterator[None]:
    """``source`` at ``point`` (made, then removed) as ``uid``'s for the ``with`` block."""
    point.mkdir(mode=0o700, exist_ok=True)
    mounts.bind_idmapped(source, point, mounts.userns_fd(uid), writable=writable)
    try:
        yield
    finally:
        mounts.unmount(point)
        point.rmdir()
