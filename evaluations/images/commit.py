"""A build step's writable layer becomes a layer of the store (``docker commit``, without a daemon).

A step's upper folder (rootfs.upper_of) is already in the store's overlayfs format: overlayfs
writes a deletion as a character device 0/0 and a folder replaced whole as
``trusted.overlay.opaque=y``. What makes it a layer:

1. Owners back to the image's own ids. The step ran under the evaluation's IdMap, so its files
   belong to host ids: the lease is the map's ``user``, ``base + n`` is ``n``. Whiteouts and
   folders overlayfs made itself belong to host root: 0. Anything else (no command can make
   it) is 65534, the kernel's overflow id. ``lchown`` drops setuid, setgid and file
   capabilities, so the mode and those xattrs are put back after it.
2. overlayfs' own bookkeeping xattrs (``origin``, ``impure``, ...) removed: they name this
   mount's lower layers. The build mounts without ``redirect_dir`` (mounts.py), so no
   ``redirect`` is ever there; one would be refused rather than kept.
3. The layer's id: the sha256 of a canonical listing of the tree (path, kind, mode, owner,
   bytes or link target or device, xattrs), so the same change is stored once. It is not a
   tar's diff_id: exporting a built image computes those from the tar it writes.
4. The tree is the step's commands' work, so it is walked from handles (``_walk``): one folder
   handle at a time, each entry reached by name from it (``fstatat``, ``fchownat``,
   ``fchmodat`` with ``AT_SYMLINK_NOFOLLOW``, ``O_NOFOLLOW`` opens, xattrs through
   ``/proc/self/fd/<folder>/<name>`` without following it): a link is content (its target is
   in the id), never a way out, and a tree deeper than ``PATH_MAX`` is committed like any other.
5. ``store.add_layer`` moves the entries in by ``rename`` (the build folder is in the store's
   file system): nothing is copied.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from evaluations import safefs
from evaluations.images.errors import ImageError
from evaluations.images.store import ImageStore
from evaluations.runtime.idmap import ID_COUNT, IdMap

OPAQUE = "trusted.overlay.opaque"  # overlayfs' mark of a folder replaced whole (unpack.py writes it too)
_OVERFLOW_ID = 65534
_OVERLAY_PREFIX = "trusted.overlay."
_KEPT_ON_CHOWN = ("security.capability",)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def commit(upper: Path, idmap: IdMap, store: ImageStore) -> str | None:
    """Store ``upper`` as a layer; its id, or None when the step changed nothing."""
    if not any(os.scandir(upper)):
        return None
    layer_id = to_layer(upper, idmap)

    def populate(tree: Path) -> None:
        for name in sorted(os.listdir(upper)):
            os.rename(upper / name, tree / name)

    store.add_layer(layer_id, populate)
    return layer_id


def to_layer(upper: Path, idmap: IdMap) -> str:
    """Rewrite ``upper`` in place as a layer (owners, xattrs) and return its id ``sha256:<hex>``."""
    digest = hashlib.sha256()
    for relpath, folder, name, st in _walk(upper):
        uid, gid = _inside(st.st_uid, idmap, "uid"), _inside(st.st_gid, idmap, "gid")
        entry = f"/proc/self/fd/{folder}/{name}"  # the folder's handle, then the name, not followed
        xattrs = _clean_xattrs(entry, relpath)
        if (uid, gid) != (st.st_uid, st.st_gid):
            os.chown(name, uid, gid, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=folder, follow_symlinks=False)  # setuid back
                for kept in _KEPT_ON_CHOWN:
                    if kept in xattrs:
                        os.setxattr(entry, kept, xattrs[kept], follow_symlinks=False)
        digest.update(_describe(relpath, folder, name, st, uid, gid, xattrs))
    return f"sha256:{digest.hexdigest()}"


def _walk(top: Path) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """(relpath, folder handle, name, lstat) of every entry below ``top``, never following a link.

    The order is the layer id's (it must not change): a folder's entries, names in reverse
    order, then each of its subfolders the same way, smallest name first, depth first. One
    folder handle is open at a time (its subfolders' names are kept per level, not handles); the
    way back up is ``..``, checked to be the folder left (device and inode)."""
    fd = os.open(top, _DIR_FLAGS)
    frames: list[tuple[str, list[str], tuple[int, int]]] = []  # (relpath, subfolders left, identity)
    relpath = ""
    try:
        while True:
            subfolders = []
            for name in sorted(os.listdir(fd), reverse=True):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                yield (f"{relpath}/{name}" if relpath else name), fd, name, st
                if stat.S_ISDIR(st.st_mode):
                    subfolders.append(name)  # the smallest name last: popped first
            here = os.fstat(fd)
            frames.append((relpath, subfolders, (here.st_dev, here.st_ino)))
            while not frames[-1][1]:
                frames.pop()
                if not frames:
                    return
                parent = safefs.up_to_parent(
                    fd, frames[-1][2], f"the layer's tree changed while it was committed: {top}"
                )
                os.close(fd)
                fd = parent
            parent_rel, left, _ = frames[-1]
            name = left.pop()
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            relpath = f"{parent_rel}/{name}" if parent_rel else name
    finally:
        os.close(fd)


def _inside(host: int, idmap: IdMap, kind: str) -> int:
    special, lease = (idmap.user, idmap.lease) if kind == "uid" else (idmap.group, idmap.lease)
    if host == lease:
        return special
    if idmap.base <= host < idmap.base + ID_COUNT:
        return host - idmap.base
    if host == 0:
        return 0
    return _OVERFLOW_ID


def _clean_xattrs(entry: str, relpath: str) -> dict[str, bytes]:
    """The xattrs the layer keeps (overlayfs' bookkeeping removed), by name; ``entry`` is
    ``/proc/self/fd/<folder>/<name>``, used without following its last component."""
    kept = {}
    try:
        names = os.listxattr(entry, follow_symlinks=False)
    except OSError:
        return kept
    for name in names:
        value = os.getxattr(entry, name, follow_symlinks=False)
        if name.startswith(_OVERLAY_PREFIX):
            if name == f"{_OVERLAY_PREFIX}redirect":
                raise ImageError(
                    f"The build step left a renamed-folder redirect at /{relpath}, which a layer cannot hold."
                )
            if name == OPAQUE and value == b"y":
                kept[name] = value
                continue
            os.removexattr(entry, name, follow_symlinks=False)
            continue
        kept[name] = value
    return kept


def _describe(
    relpath: str, folder: int, name: str, st: os.stat_result, uid: int, gid: int, xattrs: dict[str, bytes]
) -> bytes:
    mode = st.st_mode
    head = f"{relpath}\0{stat.S_IFMT(mode):o}\0{stat.S_IMODE(mode):o}\0{uid}\0{gid}\0"
    if stat.S_ISREG(mode):
        body = hashlib.sha256()
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
        with os.fdopen(fd, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                body.update(chunk)
        tail = body.hexdigest()
    elif stat.S_ISLNK(mode):
        tail = os.readlink(name, dir_fd=folder)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        tail = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
    else:
        tail = ""
    attrs = "".join(f"{key}={value.hex()};" for key, value in sorted(xattrs.items()))
    return f"{head}{tail}\0{attrs}\n".encode()
