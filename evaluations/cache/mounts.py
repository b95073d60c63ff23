"""The kernel mounts the workspace cache uses: an entry seen as another uid's, under a private overlay.

Why these and not a copy (bench/cache.py, bench/RESULTS.md "Issue 16"):
an entry's files belong to root, and the evaluation that starts from it
runs as a uid of its own. A copy then a ``chown -R`` of a 7000-file venv
took 0.7 to 3.4 s on the shared dev host; an overlay whose lower layer is
the entry itself costs nothing to copy, but overlayfs checks permissions
against the lower file's owner, so a plain overlay of root's files is
read-only in practice, and a ``chown -R`` through it (metacopy) still took
0.4 s. An *idmapped* bind of the entry (kernel 5.12+, overlay on top of it
since 5.19) shows root's files as the evaluation's uid without touching
them: the whole restore is three mounts, about 7 ms.

1. ``userns_fd(uid)``: a user namespace whose map is "0 -> uid", the
   mapping an idmapped mount takes (made by runtime/idmap.py, once per uid
   and process).
2. ``bind_idmapped(source, target, ns_fd, writable)``: ``open_tree`` a
   private copy of the mount, ``mount_setattr(MOUNT_ATTR_IDMAP)``, attach it
   at ``target``; nosuid and nodev always. Files created through a writable
   one land on disk as root (the map works both ways).
3. ``mount_overlay(lower, upper, work, target)``: overlayfs keeps its own
   private clone of each layer, so the idmapped lower can be detached at
   once; the entry is then reachable only through the overlay.
4. ``unmount_below(path)``: every mount at or under ``path``, deepest
   first (lazily: a process still inside cannot keep it).
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from evaluations.runtime import idmap

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# x86_64 and aarch64 share these numbers (the new mount API came after the table was unified).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_SYS_MOUNT_SETATTR = 442
_FSOPEN_CLOEXEC = 0x1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 0x1
_AT_FDCWD = -100
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_MNT_DETACH = 0x2
# Characters overlayfs' option parser gives a meaning to.
_OPTION_SPECIALS = frozenset(",:\\=\n")


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class MountError(OSError):
    """A mount the cache needs could not be made (the evaluation runs cold)."""


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise MountError(code, f"{what}: {os.strerror(code)}")
    return result


def userns_fd(uid: int) -> int:
    """An fd of a user namespace mapping uid and gid 0 to ``uid`` (kept for this process)."""
    return idmap.userns_fd(f"0 {uid} 1\n", f"0 {uid} 1\n", os.geteuid())


def bind_idmapped(source: Path, target: Path, ns_fd: int, *, writable: bool = False) -> None:
    """Attach ``source`` at ``target`` (an empty folder), its root-owned files shown as the namespace's uid."""
    tree = _check(
        _libc.syscall(
            _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
        ),
        f"open_tree {source}",
    )
    try:
        flags = _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (0 if writable else _MOUNT_ATTR_RDONLY)
        attr = _MountAttr(flags, 0, 0, ns_fd)
        _check(
            _libc.syscall(
                _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
            ),
            f"idmapping {source}",
        )
        _check(
            _libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH),
            f"attaching {source} at {target}",
        )
    finally:
        os.close(tree)


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    """``target`` becomes ``lower`` with every change going to ``upper``; nosuid, nodev."""
    attach_closing(overlay_detached(lower, upper, work), target)


def overlay_detached(lower: Path, upper: Path, work: Path) -> int:
    """The overlay ``mount_overlay`` makes, attached nowhere: a mount descriptor. Files are read and
    written through it (``openat``) as through the mounted folder; ``attach_closing`` puts it at a
    path, and closing it unattached unmounts it. Its layers are the overlay's own once it is made:
    ``lower`` may be unmounted at once."""
    for path in (lower, upper, work):
        if _OPTION_SPECIALS & set(str(path)):
            raise MountError(errno.EINVAL, f"{path}: a character overlayfs options cannot hold")
    # redirect_dir: renaming a folder of the entry works (without it overlayfs answers EXDEV).
    options = [("lowerdir", lower), ("upperdir", upper), ("workdir", work), ("redirect_dir", "on")]
    return _overlay(options, f"overlay of {lower}")


def mount_overlay_layers(
    lowers: list[Path], upper: Path | None, work: Path | None, target: Path, *, redirect_dir: bool = True
) -> None:
    """``target`` becomes the layers ``lowers`` (top first) with every change going to ``upper``
    (None: read-only, no upper and no work folder).

    One ``lowerdir+`` per layer: ``mount(2)``'s options are one page (4096 bytes), which a long
    image's layer paths outgrow. nosuid, nodev.

    ``redirect_dir=False`` for an upper that becomes an image layer (a build's step): a renamed
    folder is then copied up whole, as Docker's overlay2 does, instead of leaving a
    ``trusted.overlay.redirect`` xattr that names a path of this mount's lower layers, which
    would mean nothing once the upper is a layer of its own. ``metacopy`` is off for the same
    reason (a metadata-only copy-up has no data of its own).
    """
    options = [("lowerdir+", lower) for lower in lowers]
    if upper is not None:
        options += [("upperdir", upper), ("workdir", work)]
        options += [("redirect_dir", "on")] if redirect_dir else [("redirect_dir", "off"), ("metacopy", "off")]
    attach_closing(_overlay(options, f"overlay at {target}"), target)


def _overlay(options: list[tuple[str, object]], what: str) -> int:
    """An overlay made through the new mount API (``fsopen``, one ``fsconfig`` per option,
    ``fsmount``): nosuid, nodev; its mount descriptor, attached nowhere."""
    fs = _check(_libc.syscall(_SYS_FSOPEN, b"overlay", _FSOPEN_CLOEXEC), "fsopen overlay")
    try:
        for key, value in options:
            _check(
                _libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key.encode(), os.fsencode(str(value)), 0),
                f"overlay option {key}={value}",
            )
        _check(_libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0), what)
        return _check(
            _libc.syscall(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV), f"fsmount {what}"
        )
    finally:
        os.close(fs)


def attach_closing(mount_fd: int, target: Path) -> None:
    """Attach a detached mount (``overlay_detached``) at ``target``, an empty folder; the descriptor is closed."""
    try:
        _check(
            _libc.syscall(_SYS_MOVE_MOUNT, mount_fd, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH),
            f"attaching a mount at {target}",
        )
    finally:
        os.close(mount_fd)


def unmount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise MountError(code, f"unmounting {target}: {os.strerror(code)}")


def mount_points_below(path: Path) -> list[Path]:
    """The mount points at or under ``path`` in this process's namespace, deepest first."""
    top = os.path.abspath(path)
    found = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle:
            point = _unescape(line.split()[4])
            if point == top or point.startswith(top.rstrip("/") + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_below(path: Path) -> int:
    """Unmount everything at or under ``path``; return how many mounts went."""
    points = mount_points_below(path)
    for point in points:
        unmount(point)
    return len(points)


def _unescape(raw: bytes) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    out = bytearray()
    index = 0
    while index < len(raw):
        if raw[index] == 0x5C and index + 3 < len(raw) and raw[index + 1 : index + 4].isdigit():
            out.append(int(raw[index + 1 : index + 4], 8))
            index += 4
        else:
            out.append(raw[index])
            index += 1
    return os.fsdecode(bytes(out))
