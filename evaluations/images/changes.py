"""``system_changes`` (SPEC §17): what the agent created, changed or removed in an image outside
its working directory and ``/logs/agent``, read from its writable layer after it ended.

The evaluation's layer (rootfs.upper_of) is the change set, in overlayfs' format (diff.py): each
entry below it is one of

1. a whiteout (diff.is_whiteout): the image's file or folder there was removed (reported when
   the image had it);
2. a folder: reported when it is new (the image has no folder there), replaces the image's
   (opaque over a folder of the image: its contents there are gone; overlayfs marks a new folder
   opaque too) or its mode or owner differ from the image's (chmod, chown; the image's ids mapped
   through the evaluation's IdMap). A folder overlayfs copied up only because something below it
   changed is not a change itself; its entries are walked;
3. anything else (a file, a link, a FIFO): created or changed, copy-ups for metadata alone
   (chmod, touch) included.

Not walked: ``workdir`` (the image's WorkingDir, with the image's own links resolved), ``logs/agent``
and ``exclude`` (what the executor and the sandbox put there: imageenv.executor_made). A folder on
the way to one of them that the image lacks (``/logs``) was made for it, and is not reported.

``paths``: the first ``limit`` paths (absolute, sorted), ``count``: all of them. ``suspicious``:
those a verifier could be subverted through (``_suspicious``), sorted, at most ``limit`` too,
startup hooks and the verifier's PATH before library files when there are more. ``suspicious``
also names what the agent put in a folder of the verifier's PATH inside its working directory
(SPEC §21: ``ENV PATH=/app/bin:$PATH`` with ``WORKDIR /app``), which ``paths`` leaves out as the
agent's own. The walk never follows a link, holds one folder open at a time (safefs.walk_nofollow)
and keeps at most 2 x ``limit`` paths in memory whatever the layer's size.

The image (``base``) is read from handles too (SPEC §21): ``workdir`` and the PATH folders are
resolved inside it (inroot.resolve), and beside each folder of the layer the walk holds the
image's folder of the same name, opened from its parent's with ``O_NOFOLLOW`` (a link of the image
there is not a folder: what the layer has below it is new), found again through ``..`` on the way
back. No path through the image is ever a string joined onto ``base``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from evaluations.images import inroot
from evaluations.images.diff import excluded, is_opaque, is_whiteout
from evaluations.runtime.idmap import IdMap
from evaluations.safefs import SafeFSError, open_root_dir, open_subdir, walk_nofollow

AGENT_LOGS = "logs/agent"  # the agent's artifacts (SPEC §17): its own, never a system change
LIMIT = 200

# A path component naming an interpreter or its library folder: python3, python3.11, pypy3,
# perl, perl5, perl-base, ruby3.1, php8.2, lua5.4, node, nodejs, node_modules, gems, jvm.
_INTERPRETER = re.compile(r"(python|pypy|perl|ruby|php|lua|luajit|tcl|tclsh|node|nodejs)[0-9.]*(-base)?")
_LIBRARIES = frozenset({"site-packages", "dist-packages", "node_modules", "gems", "jvm"})
_SHELLS = frozenset({"sh", "bash", "rbash", "dash", "zsh", "ksh", "mksh", "fish"})
# Files a program reads when it starts, wherever they are.
_HOOK_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
_DOTFILES = frozenset({".bashrc", ".profile", ".bash_profile", ".bash_login", ".zshrc", ".zshenv", ".zprofile"})
# System files and folders read by shells, the dynamic linker and alternatives (root-relative prefixes).
_SYSTEM_HOOKS = (
    "etc/profile",
    "etc/profile.d",
    "etc/bash.bashrc",
    "etc/bashrc",
    "etc/environment",
    "etc/zsh",
    "etc/alternatives",
    "etc/ld.so.preload",
    "etc/ld.so.cache",
)


def system_changes(
    upper: Path,
    base: Path,
    idmap: IdMap,
    *,
    workdir: str,
    exclude: tuple[str, ...],
    path_dirs: tuple[str, ...],
    limit: int = LIMIT,
) -> dict:
    """``{count, paths, suspicious}`` for the layer ``upper`` over the image root ``base``
    (rootfs.image_base), its owners under ``idmap``. ``exclude``: root-relative paths; ``path_dirs``:
    the verifier's PATH entries (absolute, resolved in the image). ``workdir`` ``/``: everything
    is the working directory, nothing is a system change (what is on PATH is still suspicious)."""
    base_fd = open_root_dir(base)
    try:
        inner = inroot.resolve(base_fd, workdir)
        skip = tuple(item.strip("/") for item in (inner, AGENT_LOGS, *exclude) if item.strip("/"))
        on_path = tuple(sorted({_in_image(base_fd, item) for item in path_dirs if item.startswith("/")} - {""}))
        walk = _Walk(base_fd, idmap, skip, on_path, limit)
        if inner:
            walk.run(upper)
    finally:
        os.close(base_fd)
    _on_path_in_workdir(upper, inner, on_path, lambda relpath: walk.suspicious.add((0, "/" + relpath)))
    return walk.result()


def _in_image(base_fd: int, path: str) -> str:
    try:
        return inroot.resolve(base_fd, path)
    except OSError:  # a PATH entry through a file, or links that loop: names nothing of the image
        return ""


def _on_path_in_workdir(upper: Path, inner: str, on_path: tuple[str, ...], found: Callable[[str], None]) -> None:
    """``found(relpath)`` for what the agent's layer holds in the ``on_path`` folders inside the working
    directory ``inner`` (all of them for ``/``): each entry but a folder or a whiteout, or the folder
    itself when the agent put something else in its place (a link a PATH lookup would follow).
    Suspicious though in the agent's own folder; nothing is followed."""
    top = open_root_dir(upper)
    try:
        for folder in on_path:
            if inner and folder != inner and not folder.startswith(inner + "/"):
                continue
            fd = _open_folder(top, folder)
            if fd is None:
                st = _lstat_at(top, folder)
                if st is not None and not stat.S_ISDIR(st.st_mode) and not is_whiteout(st):
                    found(folder)
                continue
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        st = entry.stat(follow_symlinks=False)
                        if not (stat.S_ISDIR(st.st_mode) or is_whiteout(st)):
                            found(f"{folder}/{entry.name}")
            finally:
                os.close(fd)
    finally:
        os.close(top)


def _open_folder(top: int, relpath: str) -> int | None:
    """``relpath`` below ``top`` as a folder, no link followed; None when it is not one there."""
    try:
        return open_subdir(top, relpath.split("/"), create=False)
    except OSError:
        return None


def _lstat_at(top: int, relpath: str) -> os.stat_result | None:
    parent, _, name = relpath.rpartition("/")
    fd = _open_folder(top, parent) if parent else os.dup(top)
    if fd is None:
        return None
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)


def _suspicious(relpath: str, on_path: tuple[str, ...]) -> int | None:
    """0 for a startup hook or the verifier's PATH, 1 for an interpreter's or a shell's files, None else."""
    parts = relpath.split("/")
    name = parts[-1]
    if name in _HOOK_NAMES or name.endswith(".pth") or name in _DOTFILES:
        return 0
    if relpath.startswith("etc/ld.so.conf") or excluded(relpath, _SYSTEM_HOOKS) or excluded(relpath, on_path):
        return 0
    if any(part in _LIBRARIES or part in _SHELLS or _INTERPRETER.fullmatch(part) for part in parts):
        return 1
    return None


class _Smallest:
    """The ``limit`` smallest items seen, holding at most 2 x ``limit``."""

    def __init__(self, limit: int):
        self.limit, self.items = limit, []

    def add(self, item) -> None:
        self.items.append(item)
        if len(self.items) >= 2 * self.limit + 1:
            self.items = sorted(self.items)[: self.limit]

    def result(self) -> list:
        return sorted(self.items)[: self.limit]


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Frame:
    """A folder of the layer being walked: its relpath, and the image's folder of that path (a
    handle; None when the image has none to compare with: below a new or opaque folder)."""

    def __init__(self, relpath: str, image: int | None, ident: tuple[int, int] | None = None):
        self.relpath, self.image = relpath, image
        self.parent_ident = ident  # the image folder above, closed while below: found again by ".."


class _Walk:
    def __init__(self, base_fd: int, idmap: IdMap, skip: tuple[str, ...], on_path: tuple[str, ...], limit: int):
        self.base_fd, self.idmap, self.skip, self.on_path = base_fd, idmap, skip, on_path
        self.count = 0
        self.paths, self.suspicious = _Smallest(limit), _Smallest(limit)
        self.frames: list[_Frame] = []

    def run(self, upper: Path) -> None:
        top = open_root_dir(upper)
        self.frames.append(_Frame("", os.dup(self.base_fd)))
        try:
            walk_nofollow(
                top, on_entry=self._entry, on_dir=self._dir, on_enter=self._enter, on_leave=self._leave, tolerant=True
            )
        finally:
            os.close(top)
            for frame in self.frames:
                if frame.image is not None:
                    os.close(frame.image)
            self.frames.clear()

    def result(self) -> dict:
        suspicious = sorted(path for _, path in self.suspicious.result())
        return {"count": self.count, "paths": self.paths.result(), "suspicious": suspicious}

    def _report(self, relpath: str) -> None:
        self.count += 1
        self.paths.add("/" + relpath)
        tier = _suspicious(relpath, self.on_path)
        if tier is not None:
            self.suspicious.add((tier, "/" + relpath))

    def _child(self, name: str) -> tuple[str, int | None]:
        parent = self.frames[-1]
        return (f"{parent.relpath}/{name}" if parent.relpath else name), parent.image

    def _entry(self, dir_fd: int, entry: os.DirEntry) -> None:
        relpath, image = self._child(entry.name)
        if excluded(relpath, self.skip):
            return
        st = entry.stat(follow_symlinks=False)
        if is_whiteout(st) and inroot.lstat_at(image, entry.name) is None:
            return  # hides nothing of the image
        self._report(relpath)

    def _dir(self, dir_fd: int, entry: os.DirEntry) -> bool:
        relpath, _ = self._child(entry.name)
        return not excluded(relpath, self.skip)  # an excluded folder is not entered

    def _enter(self, fd: int, name: str) -> None:
        relpath, parent_image = self._child(name)
        opaque = is_opaque(fd)
        image = inroot.lstat_at(parent_image, name)
        if image is not None and not stat.S_ISDIR(image.st_mode):
            image = None  # a file or a link of the image: the layer's folder is new there
        child = None
        if image is not None and not opaque:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=parent_image)
            except OSError:
                image = None
        frame = _Frame(relpath, child)
        if child is not None:  # the parent's handle is closed while below, found again by ".."
            parent = self.frames[-1]
            frame.parent_ident = _ident(parent.image)
            os.close(parent.image)
            parent.image = None
        self.frames.append(frame)
        if image is None:  # new (overlayfs marks a new folder opaque too), or in place of a file
            if not any(item.startswith(relpath + "/") for item in self.skip):
                self._report(relpath)  # (a folder on the way to the working directory or the executor's: made for it)
        elif opaque or self._metadata_changed(os.fstat(fd), image):
            self._report(relpath)  # the image's folder replaced whole, or its mode or owner changed

    def _leave(self, parent_fd: int, name: str) -> None:
        frame = self.frames.pop()
        if frame.image is None:
            return
        try:
            parent = os.open("..", _DIR_FLAGS, dir_fd=frame.image)
        finally:
            os.close(frame.image)
        if _ident(parent) != frame.parent_ident:
            os.close(parent)
            raise SafeFSError(f"the image's folder above /{frame.relpath} changed while it was compared")
        self.frames[-1].image = parent

    def _metadata_changed(self, st: os.stat_result, image: os.stat_result) -> bool:
        owner = (self.idmap.host_uid(image.st_uid), self.idmap.host_gid(image.st_gid))
        return stat.S_IMODE(st.st_mode) != stat.S_IMODE(image.st_mode) or (st.st_uid, st.st_gid) != owner


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
