"""The isolated verifier's root (``[verifier] isolated = true``, SPEC §17): the image plus only the
working directory as the agent left it.

``isolate_workdir`` takes the agent's root down and mounts the image again over a fresh layer,
``<session>/.image/isolated/upper``, holding the agent's working directory *moved* out of its own
layer (rootfs.upper_of): no file is copied in the usual case, whiteouts and opaque folders inside
it stay as they are, and each parent folder is made plainly with the image's owner and mode so it
merges with the image's. What the agent saw at the working directory is what the verifier sees:

1. a parent of it replaced whole (opaque) or the folder new: the moved folder is opaque;
2. the agent removed it, or replaced a parent with a file or a link: a whiteout stands there;
3. overlayfs' bookkeeping that names the image's files elsewhere goes: ``origin`` on each moved
   entry (kept, it would tie a file to an image file the verifier sees at its own path again,
   and overlayfs answers ESTALE for both), and every ``redirect`` (a folder renamed into place,
   or the working directory reached through a renamed parent): such a folder gets what it showed
   from the image copied in, with the image's owners, and becomes opaque. Only renames pay that.

The rest of the agent's layer stays where it was (system_changes reads it first) and goes with
the session, inside which all of this is, so the disk quota counts it.

Every tree here is walked from folder handles (SPEC §21): the agent's layer, the new one and the
image (``base``) are reached one name at a time (``*at`` calls, ``O_NOFOLLOW``; an attribute of
an entry that is not a folder through ``/proc/self/fd/<folder>/<name>``, never followed), the
working directory is resolved inside the image (inroot.resolve), and a walk holds one handle per
tree whatever the depth, finding a folder's parent again through ``..`` (checked): a tree deeper
than PATH_MAX is isolated like any other, and no link is ever a way out.

The verifier's commands resolve only to files of the image's layers (SPEC §21): ``verifier_commands``
gives the absolute path of the shell that starts its script and its environment, both decided on the
image alone (``image_base``, no link of the agent's), so nothing the agent left in the working
directory is run by name:

4. ``PATH`` keeps only absolute entries that lie outside the working directory once the image's own
   links are resolved (an entry the image lacks is resolved as far as it exists, the rest as written);
   a relative or empty entry is the working directory itself (the verifier starts there) and goes;
5. the shell is the first on that ``PATH`` that is an executable regular file of the image outside
   the working directory, given by its resolved path (no link is followed when it starts);
6. what that shell and the dynamic loader read before the script (``BASH_ENV``, ``LD_PRELOAD``,
   ``LD_LIBRARY_PATH``, ``LD_AUDIT``) loses its entries in the working directory too.
"""

from __future__ import annotations

import os
import posixpath
import stat
from contextlib import suppress
from pathlib import Path

from evaluations.images import inroot
from evaluations.images.diff import OPAQUE, REDIRECT, is_opaque, is_whiteout
from evaluations.images.errors import ImageError
from evaluations.images.rootfs import (
    IMAGE_DIR,
    ROOTFS,
    image_base,
    layer_folders,
    mount_layers,
    unmount_root,
    upper_of,
)
from evaluations.runtime.idmap import IdMap
from evaluations.runtime.types import ImageRoot
from evaluations.safefs import open_root_dir

ISOLATED = "isolated"  # <session>/.image/isolated/{lower/<n>,upper,work}
_ORIGIN = "trusted.overlay.origin"
_OVERLAY = "trusted.overlay."
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def isolate_workdir(session_root: Path, layers: list[Path], idmap: IdMap, workdir: str) -> ImageRoot:
    """Mount ``<session>/rootfs`` again as the image (``layers``, bottom first) plus the agent's
    ``workdir`` (inside path; the image's links resolved here), under ``idmap``. Call it when no
    process of the agent is alive, after reading the agent's layer (agent_patch, system_changes).
    ``workdir`` ``/``: the whole layer is the working directory."""
    unmount_root(session_root)
    lower_base, upper, work = layer_folders(session_root / IMAGE_DIR / ISOLATED, idmap)
    with image_base(layers, session_root) as base:
        handles = [open_root_dir(base)]
        try:
            handles += [open_root_dir(upper_of(session_root)), open_root_dir(upper)]
            base_fd, old_fd, new_fd = handles
            inner = inroot.resolve(base_fd, workdir)
            _Isolation(base_fd, idmap).move(old_fd, new_fd, inner.split("/") if inner else [])
        finally:
            for fd in handles:
                os.close(fd)
    target = session_root / ROOTFS
    mount_layers(layers, lower_base, upper, work, target, idmap, redirect_dir=True)
    return ImageRoot(rootfs=target, idmap=idmap)


def verifier_commands(base: Path, workdir: str, env: dict[str, str], shell: str) -> tuple[str, dict[str, str]]:
    """The isolated verifier's ``shell`` (its absolute path inside the image) and ``env`` without
    what names the working directory ``workdir`` (4-6), ``base`` the image's root (image_base).
    ImageError when the image has no such shell. (Nothing of the image runs before it: the egress
    relay is the executor's static init, bound in, not a program of the image's.)"""
    root = inroot.open_root(base)
    try:
        return _verifier_commands(root, workdir, env, shell)
    finally:
        os.close(root)


def _verifier_commands(root: int, workdir: str, env: dict[str, str], shell: str) -> tuple[str, dict[str, str]]:
    try:
        inner = inroot.resolve(root, workdir, folder=False)
    except OSError as exc:
        raise ImageError(f"the image's working directory {workdir} cannot be resolved: {exc.strerror}") from None
    env = dict(env)
    for name, separators in _CODE_LISTS.items():
        if name in env:
            kept = [item for item in _split(env[name], separators) if _outside(root, inner, item)]
            if kept or name == "PATH":
                env[name] = ":".join(kept)
            else:
                del env[name]
    for folder in env.get("PATH", "").split(":"):
        real = _existing(root, f"{folder}/{shell}") if folder else None
        if real is not None and _outside(root, inner, real) and _executable(root, real):
            return real, env
    raise ImageError(
        f"the image has no {shell} outside the working directory {workdir} on PATH ({env.get('PATH', '')}): "
        "an isolated verifier runs only the image's own programs"
    )


# Variables naming what the verifier's commands run or load, and how their entries are separated.
# (Not ENV: only an interactive sh reads it, and tasks use the name for other things.)
_CODE_LISTS = {"PATH": ":", "BASH_ENV": "", "LD_PRELOAD": ": ", "LD_LIBRARY_PATH": ":;", "LD_AUDIT": ":"}


def _split(value: str, separators: str) -> list[str]:
    for separator in separators[1:]:
        value = value.replace(separator, separators[0])
    return value.split(separators[0]) if separators else [value]


def _outside(root: int, inner: str, path: str) -> bool:
    """Whether the absolute ``path`` lies outside the working directory ``inner`` (root-relative,
    "" for /) once resolved in the image (what the image lacks kept as written); a relative one
    is the working directory's, and one that names nothing (through a file, links that loop) is
    taken as inside: it is left out."""
    if not path.startswith("/"):
        return False
    try:
        real = inroot.resolve(root, path, folder=False)
    except OSError:
        return False
    return bool(inner) and real != inner and not real.startswith(inner + "/")


def _existing(root: int, path: str) -> str | None:
    """``path`` resolved in the image, ``/``-rooted, when the image has it; None otherwise."""
    try:
        return "/" + inroot.resolve(root, path, keep_missing=False, folder=False)
    except OSError:
        return None


def _executable(root: int, real: str) -> bool:
    """Whether ``real`` (resolved: no link left on the way) is an executable regular file of the image."""
    try:
        folder, name = inroot.parent_and_name(root, real)
    except OSError:
        return False
    try:
        st = inroot.lstat_at(folder, name)
    finally:
        os.close(folder)
    return st is not None and stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)


class _Isolation:
    def __init__(self, base_fd: int, idmap: IdMap):
        self.base_fd, self.idmap = base_fd, idmap

    def move(self, old: int, new: int, parts: list[str]) -> None:
        """The agent's entry at ``parts`` moved from the layer ``old`` to the new layer ``new``."""
        if not parts:  # the working directory is / : all of the layer
            for name in os.listdir(old):
                os.rename(name, name, src_dir_fd=old, dst_dir_fd=new)
            return
        here, name = "/" + "/".join(parts), parts[-1]
        found, lower, old_parent = self._agents_view(old, parts)
        try:
            if found is None and lower == here:
                return  # the agent never changed it: the image's own
            new_parent = self._parents(new, parts[:-1])
            try:
                if found is None and (lower is None or not self._image_dir(lower)):
                    os.mknod(name, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=new_parent)  # a whiteout: gone
                elif found is None:  # reached through a renamed parent, unchanged itself: the image's folder there
                    source = self._image_folder(posixpath.dirname(lower))
                    try:
                        self._copy_entry(source, posixpath.basename(lower), new_parent, name)
                    finally:
                        os.close(source)
                    self._settle(new_parent, name, lower, here)
                else:
                    os.rename(name, name, src_dir_fd=old_parent, dst_dir_fd=new_parent)
                    if stat.S_ISDIR(found.st_mode):
                        self._settle(new_parent, name, lower, here)
                    else:
                        _strip_at(new_parent, name, (_ORIGIN,))  # a whiteout, a file or a link the agent left
            finally:
                os.close(new_parent)
        finally:
            if old_parent is not None:
                os.close(old_parent)

    def _agents_view(self, old: int, parts: list[str]) -> tuple[os.stat_result | None, str | None, int | None]:
        """The agent's own entry at the working directory (None: not in its layer), the image
        folder its view there came from ("/a/b"; None: none, below a folder that replaced the
        image's) and, when the entry is there, a handle of the layer's folder holding it."""
        lower: str | None = "/"
        folder: int | None = os.dup(old)
        try:
            for position, name in enumerate(parts):
                last = position == len(parts) - 1
                parent_lower = lower
                lower = posixpath.join(lower, name) if lower is not None else None
                if folder is None:
                    continue  # not in the agent's layer: as the parent's view says
                st = inroot.lstat_at(folder, name)
                if st is None:
                    os.close(folder)
                    folder = None
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    if last:
                        folder, held = None, folder
                        return st, None, held
                    return None, None, None  # a parent removed, or replaced by a file or a link
                child = os.open(name, _DIR_FLAGS, dir_fd=folder)
                lower = _lower_of(child, parent_lower, lower)
                if last:
                    os.close(child)
                    folder, held = None, folder
                    return st, lower, held
                os.close(folder)
                folder = child
            return None, lower, None
        finally:
            if folder is not None:
                os.close(folder)

    def _parents(self, new: int, parts: list[str]) -> int:
        """Folders ``parts`` below ``new``, each with the image's owner and mode there (the image's
        root's, 0755, where the image has none); a handle of the last."""
        folder, image = os.dup(new), os.dup(self.base_fd)
        try:
            for name in parts:
                st = inroot.lstat_at(image, name)
                if image is not None:
                    child = os.open(name, _DIR_FLAGS, dir_fd=image) if st and stat.S_ISDIR(st.st_mode) else None
                    os.close(image)
                    image = child
                if image is None:
                    st = None
                os.mkdir(name, 0o700, dir_fd=folder)
                child = os.open(name, _DIR_FLAGS, dir_fd=folder)
                os.close(folder)
                folder = child
                uid, gid = (st.st_uid, st.st_gid) if st is not None else (0, 0)
                os.fchown(folder, self.idmap.host_uid(uid), self.idmap.host_gid(gid))
                os.fchmod(folder, stat.S_IMODE(st.st_mode) if st is not None else 0o755)
            held, folder = folder, None
            return held
        finally:
            for fd in (folder, image):
                if fd is not None:
                    os.close(fd)

    def _settle(self, parent: int, name: str, lower: str | None, here: str) -> None:
        """The moved folder ``name`` (seen at ``here``, its view from the image folder ``lower``) and
        everything below it: no origin, no redirect, what a redirect showed copied in."""

        def visit(fd: int, at: tuple[str | None, str]) -> list[tuple[str, tuple[str | None, str]]]:
            lower, here = at
            if lower is not None and lower != here:
                self._materialise(fd, lower)
                return []
            _strip_fd(fd, (_ORIGIN, REDIRECT))
            if lower is None and not is_opaque(fd):
                os.setxattr(fd, OPAQUE, b"y")
            below = []
            for entry in _entries(fd):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    below.append((entry.name, (self._child_lower(fd, entry.name, lower), f"{here}/{entry.name}")))
                elif not is_whiteout(st):
                    _strip_at(fd, entry.name, (_ORIGIN,))
            return below

        top = os.open(name, _DIR_FLAGS, dir_fd=parent)
        try:
            _walk_folders(top, (lower, here), visit)
        finally:
            os.close(top)

    def _materialise(self, top: int, lower: str) -> None:
        """The folder ``top`` shows what it showed merged with the image's folder ``lower``, on its own (opaque)."""

        def visit(fd: int, lower: str | None) -> list[tuple[str, str | None]]:
            _strip_fd(fd, (_ORIGIN, REDIRECT))
            os.setxattr(fd, OPAQUE, b"y")
            names, below = set(), []
            for entry in _entries(fd):
                names.add(entry.name)
                st = entry.stat(follow_symlinks=False)
                if is_whiteout(st):
                    os.unlink(entry.name, dir_fd=fd)  # what it hid is not copied in below
                elif stat.S_ISDIR(st.st_mode):
                    below.append((entry.name, self._child_lower(fd, entry.name, lower)))
                else:
                    _strip_at(fd, entry.name, (_ORIGIN,))
            if lower is not None:
                source = self._image_folder(lower)
                try:
                    for entry in _entries(source):
                        if entry.name not in names:
                            self._copy_tree(source, entry.name, fd)
                finally:
                    os.close(source)
            return below

        _walk_folders(top, lower, visit)

    def _child_lower(self, fd: int, name: str, lower: str | None) -> str | None:
        """The image folder the layer's folder ``name`` (in ``fd``, whose own is ``lower``) merges with."""
        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            default = posixpath.join(lower, name) if lower is not None else None
            return self._existing(_lower_of(child, lower, default))
        finally:
            os.close(child)

    def _copy_tree(self, source: int, name: str, target: int) -> None:
        """The image's ``name`` in its folder ``source`` copied into the folder ``target``, links
        not followed, owners through the IdMap; one handle per tree whatever the depth."""
        if not self._copy_entry(source, name, target, name):
            return

        def visit(pair: tuple[int, int], _at) -> list[tuple[str, None]]:
            src, dst = pair
            return [(entry.name, None) for entry in _entries(src) if self._copy_entry(src, entry.name, dst, entry.name)]

        src = os.open(name, _DIR_FLAGS, dir_fd=source)
        try:
            dst = os.open(name, _DIR_FLAGS, dir_fd=target)
            try:
                _walk_folders((src, dst), None, visit)
            finally:
                os.close(dst)
        finally:
            os.close(src)

    def _copy_entry(self, source: int, name: str, target: int, as_name: str) -> bool:
        """One entry of the image copied, with its owner, mode and xattrs (overlayfs' own left
        out); whether it is a folder. A socket or a whiteout is left out."""
        st = os.stat(name, dir_fd=source, follow_symlinks=False)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(as_name, 0o700, dir_fd=target)
        elif stat.S_ISREG(mode):
            reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=source)
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                writer = os.open(as_name, flags, 0o600, dir_fd=target)
                try:
                    while os.sendfile(writer, reader, None, 1 << 30):
                        pass
                finally:
                    os.close(writer)
            finally:
                os.close(reader)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=source), as_name, dir_fd=target)
        elif (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)) and not is_whiteout(st):
            os.mknod(as_name, stat.S_IFMT(mode) | 0o600, st.st_rdev, dir_fd=target)
        else:
            return False
        os.chown(
            as_name,
            self.idmap.host_uid(st.st_uid),
            self.idmap.host_gid(st.st_gid),
            dir_fd=target,
            follow_symlinks=False,
        )
        if not stat.S_ISLNK(mode):
            os.chmod(as_name, stat.S_IMODE(mode), dir_fd=target)  # after chown, which clears setuid; just made, no link
            src, dst = _proc(source, name), _proc(target, as_name)
            for attr in os.listxattr(src, follow_symlinks=False):
                if not attr.startswith(_OVERLAY):
                    os.setxattr(dst, attr, os.getxattr(src, attr, follow_symlinks=False), follow_symlinks=False)
        os.utime(as_name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=target, follow_symlinks=False)
        return stat.S_ISDIR(mode)

    def _existing(self, lower: str | None) -> str | None:
        return lower if lower is not None and self._image_dir(lower) else None

    def _image_dir(self, path: str) -> bool:
        """Whether ``path`` is a folder of the image, no link followed on the way."""
        try:
            os.close(self._image_folder(path))
        except OSError:
            return False
        return True

    def _image_folder(self, path: str) -> int:
        """A handle of the image's folder ``path`` ("/a/b"), each component opened ``O_NOFOLLOW``."""
        fd = os.dup(self.base_fd)
        try:
            for part in [p for p in path.split("/") if p]:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd


def _walk_folders(top, at, visit) -> None:
    """Depth first below ``top`` (a folder handle, or a pair of them walked in step): ``visit(handle,
    at)`` does a folder's work and returns ``[(name, at), ...]`` of its folders to walk next. One
    handle per tree is open at a time; a parent is found again through ``..`` and must be the one
    left (device and inode), else ``OSError``."""
    paired = isinstance(top, tuple)
    fds = list(top) if paired else [top]
    fds = [os.dup(fd) for fd in fds]
    stack: list[tuple[list, list[tuple[int, int]]]] = []
    try:
        pending = list(reversed(visit(tuple(fds) if paired else fds[0], at)))
        while True:
            if pending:
                name, child_at = pending.pop()
                children = []
                try:
                    for fd in fds:
                        children.append(os.open(name, _DIR_FLAGS, dir_fd=fd))
                except BaseException:
                    for fd in children:
                        os.close(fd)
                    raise
                stack.append((pending, [_ident(fd) for fd in fds]))
                for fd in fds:
                    os.close(fd)
                fds = children
                pending = list(reversed(visit(tuple(fds) if paired else fds[0], child_at)))
                continue
            if not stack:
                return
            pending, idents = stack.pop()
            parents = []
            for fd, ident in zip(fds, idents, strict=True):
                parents.append(os.open("..", _DIR_FLAGS, dir_fd=fd))
                if _ident(parents[-1]) != ident:
                    for parent in parents:
                        os.close(parent)
                    raise OSError("a folder moved while it was being isolated")
            for fd in fds:
                os.close(fd)
            fds = parents
    finally:
        for fd in fds:
            os.close(fd)


def _lower_of(folder: int, parent_lower: str | None, default: str | None) -> str | None:
    """The image folder a folder of the agent's layer (a handle) merges with: none when opaque, its
    redirect (absolute, or beside its parent's), else ``default``."""
    if is_opaque(folder):
        return None
    try:
        redirect = os.getxattr(folder, REDIRECT)
    except OSError:
        return default
    target = os.fsdecode(redirect)
    if target.startswith("/"):
        return posixpath.normpath(target)
    return posixpath.join(parent_lower, target) if parent_lower is not None else None


def _proc(folder: int, name: str) -> str:
    """``name`` in the folder ``folder`` as a path the kernel resolves from the handle (the folder's
    magic link, then ``name``): for the calls with no ``*at`` form (xattrs); used not followed."""
    return f"/proc/self/fd/{folder}/{name}"


def _strip_fd(fd: int, names: tuple[str, ...]) -> None:
    for name in names:
        with suppress(OSError):
            os.removexattr(fd, name)


def _strip_at(folder: int, entry: str, names: tuple[str, ...]) -> None:
    for name in names:
        with suppress(OSError):
            os.removexattr(_proc(folder, entry), name, follow_symlinks=False)


def _entries(folder: int) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return list(it)


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
