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
4. ``store.add_layer`` moves the entries in by ``rename`` (the build folder is in the store's
   file system): nothing is copied.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from evaluations.images.errors import ImageError
from evaluations.images.store import ImageStore
from evaluations.runtime.idmap import ID_COUNT, IdMap

OPAQUE = "trusted.overlay.opaque"  # overlayfs' mark of a folder replaced whole (unpack.py writes it too)
_OVERFLOW_ID = 65534
_OVERLAY_PREFIX = "trusted.overlay."
_KEPT_ON_CHOWN = ("security.capability",)


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
    try:
        return _to_layer(upper, idmap)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise ImageError(  # the string walk below cannot reach it: refused, never half-stored
            f"The build step made a path longer than PATH_MAX ({os.pathconf('/', 'PC_PATH_MAX')} characters), "
            "which a layer cannot hold."
        ) from None


def _to_layer(upper: Path, idmap: IdMap) -> str:
    digest = hashlib.sha256()
    for relpath, path, st in _walk(upper):
        uid, gid = _inside(st.st_uid, idmap, "uid"), _inside(st.st_gid, idmap, "gid")
        xattrs = _clean_xattrs(path, relpath)
        if (uid, gid) != (st.st_uid, st.st_gid):
            os.lchown(path, uid, gid)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode), follow_symlinks=False)  # setuid/setgid back
                for name in _KEPT_ON_CHOWN:
                    if name in xattrs:
                        os.setxattr(path, name, xattrs[name], follow_symlinks=False)
        digest.update(_describe(relpath, path, st, uid, gid, xattrs))
    return f"sha256:{digest.hexdigest()}"


def _walk(top: Path):
    """(relpath, path, lstat) of every entry below ``top``, sorted, parents first, never following links."""
    stack = [("", top)]
    while stack:
        relpath, folder = stack.pop()
        names = sorted(os.listdir(folder), reverse=True)
        for name in names:
            path = folder / name
            rel = f"{relpath}/{name}" if relpath else name
            st = os.lstat(path)
            yield rel, path, st
            if stat.S_ISDIR(st.st_mode):
                stack.append((rel, path))


def _inside(host: int, idmap: IdMap, kind: str) -> int:
    special, lease = (idmap.user, idmap.lease) if kind == "uid" else (idmap.group, idmap.lease)
    if host == lease:
        return special
    if idmap.base <= host < idmap.base + ID_COUNT:
        return host - idmap.base
    if host == 0:
        return 0
    return _OVERFLOW_ID


def _clean_xattrs(path: Path, relpath: str) -> dict[str, bytes]:
    """The xattrs the layer keeps (overlayfs' bookkeeping removed), by name."""
    kept = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return kept
    for name in names:
        value = os.getxattr(path, name, follow_symlinks=False)
        if name.startswith(_OVERLAY_PREFIX):
            if name == f"{_OVERLAY_PREFIX}redirect":
                raise ImageError(
                    f"The build step left a renamed-folder redirect at /{relpath}, which a layer cannot hold."
                )
            if name == OPAQUE and value == b"y":
                kept[name] = value
                continue
            os.removexattr(path, name, follow_symlinks=False)
            continue
        kept[name] = value
    return kept


def _describe(relpath: str, path: Path, st: os.stat_result, uid: int, gid: int, xattrs: dict[str, bytes]) -> bytes:
    mode = st.st_mode
    head = f"{relpath}\0{stat.S_IFMT(mode):o}\0{stat.S_IMODE(mode):o}\0{uid}\0{gid}\0"
    if stat.S_ISREG(mode):
        body = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                body.update(chunk)
        tail = body.hexdigest()
    elif stat.S_ISLNK(mode):
        tail = os.readlink(path)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        tail = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
    else:
        tail = ""
    attrs = "".join(f"{name}={value.hex()};" for name, value in sorted(xattrs.items()))
    return f"{head}{tail}\0{attrs}\n".encode()
