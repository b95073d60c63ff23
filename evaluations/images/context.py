"""A build's context: what COPY and ADD may take from it, ``.dockerignore`` applied as Docker
applies it, and never anything outside it (SPEC §16).

1. ``Ignore``: the context's ``.dockerignore``, each line compiled as Docker's patternmatcher
   does (``*`` and ``?`` within one path component, ``**`` across any number, ``!`` re-includes,
   the last matching line wins, a path is excluded when it or one of its parent folders is).
2. ``sources``: the files one COPY names, wildcards expanded, resolved inside the context: a
   ``..`` or a link whose target leaves the context is refused, not clamped, and an excluded
   path is as missing as an absent one (Docker never sends it).
3. ``entries``: what a source copies, walked without following links (a link inside a copied
   folder is copied as a link), each with what the build cache hashes: name, mode, bytes or
   link target (not owners or times, as Docker's cache).
4. ``resolve``: a path inside a root whose links are resolved as they would be inside it: used
   for the context (escapes refused) and for an image's merged root (escapes clamped to it, as
   a chroot would see them), so the builder, running as host root, never follows an image's
   link onto the host.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import re
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path

MAX_LINK_HOPS = 40  # as the kernel's ELOOP
_GLOB_CHARS = frozenset("*?[")


class Escape(Exception):
    """A path that leads outside its root (``..`` above it, or a link's target)."""


def resolve(root: Path, relpath: str, *, clamp: bool, follow_last: bool = True) -> Path:
    """``root/relpath`` with every link on the way resolved inside ``root``; missing parts kept as
    named. ``clamp``: ``..`` above the root stays at the root and absolute link targets start at it
    (a chroot's view); otherwise such a path raises ``Escape``."""
    parts = deque(part for part in relpath.split("/") if part not in ("", "."))
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.popleft()
        if part == "..":
            if done:
                done.pop()
            elif not clamp:
                raise Escape(relpath)
            continue
        candidate = root.joinpath(*done, part)
        try:
            mode = os.lstat(candidate).st_mode
        except OSError:  # missing (or under a file): the rest is taken as named
            done.append(part)
            continue
        if stat.S_ISLNK(mode) and (parts or follow_last):
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise Escape(f"{relpath}: too many levels of links")
            target = os.readlink(candidate)
            if target.startswith("/"):
                if not clamp:
                    raise Escape(relpath)
                done = []
            parts.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
            continue
        done.append(part)
    return root.joinpath(*done)


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
        path = context / ".dockerignore"
        if not path.is_file() or path.is_symlink():
            return cls([])
        patterns = []
        for raw in path.read_text(errors="replace").splitlines():
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
    relpath: str  # as the instruction names it, cleaned ("" for the context itself)
    path: Path  # on the host, resolved inside the context
    wildcard: bool  # found by a pattern: makes the destination a folder, as Docker


@dataclass(frozen=True)
class Entry:
    """One thing a source copies: ``dest`` relative to where the source lands ("" for itself)."""

    dest: str
    kind: str  # "dir" | "file" | "link"
    mode: int  # permission bits (with setuid, setgid, sticky)
    host: Path  # where it is read from
    target: str = ""  # a link's target
    mtime_ns: int = 0


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
    if not _GLOB_CHARS & set(relpath):
        path = resolve(root, relpath, clamp=clamp)
        if not os.path.lexists(path) or (ignore and relpath and ignore.excluded(relpath)):
            return []
        return [Source(relpath, path, wildcard=False)]
    found: list[Source] = []
    _glob(root, relpath.split("/"), [], ignore, clamp, found)
    return sorted(found, key=lambda source: source.relpath)


def _glob(root: Path, parts: list[str], done: list[str], ignore, clamp: bool, found: list[Source]) -> None:
    if not parts:
        relpath = "/".join(done)
        if not (ignore and ignore.excluded(relpath)):
            found.append(Source(relpath, resolve(root, relpath, clamp=clamp), wildcard=True))
        return
    head, rest = parts[0], parts[1:]
    folder = resolve(root, "/".join(done), clamp=clamp)
    if not _GLOB_CHARS & set(head):
        if os.path.lexists(folder / head):
            _glob(root, rest, [*done, head], ignore, clamp, found)
        return
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names:
        if fnmatch.fnmatchcase(name, head):
            _glob(root, rest, [*done, name], ignore, clamp, found)


def entries(source: Source, ignore: Ignore | None) -> list[Entry]:
    """What ``source`` copies: a file (or link) itself, or a folder's contents (not the folder),
    parents before children, sorted; excluded paths left out, folders kept for what they hold."""
    st = os.stat(source.path)  # the source itself is followed: its links were resolved inside the root
    if not stat.S_ISDIR(st.st_mode):
        if not stat.S_ISREG(st.st_mode):
            return []
        return [Entry("", "file", stat.S_IMODE(st.st_mode), source.path, mtime_ns=st.st_mtime_ns)]
    found = [Entry("", "dir", stat.S_IMODE(st.st_mode), source.path, mtime_ns=st.st_mtime_ns)]
    _walk(source.path, source.relpath, "", ignore, found)
    return found


def _walk(folder: Path, relpath: str, dest: str, ignore, found: list[Entry]) -> bool:
    """Add ``folder``'s entries; True if any was kept (an excluded folder stays for a kept child)."""
    kept = False
    for name in sorted(os.listdir(folder)):
        path = folder / name
        rel = f"{relpath}/{name}" if relpath else name
        out = f"{dest}/{name}" if dest else name
        st = os.lstat(path)
        excluded = bool(ignore) and ignore.excluded(rel)
        if stat.S_ISDIR(st.st_mode):
            mark = len(found)
            found.append(Entry(out, "dir", stat.S_IMODE(st.st_mode), path, mtime_ns=st.st_mtime_ns))
            child_kept = _walk(path, rel, out, ignore, found)
            if excluded and not child_kept:
                del found[mark]
            else:
                kept = True
        elif excluded:
            continue
        elif stat.S_ISREG(st.st_mode):
            found.append(Entry(out, "file", stat.S_IMODE(st.st_mode), path, mtime_ns=st.st_mtime_ns))
            kept = True
        elif stat.S_ISLNK(st.st_mode):
            found.append(Entry(out, "link", 0o777, path, target=os.readlink(path)))
            kept = True
        # fifos, sockets, devices: nothing a build copies
    return kept


def content_hash(groups: list[tuple[str, list[Entry]]]) -> str:
    """The sha256 of exactly what a COPY copies: per source, each entry's name, kind, mode, and
    bytes or link target. Owners and times are not in it (Docker's cache ignores them too)."""
    digest = hashlib.sha256()
    for name, group in groups:
        digest.update(f"source\0{name}\0".encode())
        for entry in group:
            digest.update(f"{entry.dest}\0{entry.kind}\0{entry.mode:o}\0{entry.target}\0".encode())
            if entry.kind == "file":
                with open(entry.host, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                digest.update(b"\0end\0")
    return digest.hexdigest()
