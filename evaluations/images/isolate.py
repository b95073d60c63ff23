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
import shutil
import stat
from contextlib import suppress
from pathlib import Path

from evaluations.environments import inside
from evaluations.images.diff import OPAQUE, REDIRECT, is_opaque, is_whiteout
from evaluations.images.errors import ImageError
from evaluations.images.rootfs import (
    IMAGE_DIR,
    ROOTFS,
    image_base,
    image_path,
    layer_folders,
    mount_layers,
    unmount_root,
    upper_of,
)
from evaluations.runtime.idmap import IdMap
from evaluations.runtime.types import ImageRoot

ISOLATED = "isolated"  # <session>/.image/isolated/{lower/<n>,upper,work}
_ORIGIN = "trusted.overlay.origin"
_OVERLAY = "trusted.overlay."


def isolate_workdir(session_root: Path, layers: list[Path], idmap: IdMap, workdir: str) -> ImageRoot:
    """Mount ``<session>/rootfs`` again as the image (``layers``, bottom first) plus the agent's
    ``workdir`` (inside path; the image's links resolved here), under ``idmap``. Call it when no
    process of the agent is alive, after reading the agent's layer (agent_patch, system_changes).
    ``workdir`` ``/``: the whole layer is the working directory."""
    unmount_root(session_root)
    lower_base, upper, work = layer_folders(session_root / IMAGE_DIR / ISOLATED, idmap)
    with image_base(layers, session_root) as base:
        inner = image_path(base, workdir)
        _Isolation(base, idmap).move(upper_of(session_root), upper, inner.split("/") if inner else [])
    target = session_root / ROOTFS
    mount_layers(layers, lower_base, upper, work, target, idmap, redirect_dir=True)
    return ImageRoot(rootfs=target, idmap=idmap)


def verifier_commands(
    base: Path, workdir: str, env: dict[str, str], shell: str, *, fixed: tuple[str, ...] = ()
) -> tuple[str, dict[str, str]]:
    """The isolated verifier's ``shell`` (its absolute path inside the image) and ``env`` without
    what names the working directory ``workdir`` (4-6), ``base`` the image's root (image_base).
    ``fixed``: programs started by absolute path (the egress relay's ``/bin/sh``), which must lie
    outside it too. ImageError when the image has no such shell, or one of them is inside."""
    inner = image_path(base, workdir)
    for program in fixed:
        if not _outside(base, inner, program):
            raise ImageError(
                f"{program} is inside the working directory {workdir}: an isolated verifier runs only the "
                "image's own programs"
            )
    env = dict(env)
    for name, separators in _CODE_LISTS.items():
        if name in env:
            kept = [item for item in _split(env[name], separators) if _outside(base, inner, item)]
            if kept or name == "PATH":
                env[name] = ":".join(kept)
            else:
                del env[name]
    for folder in env.get("PATH", "").split(":"):
        real = inside(base, f"{folder}/{shell}") if folder else None
        if real is not None and _outside(base, inner, real) and _executable(base, real):
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


def _outside(base: Path, inner: str, path: str) -> bool:
    """Whether the absolute ``path`` lies outside the working directory ``inner`` (root-relative,
    "" for /) once resolved in the image; a relative one is the working directory's."""
    if not path.startswith("/"):
        return False
    real = _resolved(base, path).strip("/")
    return bool(inner) and real != inner and not real.startswith(inner + "/")


def _resolved(base: Path, path: str) -> str:
    """``path`` with the image's links resolved as far as the image has it, the rest as written."""
    parts = [part for part in path.split("/") if part]
    for known in range(len(parts), -1, -1):
        head = inside(base, "/" + "/".join(parts[:known]))
        if head is not None:
            return posixpath.normpath(posixpath.join(head, *parts[known:]))
    return posixpath.normpath(path)


def _executable(base: Path, real: str) -> bool:
    st = _lstat(base / real.lstrip("/"))  # resolved: no link left on the way
    return st is not None and stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)


class _Isolation:
    def __init__(self, base: Path, idmap: IdMap):
        self.base, self.idmap = base, idmap

    def move(self, old: Path, new: Path, parts: list[str]) -> None:
        if not parts:  # the working directory is / : all of the layer
            for name in os.listdir(old):
                os.rename(old / name, new / name)
            return
        here = "/" + "/".join(parts)
        found, lower = self._agents_view(old, parts)
        if found is None and lower == here:
            return  # the agent never changed it: the image's own
        self._parents(new, parts[:-1])
        old_path, new_path = old.joinpath(*parts), new.joinpath(*parts)
        if found is None and (lower is None or not self._image_dir(lower)):
            os.mknod(new_path, stat.S_IFCHR | 0o600, os.makedev(0, 0))  # a whiteout: it is gone
        elif found is None:  # reached through a renamed parent, unchanged itself: the image's folder there
            self._copy_entry(self.base / lower.lstrip("/"), new_path)
            self._settle(new_path, lower, here)
        else:
            os.rename(old_path, new_path)
            if stat.S_ISDIR(found.st_mode):
                self._settle(new_path, lower, here)
            else:
                _strip(new_path, (_ORIGIN,))  # a whiteout, a file or a link the agent left in its place

    def _agents_view(self, old: Path, parts: list[str]) -> tuple[os.stat_result | None, str | None]:
        """The agent's own entry at the working directory (None: not in its layer) and the image
        folder its view there came from ("/a/b"; None: none, below a folder that replaced the image's)."""
        lower: str | None = "/"
        folder = old
        for position, name in enumerate(parts):
            parent_lower = lower
            lower = posixpath.join(lower, name) if lower is not None else None
            if folder is None:
                continue  # not in the agent's layer: as the parent's view says
            path = folder / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                folder = None
                continue
            if not stat.S_ISDIR(st.st_mode):
                if position == len(parts) - 1:
                    return st, None
                return None, None  # a parent removed, or replaced by a file or a link
            lower = _lower_of(path, parent_lower, lower)
            if position == len(parts) - 1:
                return st, lower
            folder = path
        return None, lower

    def _parents(self, new: Path, parts: list[str]) -> None:
        """Folders ``parts`` below ``new``, each with the image's owner and mode there (the image's
        root's, 0755, where the image has none)."""
        folder, image = new, self.base
        for name in parts:
            folder, image = folder / name, image / name if image is not None else None
            st = _lstat(image) if image is not None else None
            if st is None or not stat.S_ISDIR(st.st_mode):
                st, image = None, None
            os.mkdir(folder, 0o700)
            uid, gid = (st.st_uid, st.st_gid) if st is not None else (0, 0)
            os.chown(folder, self.idmap.host_uid(uid), self.idmap.host_gid(gid), follow_symlinks=False)
            os.chmod(folder, stat.S_IMODE(st.st_mode) if st is not None else 0o755)

    def _settle(self, top: Path, lower: str | None, here: str) -> None:
        """The moved folder ``top`` (seen at ``here``, its view from the image folder ``lower``) and
        everything below it: no origin, no redirect, what a redirect showed copied in."""
        stack = [(top, lower, here)]
        while stack:
            folder, lower, here = stack.pop()
            if lower is not None and lower != here:
                self._materialise(folder, lower)
                continue
            _strip(folder, (_ORIGIN, REDIRECT))
            if lower is None and not is_opaque(folder):
                os.setxattr(folder, OPAQUE, b"y", follow_symlinks=False)
            for entry in _entries(folder):
                st = entry.stat(follow_symlinks=False)
                path = Path(entry.path)
                if stat.S_ISDIR(st.st_mode):
                    default = posixpath.join(lower, entry.name) if lower is not None else None
                    stack.append((path, self._existing(_lower_of(path, lower, default)), f"{here}/{entry.name}"))
                elif not is_whiteout(st):
                    _strip(path, (_ORIGIN,))

    def _materialise(self, top: Path, lower: str) -> None:
        """``top`` shows what it showed merged with the image's folder ``lower``, on its own (opaque)."""
        stack: list[tuple[Path, str | None]] = [(top, lower)]
        while stack:
            folder, lower = stack.pop()
            _strip(folder, (_ORIGIN, REDIRECT))
            os.setxattr(folder, OPAQUE, b"y", follow_symlinks=False)
            names = set()
            for entry in _entries(folder):
                names.add(entry.name)
                st = entry.stat(follow_symlinks=False)
                path = Path(entry.path)
                if is_whiteout(st):
                    os.unlink(path)  # what it hid is not copied in below
                elif stat.S_ISDIR(st.st_mode):
                    default = posixpath.join(lower, entry.name) if lower is not None else None
                    stack.append((path, self._existing(_lower_of(path, lower, default))))
                else:
                    _strip(path, (_ORIGIN,))
            if lower is None:
                continue
            source = self.base / lower.lstrip("/")
            for entry in _entries(source):
                if entry.name not in names:
                    self._copy_tree(Path(entry.path), folder / entry.name)

    def _copy_tree(self, source: Path, target: Path) -> None:
        """The image's ``source`` as ``target``, links not followed, owners through the IdMap."""
        stack = [(source, target)]
        while stack:
            source, target = stack.pop()
            if self._copy_entry(source, target):
                stack.extend((Path(entry.path), target / entry.name) for entry in _entries(source))

    def _copy_entry(self, source: Path, target: Path) -> bool:
        """One entry of the image copied, with its owner, mode and xattrs (overlayfs' own left
        out); whether it is a folder. A socket or a whiteout is left out."""
        st = os.lstat(source)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(target, 0o700)
        elif stat.S_ISREG(mode):
            with open(source, "rb", opener=_nofollow) as reader, open(target, "xb") as writer:
                shutil.copyfileobj(reader, writer, 1 << 20)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(source), target)
        elif (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)) and not is_whiteout(st):
            os.mknod(target, stat.S_IFMT(mode) | 0o600, st.st_rdev)
        else:
            return False
        os.chown(target, self.idmap.host_uid(st.st_uid), self.idmap.host_gid(st.st_gid), follow_symlinks=False)
        if not stat.S_ISLNK(mode):
            os.chmod(target, stat.S_IMODE(mode))  # after chown, which clears setuid
            for name in os.listxattr(source, follow_symlinks=False):
                if not name.startswith(_OVERLAY):
                    os.setxattr(target, name, os.getxattr(source, name, follow_symlinks=False))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        return stat.S_ISDIR(mode)

    def _existing(self, lower: str | None) -> str | None:
        return lower if lower is not None and self._image_dir(lower) else None

    def _image_dir(self, path: str) -> bool:
        """Whether ``path`` is a folder of the image, no link followed on the way."""
        host = self.base
        for part in [p for p in path.split("/") if p]:
            host = host / part
            st = _lstat(host)
            if st is None or not stat.S_ISDIR(st.st_mode):
                return False
        return True


def _lower_of(folder: Path, parent_lower: str | None, default: str | None) -> str | None:
    """The image folder a folder of the agent's layer merges with: none when opaque, its redirect
    (absolute, or beside its parent's), else ``default``."""
    if is_opaque(folder):
        return None
    try:
        redirect = os.getxattr(folder, REDIRECT, follow_symlinks=False)
    except OSError:
        return default
    target = os.fsdecode(redirect)
    if target.startswith("/"):
        return posixpath.normpath(target)
    return posixpath.join(parent_lower, target) if parent_lower is not None else None


def _strip(path: Path, names: tuple[str, ...]) -> None:
    for name in names:
        with suppress(OSError):
            os.removexattr(path, name, follow_symlinks=False)


def _entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return list(it)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _nofollow(path, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)
