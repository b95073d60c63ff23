"""A build's context: what COPY and ADD may take from it, ``.dockerignore`` applied as Docker
applies it, and never anything outside it (SPEC §16, §21).

1. ``Ignore``: the context's ``.dockerignore``, each line compiled as Docker's patternmatcher
   does (``*`` and ``?`` within one path component, ``**`` across any number, ``!`` re-includes,
   the last matching line wins, a path is excluded when it or one of its parent folders is).
2. ``sources``: the files one COPY names, wildcards expanded, resolved inside their root through
   images/inroot.py: in a context a ``..`` or a link whose target leaves it is refused
   (``beneath``), in another stage's root links are followed as that root's own (``clamp``); an
   excluded path is as missing as an absent one (Docker never sends it).
3. ``entries``: what a source copies, walked from folder handles without following links (a link
   inside a copied folder is copied as a link), each with what the build cache hashes: name,
   mode, bytes or link target (not owners or times, as Docker's cache), and its size, which a
   copy counts against the build's limits before writing.

No path through the content is ever turned into a host path: a ``Source`` is its root (a folder
the builder chose) and a path inside it, opened with ``open_in`` each time it is read.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import posixpath
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from evaluations.images import inroot

_GLOB_CHARS = frozenset("*?[")
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


class Escape(Exception):
    """A path that leads outside its root (``..`` above it, or a link's target)."""


# -- .dockerignore ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern
    exclusion: bool  # a "!" line: matching paths are included again


class Ignore:
    def __init__(self, patterns: list[_Pattern]):
        self.patterns = patterns

    @classmethod
    def read(cls, context: Path) -> Ignore:
        root_fd = inroot.open_root(context)
        try:
            data = inroot.read_in(root_fd, ".dockerignore", 1 << 20, follow_last=False)  # a link: none
        finally:
            os.close(root_fd)
        patterns = []
        for raw in (data or b"").decode(errors="replace").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exclusion = line.startswith("!")
            if exclusion:
                line = line[1:].strip()
            line = posixpath.normpath(line).lstrip("/")
            if line in ("", "."):
                continue
            patterns.append(_Pattern(_compile(line), exclusion))
        return cls(patterns)

    def excluded(self, relpath: str) -> bool:
        """Whether Docker leaves ``relpath`` (a context-relative path) out of the context."""
        parents = relpath.split("/")[:-1]
        prefixes = ["/".join(parents[: n + 1]) for n in range(len(parents))]
        result = False
        for pattern in self.patterns:
            matched = bool(pattern.regex.match(relpath)) or any(pattern.regex.match(p) for p in prefixes)
            if matched:
                result = not pattern.exclusion
        return result


def _compile(pattern: str) -> re.Pattern:
    """Docker's patternmatcher: ``**`` any folders (even none), ``*`` and ``?`` one component's characters."""
    out = ["^"]
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**", index):
            index += 2
            if pattern.startswith("/", index):
                index += 1
            out.append(".*" if index >= len(pattern) else "(.*/)?")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "\\" and index + 1 < len(pattern):
            index += 1
            out.append(re.escape(pattern[index]))
        elif char == "[":
            end = pattern.find("]", index + 1)
            if end < 0:
                out.append(re.escape(char))
            else:
                body = pattern[index + 1 : end]
                out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
                index = end
        else:
            out.append(re.escape(char))
        index += 1
    out.append("$")
    return re.compile("".join(out), re.S)


# -- sources and what they copy --------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    relpath: str  # as the instruction names it, cleaned ("" for the root itself)
    root: Path  # the folder it is inside of: the context, a stage's mounted root, a download's folder
    wildcard: bool  # found by a pattern: makes the destination a folder, as Docker
    beneath: bool = True  # a context: links may not leave it (else: followed in the root)

    def open(self, relpath: str, flags: int) -> int:
        """``relpath`` (an ``Entry.path``) in this source's root, resolved there."""
        with opened_root(self.root) as root_fd:
            return inroot.open_in(root_fd, relpath, flags, beneath=self.beneath)


@dataclass(frozen=True)
class Entry:
    """One thing a source copies: ``dest`` relative to where the source lands ("" for itself)."""

    dest: str
    kind: str  # "dir" | "file" | "link"
    mode: int  # permission bits (with setuid, setgid, sticky)
    path: str  # where it is read from: inside the source's root
    target: str = ""  # a link's target
    mtime_ns: int = 0
    size: int = 0  # a file's, as stat gives it (a sparse file's too): what a copy counts


@contextmanager
def opened_root(root: Path):
    fd = inroot.open_root(root)
    try:
        yield fd
    finally:
        os.close(fd)


def clean(relpath: str) -> str:
    """A source path as Docker takes it: relative to the context whatever its leading slash."""
    cleaned = posixpath.normpath("/" + relpath).lstrip("/")
    return "" if cleaned == "." else cleaned


def sources(root: Path, name: str, ignore: Ignore | None, *, clamp: bool = False) -> list[Source]:
    """The paths ``name`` names in ``root`` (a context, or with ``clamp`` a stage's root); [] when
    none exists or ``.dockerignore`` excludes it. Escape: it leads outside a context."""
    if not clamp and ".." in name.split("/") and posixpath.normpath(name).startswith(".."):
        raise Escape(name)
    relpath = clean(name)
    with opened_root(root) as root_fd:
        if not _GLOB_CHARS & set(relpath):
            if not _exists(root_fd, relpath, not clamp) or (ignore and relpath and ignore.excluded(relpath)):
                return []
            return [Source(relpath, root, wildcard=False, beneath=not clamp)]
        found: list[Source] = []
        _glob(root_fd, root, relpath.split("/"), [], ignore, not clamp, found)
    return sorted(found, key=lambda source: source.relpath)


def _exists(root_fd: int, relpath: str, beneath: bool, *, follow_last: bool = True) -> bool:
    try:
        os.close(inroot.open_in(root_fd, relpath, os.O_PATH, follow_last=follow_last, beneath=beneath))
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise Escape(relpath) from None
        if exc.errno in _MISSING:
            return False
        raise
    return True


def _glob(root_fd: int, root: Path, parts: list[str], done: list[str], ignore, beneath: bool, found: list) -> None:
    if not parts:
        relpath = "/".join(done)
        if not (ignore and ignore.excluded(relpath)):
            found.append(Source(relpath, root, wildcard=True, beneath=beneath))
        return
    head, rest = parts[0], parts[1:]
    if not _GLOB_CHARS & set(head):
        if _exists(root_fd, "/".join([*done, head]), beneath, follow_last=False):
            _glob(root_fd, root, rest, [*done, head], ignore, beneath, found)
        return
    try:
        folder = inroot.open_in(root_fd, "/".join(done), os.O_RDONLY | os.O_DIRECTORY, beneath=beneath)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise Escape("/".join(done)) from None
        return
    try:
        names = sorted(os.listdir(folder))
    finally:
        os.close(folder)
    for name in names:
        if fnmatch.fnmatchcase(name, head):
            _glob(root_fd, root, rest, [*done, name], ignore, beneath, found)


def entries(source: Source, ignore: Ignore | None) -> list[Entry]:
    """What ``source`` copies: a file (or link) itself, or a folder's contents (not the folder),
    parents before children, sorted; excluded paths left out, folders kept for what they hold."""
    try:  # the source itself is followed: its links resolve inside its root
        fd = source.open(source.relpath, os.O_PATH)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise Escape(source.relpath) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            if not stat.S_ISREG(st.st_mode):
                return []
            return [Entry("", "file", stat.S_IMODE(st.st_mode), source.relpath, mtime_ns=st.st_mtime_ns,
                          size=st.st_size)]  # fmt: skip
        found = [Entry("", "dir", stat.S_IMODE(st.st_mode), source.relpath, mtime_ns=st.st_mtime_ns)]
        folder = os.open(".", inroot.DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        _walk(folder, source.relpath, "", ignore, found)
    finally:
        os.close(folder)
    return found


def _walk(folder: int, relpath: str, dest: str, ignore, found: list[Entry]) -> bool:
    """Add the entries of the folder open as ``folder``; True if any was kept (an excluded folder
    stays for a kept child). Each child is opened from its parent's handle, never by path."""
    kept = False
    for name in sorted(os.listdir(folder)):
        rel = f"{relpath}/{name}" if relpath else name
        out = f"{dest}/{name}" if dest else name
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        excluded = bool(ignore) and ignore.excluded(rel)
        if stat.S_ISDIR(st.st_mode):
            mark = len(found)
            found.append(Entry(out, "dir", stat.S_IMODE(st.st_mode), rel, mtime_ns=st.st_mtime_ns))
            child = os.open(name, inroot.DIR_FLAGS, dir_fd=folder)
            try:
                child_kept = _walk(child, rel, out, ignore, found)
            finally:
                os.close(child)
            if excluded and not child_kept:
                del found[mark:]
            else:
                kept = True
        elif excluded:
            continue
        elif stat.S_ISREG(st.st_mode):
            found.append(Entry(out, "file", stat.S_IMODE(st.st_mode), rel, mtime_ns=st.st_mtime_ns, size=st.st_size))
            kept = True
        elif stat.S_ISLNK(st.st_mode):
            found.append(Entry(out, "link", 0o777, rel, target=os.readlink(name, dir_fd=folder)))
            kept = True
        # fifos, sockets, devices: nothing a build copies
    return kept


def read_file(source: Source, entry: Entry):
    """The file ``entry`` of ``source``, open to read (its links resolved in the source's root);
    OSError when it is no longer a regular file."""
    fd = source.open(entry.path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{entry.path} is no longer a file")
    return os.fdopen(fd, "rb")


def content_hash(groups: list[tuple[str, Source, list[Entry]]]) -> str:
    """The sha256 of exactly what a COPY copies: per source, each entry's name, kind, mode, and
    bytes or link target. Owners and times are not in it (Docker's cache ignores them too)."""
    digest = hashlib.sha256()
    for name, source, group in groups:
        digest.update(f"source\0{name}\0".encode())
        for entry in group:
            digest.update(f"{entry.dest}\0{entry.kind}\0{entry.mode:o}\0{entry.target}\0".encode())
            if entry.kind == "file":
                with read_file(source, entry) as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                digest.update(b"\0end\0")
    return digest.hexdigest()
