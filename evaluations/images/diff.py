"""``agent_patch`` for a task without a repository: the agent's changes under the image's
WorkingDir, against the image (SPEC §16, §21).

The evaluation's writable layer *is* the change set: overlayfs put there every file the commands
created or modified (copied up whole), a character device 0/0 for each removal (a whiteout) and
``trusted.overlay.opaque`` on a folder that replaced one of the image's. So nothing is rescanned
but what the evaluation touched: each entry of the upper folder under WorkingDir is compared with
the same entry of ``base``, the image's own root (its layers as a read-only overlay); below a
folder that replaced the image's (opaque, or new) the upper folder is the whole view and is
compared entry by entry with what the image had there.

The patch is git's format, paths relative to WorkingDir: a text file's unified diff, ``Binary
files a/X and b/X differ`` for the rest (a NUL byte, not UTF-8, or over ``MAX_FILE_BYTES``), a
link's target as its content, other kinds (a FIFO the agent left) named. Capped at ``max_bytes``.

Invariants (DESIGN "Paths inside an image"):

1. WorkingDir is resolved inside the image's root (``inroot.resolve``: the image's links followed
   as if its root were ``/``, from handles), never on the host.
2. Both trees are walked from folder handles, one name at a time (``*at`` calls, ``O_NOFOLLOW``):
   a link in either tree is content (its target string), never a way in. Nothing is opened by a
   path string built from image or agent content.
3. A file is read only when it is a regular file (a FIFO would block the reader), never more than
   ``MAX_FILE_BYTES`` + 1 bytes of it.
4. At most two folder handles are open whatever the depth: a folder's parent is found again
   through ``..`` and checked to be the one left (device and inode), as safefs.walk_nofollow does.
"""

from __future__ import annotations

import difflib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from evaluations.images import inroot

MAX_FILE_BYTES = 1024 * 1024  # a bigger file is shown as binary: a patch is for reading
OPAQUE = "trusted.overlay.opaque"  # "y" on a folder that replaced the lower one
REDIRECT = "trusted.overlay.redirect"  # on a renamed folder: where its lower folder is
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CLIMB = -1  # a folder handle closed while below it: opened again through ".." on the way back


class TreeChanged(OSError):
    """A folder was not where the walk left it: the trees changed while they were compared."""


def image_patch(upper: Path, base: Path, workdir: str, *, max_bytes: int, exclude: tuple[str, ...] = ()) -> str:
    """The changes under ``workdir`` (inside path) between ``base`` and ``base`` + ``upper``.

    ``exclude``: paths relative to the image's root (imageenv.executor_made), left out with what
    is below them."""
    upper_fd = os.open(upper, _DIR_FLAGS)
    try:
        base_fd = os.open(base, _DIR_FLAGS)
        try:
            inner = inroot.resolve(base_fd, workdir)
            top = _reach(upper_fd, base_fd, inner.split("/") if inner else [])
        finally:
            os.close(base_fd)
    finally:
        os.close(upper_fd)
    skip = tuple(item[len(inner) + 1 :] if inner else item for item in _strip(exclude) if _below(item, inner))
    writer = _Writer(max_bytes)
    if top is None:
        return ""
    for change in _Walk(top, skip).changes():
        writer.add(change)
        if writer.full:
            break
    return writer.text()


def _strip(items: tuple[str, ...]) -> list[str]:
    return [item.strip("/") for item in items if item.strip("/")]


def _below(item: str, inner: str) -> bool:
    return not inner or item.startswith(inner + "/")


def excluded(name: str, exclude: tuple[str, ...]) -> bool:
    """Whether ``name`` (relative, no leading /) is one of ``exclude`` or below one."""
    return any(name == item or name.startswith(item + "/") for item in exclude)


def is_whiteout(st: os.stat_result) -> bool:
    """An overlayfs whiteout (a character device 0/0): the lower file at that path was removed."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: Path | int) -> bool:
    """A folder of the upper layer (its path, or an fd open on it) that replaced the lower one:
    nothing of the lower shows through."""
    try:
        if isinstance(path, int):
            return os.getxattr(path, OPAQUE) == b"y"
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


# -- the two trees, walked together from handles -----------------------------------------------


@dataclass
class _Frame:
    """One folder of the view under WorkingDir: its handles in the agent's layer and in the image
    (None: it has none there), and whether the layer's folder is the whole view (opaque, below an
    opaque folder, or the image has no folder there): then the image's entries are compared one by
    one with it, else only the layer's entries are changes."""

    upper: int | None
    image: int | None
    whole: bool
    prefix: str = ""
    pending: list[str] = field(default_factory=list)
    idents: dict[str, tuple[int, int]] = field(default_factory=dict)

    def close(self) -> None:
        for fd in {self.upper, self.image} - {None, _CLIMB}:
            os.close(fd)


def _open_dir(dir_fd: int | None, name: str) -> int | None:
    if dir_fd is None:
        return None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None


def _reach(upper_root: int, image_root: int, parts: list[str]) -> _Frame | None:
    """The frame at WorkingDir (``parts``, resolved in the image): None when the agent's layer has
    no folder there (the image's own, unchanged) or put something else in its way."""
    upper, image = os.dup(upper_root), os.dup(image_root)
    whole = is_opaque(upper)
    try:
        for part in parts:
            st = inroot.lstat_at(upper, part)
            if st is None or not stat.S_ISDIR(st.st_mode):
                return None  # untouched, or removed or replaced by a file or a link: nothing under it
            child = _open_dir(upper, part)
            if child is None:
                return None
            os.close(upper)
            upper = child
            whole = whole or is_opaque(upper)
            child = _open_dir(image, part)
            if image is not None:
                os.close(image)
            image = child
        frame = _Frame(upper, image, whole or image is None)
        upper = image = None
        return frame
    finally:
        for fd in (upper, image):
            if fd is not None:
                os.close(fd)


@dataclass
class _Side:
    """One side of a change: (kind, bytes) for its content (a regular file's first MAX_FILE_BYTES + 1
    bytes, a link's target; kind ``other`` for what is neither), its git mode, and a name for its kind."""

    kind: str
    data: bytes
    mode: str
    kind_name: str = ""

    def same(self, other: _Side) -> bool:
        return (self.kind, self.data) == (other.kind, other.data)


@dataclass
class _Change:
    name: str
    old: _Side | None
    new: _Side | None


class _Walk:
    """Depth first, names in order; open: the current frame's two handles, and above it at most
    one per side (kept where the frame below has none on that side)."""

    def __init__(self, top: _Frame, skip: tuple[str, ...]):
        self.skip = skip
        self.stack: list[_Frame] = []
        self.frame = top
        top.pending = self._names(top)

    def changes(self):
        try:
            while True:
                frame = self.frame
                if frame.pending:
                    yield from self._entry(frame, *frame.pending.pop())
                elif self.stack:
                    self._up()
                else:
                    return
        finally:
            self.frame.close()
            for frame in self.stack:
                frame.close()

    def _names(self, frame: _Frame) -> list[tuple[str, bool]]:
        """(name, False) for each entry to look at, last first (popped from the end)."""
        names = set(_list(frame.upper))
        if frame.whole or frame.upper is None:
            names |= set(_list(frame.image))
        kept = (name for name in names if not excluded(frame.prefix + name, self.skip))
        return [(name, False) for name in sorted(kept, reverse=True)]

    def _entry(self, frame: _Frame, name: str, after: bool):
        """The changes of one name; ``after``: the file the agent put where the image had a folder,
        shown after that folder's removal."""
        path = frame.prefix + name
        new = inroot.lstat_at(frame.upper, name)
        if new is not None and is_whiteout(new):
            new = None
        elif new is None and frame.upper is not None and not frame.whole:
            return  # not in the layer: the image's, unchanged
        if after:
            if new is not None:
                yield _Change(path, None, _side(frame.upper, name, new))
            return
        old = inroot.lstat_at(frame.image, name)
        if old is not None and is_whiteout(old):
            old = None  # (a one-layer image is its layer's own tree)
        if new is None and old is None:
            return
        new_dir = new is not None and stat.S_ISDIR(new.st_mode)
        old_dir = old is not None and stat.S_ISDIR(old.st_mode)
        if new_dir:
            if old is not None and not old_dir:
                yield _Change(path, _side(frame.image, name, old), None)  # a file became a folder
            self._down(frame, name, upper=True, image=old_dir)
            return
        if old_dir:  # removed, or a folder became a file: what the folder held first
            if new is not None:
                frame.pending.append((name, True))
            self._down(frame, name, upper=False, image=True)
            return
        old_side = _side(frame.image, name, old) if old is not None else None
        new_side = _side(frame.upper, name, new) if new is not None else None
        if old_side is not None and new_side is not None and old_side.same(new_side):
            return  # copied up for its metadata only (chmod, touch)
        yield _Change(path, old_side, new_side)

    def _down(self, frame: _Frame, name: str, *, upper: bool, image: bool) -> None:
        child = _Frame(
            _open_dir(frame.upper, name) if upper else None,
            _open_dir(frame.image, name) if image else None,
            frame.whole,
            prefix=f"{frame.prefix}{name}/",
        )
        if child.upper is None and child.image is None:
            return  # gone since it was listed
        child.whole = frame.whole or child.image is None or (child.upper is not None and is_opaque(child.upper))
        for side in ("upper", "image"):
            above = getattr(frame, side)
            if getattr(child, side) is not None and above is not None:
                st = os.fstat(above)
                frame.idents[side] = (st.st_dev, st.st_ino)
                os.close(above)
                setattr(frame, side, _CLIMB)
        self.stack.append(frame)
        self.frame = child
        child.pending = self._names(child)

    def _up(self) -> None:
        child, parent = self.frame, self.stack[-1]
        for side in ("upper", "image"):
            if getattr(parent, side) != _CLIMB:
                continue
            fd = os.open("..", _DIR_FLAGS, dir_fd=getattr(child, side))
            st = os.fstat(fd)
            setattr(parent, side, fd)  # closed with the parent from here on
            if (st.st_dev, st.st_ino) != parent.idents[side]:
                raise TreeChanged(f"{parent.prefix or 'the working directory'} moved while it was compared")
        self.stack.pop()
        child.close()
        self.frame = parent


def _list(fd: int | None) -> list[str]:
    if fd is None:
        return []
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _side(dir_fd: int, name: str, st: os.stat_result) -> _Side:
    """What the entry ``name`` of the folder ``dir_fd`` holds, read without following it."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            return _Side("link", os.fsencode(os.readlink(name, dir_fd=dir_fd)), "120000")
        except OSError:
            return _Side("other", b"", "120000", "a link that cannot be read")
    git_mode = "100755" if mode & 0o111 else "100644"
    if not stat.S_ISREG(mode):
        kind = _kind_name(mode)
        return _Side("other", f"{kind} {st.st_rdev}".encode(), git_mode, kind)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return _Side("other", b"", git_mode, "a file that cannot be read")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _Side("other", b"", git_mode, "a file that changed while it was read")
        chunks, left = [], MAX_FILE_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        return _Side("file", b"".join(chunks), git_mode)
    finally:
        os.close(fd)


def _kind_name(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return name
    return "a special file"


class _Writer:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.parts: list[str] = []
        self.size = 0
        self.full = False

    def text(self) -> str:
        return "".join(self.parts)

    def _emit(self, text: str) -> None:
        if self.size + len(text.encode()) > self.max_bytes:
            self.parts.append(f"[executor: the patch is cut here, at MAX_OUTPUT_BYTES x 8 = {self.max_bytes} bytes]\n")
            self.full = True
            return
        self.parts.append(text)
        self.size += len(text.encode())

    def add(self, change: _Change) -> None:
        name, old, new = change.name, change.old, change.new
        head = f"diff --git a/{name} b/{name}\n"
        if new is not None and new.kind == "other":
            self._emit(f"{head}# {name}: {new.kind_name}, not shown\n")
            return
        if old is not None and old.kind == "other":
            if new is None:
                self._emit(f"{head}# {name}: {old.kind_name} of the image, removed\n")
                return
            old = None  # shown as a new file
        if old is None:
            head += f"new file mode {new.mode}\n"
        elif new is None:
            head += f"deleted file mode {old.mode}\n"
        old_text, new_text = _text(old), _text(new)
        if (old is not None and old_text is None) or (new is not None and new_text is None):
            self._emit(
                f"{head}Binary files {'a/' + name if old else '/dev/null'} and {'b/' + name if new else '/dev/null'} differ\n"
            )
            return
        lines = difflib.unified_diff(
            (old_text or "").splitlines(keepends=True),
            (new_text or "").splitlines(keepends=True),
            fromfile=f"a/{name}" if old is not None else "/dev/null",
            tofile=f"b/{name}" if new is not None else "/dev/null",
        )
        body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        self._emit(head + body)


def _text(side: _Side | None) -> str | None:
    if side is None:
        return None
    kind, data = side.kind, side.data
    if kind == "link":
        return os.fsdecode(data)
    if len(data) > MAX_FILE_BYTES or b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
