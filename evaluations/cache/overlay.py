"""A cache entry's folders in a session: private, writable overlays, as the evaluation's uid.

Each session folder from an entry is an overlay: the entry, idmapped so
its root-owned files are the evaluation's uid's, under an upper folder in
the session (so the disk quota counts what the evaluation writes, not the
entry). Files recording the session path (venv launchers, ``.pth`` files of
editable installs) are rewritten in the overlay: session paths all have one
length (WORKSPACE_BASE/<uuid>), part of the key.

1. ``mount_folder(entry, name, root, uid)``: ``<root>/<name>`` over the
   entry's folder, its layers in ``<root>/.layers/<name>/{lower,upper,work}``.
2. ``unmount_folder`` and ``unmount_session``: one folder with its layers, or
   every mount below the session (its layers then go with the session folder).
3. ``rewrite_session_paths``: the building session's path, in the files the
   entry's manifest lists, becomes this session's.
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

LAYERS = ".layers"  # <session>/.layers/<folder>/{lower,upper,work}, root's


def mount_folder(entry: Entry, name: str, root: Path, uid: int) -> bool:
    """``<root>/<name>``: a private, writable overlay of the entry's folder, as ``uid``; False if none is needed."""
    source = entry.folder(name)
    if name == "venv" and not any(source.iterdir()):
        return False  # no venv was made (no Python): the folder stays the session's empty, root-owned one
    layers = root / LAYERS
    layers.mkdir(mode=0o700, exist_ok=True)
    base = layers / name
    base.mkdir(mode=0o700)
    lower, upper, work = base / "lower", base / "upper", base / "work"
    for folder in (lower, upper, work):
        folder.mkdir(mode=0o700)
    # The overlay's root takes its owner and mode from the upper folder.
    os.chown(upper, uid, uid)
    os.chmod(upper, stat.S_IMODE(os.lstat(source).st_mode))
    target = root / name
    mounts.bind_idmapped(source, lower, mounts.userns_fd(uid))
    try:
        mounts.mount_overlay(lower, upper, work, target)
    finally:
        mounts.unmount(lower)  # the overlay keeps its own reference: the entry is reachable only through it
    return True


def unmount_folder(root: Path, name: str) -> None:
    """Take ``<root>/<name>``'s overlay down, with its layers (what the evaluation wrote there goes)."""
    mounts.unmount(root / name)
    remove_tree_nofollow(root / LAYERS / name)


def unmount_session(root: Path) -> None:
    """Every mount at or under the session folder. The layers stay, root's, inside it: they go
    with the session folder (removed after the evaluation's end is written, ``remove_retired``; or
    kept with it), so the end does not wait for a walk of what the evaluation wrote in them."""
    mounts.unmount_below(root)


def rewrite_session_paths(root: Path, uid: int, name: str, *, old: str, manifest: dict) -> None:
    """``old`` (the building session's path) becomes ``root`` in the files of ``name`` the manifest lists."""
    new = str(root)
    old_b, new_b = os.fsencode(old), os.fsencode(new)
    for relpath in manifest.get("rewrite", []):
        if relpath.split("/", 1)[0] == name:
            _edit_file(root, relpath, lambda data: data.replace(old_b, new_b))
    for relpath in manifest.get("links", []):
        if relpath.split("/", 1)[0] == name:
            dir_fd, name_in_dir = open_parent(root, relpath, create=False)
            try:
                target = os.readlink(name_in_dir, dir_fd=dir_fd).replace(old, new)
                os.unlink(name_in_dir, dir_fd=dir_fd)
                os.symlink(target, name_in_dir, dir_fd=dir_fd)
                os.chown(name_in_dir, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
            finally:
                os.close(dir_fd)


def _edit_file(root: Path, relpath: str, change) -> None:
    dir_fd, name = open_parent(root, relpath, create=False)
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
