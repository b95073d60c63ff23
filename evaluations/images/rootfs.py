"""An evaluation's root in an image: the image's layers, read-only and shared, under a writable
layer of its own in the session (SPEC §16).

``mount_root(layers, session_root, idmap)``:

1. Each layer tree (the store's, owned on disk by the image's own ids) is bound at
   ``<session>/.image/lower/<n>`` through an idmapped mount onto the evaluation's ids
   (runtime/idmap.py), read-only: inside the namespace its files are the image's root's and
   users' again, on the host nobody's but the evaluation's, and no layer is ever copied.
2. An overlay of them (top layer first) with ``<session>/.image/upper`` as its upper folder is
   mounted at ``<session>/rootfs``: everything the evaluation writes, anywhere in the image,
   lands in the session, where the disk quota and the file count see it (their walk does not
   cross into the overlay's own mount) and where it goes with the session.
3. The idmapped binds are detached at once: the overlay keeps its own private clone of each,
   so a layer is reachable only through the overlay.

``unmount_root`` (and the session's ``unmount_below``) take it down; the layers are untouched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evaluations.cache import mounts
from evaluations.images import inroot
from evaluations.images.errors import ImageError
from evaluations.runtime.idmap import ID_COUNT, IdMap, image_userns_fd
from evaluations.runtime.types import ImageRoot
from evaluations.safefs import remove_tree_nofollow

IMAGE_DIR = ".image"  # <session>/.image/{lower/<n>,upper,work}: root's, 0700
ROOTFS = "rootfs"  # <session>/rootfs: the merged root the sandbox binds as /


def mount_root(
    layers: list[Path], session_root: Path, idmap: IdMap, *, redirect_dir: bool = True, target: Path | None = None
) -> ImageRoot:
    """The merged root of ``layers`` (bottom first, as an image lists them) for one evaluation.

    ``redirect_dir=False`` when the upper will become a layer (a build's step: mounts.py says why).
    ``target``: where the merged root is mounted (made here), when not ``<session_root>/rootfs``:
    a build keeps its layers in the making in the store, where they become layers by rename, and
    mounts their root where the sandbox uid can reach it.
    """
    lower_base, upper, work = layer_folders(session_root / IMAGE_DIR, idmap)
    target = target or session_root / ROOTFS
    target.mkdir(mode=0o755)
    mount_layers(layers, lower_base, upper, work, target, idmap, redirect_dir=redirect_dir)
    return ImageRoot(rootfs=target, idmap=idmap)


def layer_folders(base: Path, idmap: IdMap) -> tuple[Path, Path, Path]:
    """``base``/{lower,upper,work}, made here (root's, 0700); the upper is the merged root's own folder."""
    base.mkdir(mode=0o700)
    lower_base, upper, work = base / "lower", base / "upper", base / "work"
    for folder in (lower_base, upper, work):
        folder.mkdir(mode=0o700)
    # The merged root takes its owner and mode from the upper folder: the image's root's, 0755.
    os.chown(upper, idmap.host_uid(0), idmap.host_gid(0))
    os.chmod(upper, 0o755)
    return lower_base, upper, work


def mount_layers(
    layers: list[Path], lower_base: Path, upper: Path, work: Path, target: Path, idmap: IdMap, *, redirect_dir: bool
) -> None:
    """The overlay of ``layers`` (bottom first), each bound idmapped at ``lower_base/<n>``, over ``upper``."""
    if not layers:  # FROM scratch: overlayfs needs one lower folder
        empty = lower_base.parent / "empty"
        empty.mkdir(mode=0o755)
        layers = [empty]
    namespace = image_userns_fd(idmap)
    lowers = []
    try:
        for position, layer in enumerate(reversed(layers)):
            point = lower_base / str(position)
            point.mkdir(mode=0o700)
            mounts.bind_idmapped(layer, point, namespace)
            lowers.append(point)
        mounts.mount_overlay_layers(lowers, upper, work, target, redirect_dir=redirect_dir)
    finally:
        for point in lowers:
            mounts.unmount(point)  # the overlay holds its own clones


@contextmanager
def image_base(layers: list[Path], session_root: Path) -> Iterator[Path]:
    """The image's own root, read-only, for the ``with`` block: its layers as an overlay with no
    upper folder (one layer: that tree itself). What the agent patch compares against."""
    if len(layers) == 1:
        yield layers[0]
        return
    point = session_root / IMAGE_DIR / "base"
    point.mkdir(mode=0o700)
    if not layers:
        yield point
        point.rmdir()
        return
    mounts.mount_overlay_layers(list(reversed(layers)), None, None, point)
    try:
        yield point
    finally:
        mounts.unmount(point)
        point.rmdir()


def upper_of(session_root: Path) -> Path:
    """The evaluation's own layer: what it changed in the image, in overlayfs' format."""
    return session_root / IMAGE_DIR / "upper"


def unmount_root(session_root: Path, *, remove: bool = False) -> None:
    """Take the merged root down; ``remove``: the evaluation's layer too (a root mounted again)."""
    mounts.unmount(session_root / ROOTFS)
    if remove:
        remove_tree_nofollow(session_root / IMAGE_DIR)
        os.rmdir(session_root / ROOTFS)


def resolve_user(root: Path, user: str) -> tuple[int, int]:
    """The image's ``User`` (``name``, ``uid``, ``name:group``, ``uid:gid``) as ids, from its own
    /etc/passwd and /etc/group as Docker reads them; ImageError naming what is missing."""
    name, _, group = user.partition(":")
    passwd = table(root, "/etc/passwd")
    if name.isdigit():
        uid = int(name)
        gid = next((int(row[3]) for row in passwd if row[2] == name and row[3].isdigit()), 0)
    else:
        row = next((row for row in passwd if row[0] == name), None)
        if row is None or not (row[2].isdigit() and row[3].isdigit()):
            raise ImageError(f"the image's user {name!r} is not in its /etc/passwd")
        uid, gid = int(row[2]), int(row[3])
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            found = next((row for row in table(root, "/etc/group") if row[0] == group and row[2].isdigit()), None)
            if found is None:
                raise ImageError(f"the image's group {group!r} is not in its /etc/group")
            gid = int(found[2])
    if uid >= ID_COUNT or gid >= ID_COUNT:
        raise ImageError(f"the image's user {user!r} is outside the ids 0-{ID_COUNT - 1} an image may use")
    return uid, gid


def table(root: Path, path: str) -> list[list[str]]:
    """The rows of the image's ``path`` (/etc/passwd, /etc/group), read through the resolver: its
    links are followed inside ``root`` (inroot.py), never on the host. [] when it is missing."""
    try:
        root_fd = inroot.open_root(root)
    except OSError:
        return []
    try:
        data = inroot.read_in(root_fd, path, 4 * 1024 * 1024)
    finally:
        os.close(root_fd)
    text = (data or b"").decode("utf-8", errors="replace")
    return [line.split(":") for line in text.splitlines() if line.count(":") >= 3]
