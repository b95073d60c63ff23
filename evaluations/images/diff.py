"""``agent_patch`` for a task without a repository: the agent's changes under the image's
WorkingDir, against the image (SPEC §16).

The evaluation's writable layer *is* the change set: overlayfs put there every file the commands
created or modified (copied up whole), a character device 0/0 for each removal (a whiteout) and
``trusted.overlay.opaque`` on a folder that replaced one of the image's. So nothing is rescanned
but what the evaluation touched: each entry of the upper folder under WorkingDir is compared with
the same path in ``base``, the image's own root (its layers as a read-only overlay).

The patch is git's format, paths relative to WorkingDir: a text file's unified diff, ``Binary
files a/X and b/X differ`` for the rest (a NUL byte, not UTF-8, or over ``MAX_FILE_BYTES``), a
link's target as its content, other kinds (a FIFO the agent left) named. Capped at ``max_bytes``.

Everything under the upper folder is the agent's: it is read without following a link and only
when it is a regular file (a FIFO would block the reader), never more than ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path

MAX_FILE_BYTES = 1024 * 1024  # a bigger file is shown as binary: a patch is for reading
OPAQUE = "trusted.overlay.opaque"  # "y" on a folder that replaced the lower one
REDIRECT = "trusted.overlay.redirect"  # on a renamed folder: where its lower folder is


def image_patch(upper: Path, base: Path, workdir: str, *, max_bytes: int, exclude: tuple[str, ...] = ()) -> str:
    """The changes under ``workdir`` (inside path) between ``base`` and ``base`` + ``upper``."""
    relative = workdir.strip("/")
    top = upper / relative if relative else upper
    if not _is_dir(top):
        return ""
    writer = _Writer(max_bytes)
    for path in _changed(top, base / relative if relative else base, "", exclude):
        if writer.full:
            break
        writer.add(path)
    return writer.text()


class _Change:
    def __init__(self, name: str, old: Path | None, new: Path | None):
        self.name, self.old, self.new = name, old, new


def _changed(upper: Path, base: Path, prefix: str, exclude: tuple[str, ...]):
    """(name, base path or None, upper path or None) for each file changed below ``upper``, sorted."""
    try:
        entries = sorted(os.scandir(upper), key=lambda e: e.name)
    except OSError:
        return
    opaque = is_opaque(upper)
    seen = set()
    for entry in entries:
        name = f"{prefix}{entry.name}"
        seen.add(entry.name)
        if excluded(name, exclude):
            continue
        st = entry.stat(follow_symlinks=False)
        old = base / entry.name
        old_exists = not opaque and os.path.lexists(old)
        if is_whiteout(st):  # removed
            if old_exists:
                yield from _all(old, name, removed=True, exclude=exclude)
            continue
        if stat.S_ISDIR(st.st_mode):
            if old_exists and not _is_dir(old):
                yield _Change(name, old, None)  # a file became a folder
                old_exists = False
            if old_exists:
                yield from _changed(Path(entry.path), old, name + "/", exclude)
            else:
                yield from _all(Path(entry.path), name, removed=False, exclude=exclude)
            continue
        if old_exists and _is_dir(old):
            yield from _all(old, name, removed=True, exclude=exclude)  # a folder became a file
            old_exists = False
        if old_exists and _same(old, Path(entry.path)):
            continue  # copied up for its metadata only (chmod, touch)
        yield _Change(name, old if old_exists else None, Path(entry.path))
    if opaque and _is_dir(base):  # the folder replaced the image's: what it held is gone
        for entry in sorted(os.scandir(base), key=lambda e: e.name):
            if entry.name not in seen and not excluded(f"{prefix}{entry.name}", exclude):
                yield from _all(Path(entry.path), f"{prefix}{entry.name}", removed=True, exclude=exclude)


def _all(path: Path, name: str, *, removed: bool, exclude: tuple[str, ...]):
    """Every file at or below ``path``: all removed, or all new."""
    if excluded(name, exclude):
        return
    if _is_dir(path):
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if is_whiteout(st):
                continue  # a whiteout inside a new folder hides nothing the patch shows
            yield from _all(Path(entry.path), f"{name}/{entry.name}", removed=removed, exclude=exclude)
        return
    yield _Change(name, path, None) if removed else _Change(name, None, path)


def excluded(name: str, exclude: tuple[str, ...]) -> bool:
    """Whether ``name`` (relative, no leading /) is one of ``exclude`` or below one."""
    return any(name == item or name.startswith(item + "/") for item in exclude)


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


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


def _same(old: Path, new: Path) -> bool:
    a, b = _content(old), _content(new)
    return a is not None and a == b


def _content(path: Path) -> tuple[str, bytes] | None:
    """(kind, bytes): a regular file's first MAX_FILE_BYTES + 1 bytes, a link's target; None for others."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "link", os.fsencode(os.readlink(path))
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], MAX_FILE_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        return "file", b"".join(chunks)
    finally:
        os.close(fd)


def _kind_name(path: Path) -> str:
    mode = os.lstat(path).st_mode
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return name
    return "a special file"


def _mode(path: Path) -> str:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "120000"
    return "100755" if st.st_mode & 0o111 else "100644"


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
        name = change.name
        head = f"diff --git a/{name} b/{name}\n"
        old = _content(change.old) if change.old is not None else None
        new = _content(change.new) if change.new is not None else None
        if change.new is not None and new is None:
            self._emit(f"{head}# {name}: {_kind_name(change.new)}, not shown\n")
            return
        if change.old is None:
            head += f"new file mode {_mode(change.new)}\n"
        elif change.new is None:
            head += f"deleted file mode {_mode(change.old)}\n"
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


def _text(content: tuple[str, bytes] | None) -> str | None:
    if content is None:
        return None
    kind, data = content
    if kind == "link":
        return os.fsdecode(data)
    if len(data) > MAX_FILE_BYTES or b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
