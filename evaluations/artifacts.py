"""What the agent leaves under ``/logs/agent``, kept after the evaluation (SPEC §17 "Artifacts").

DATA_DIR/artifacts/ (the service's, 0700: no sandbox uid reaches anything here by path)
  <eval_id>/<path>                  the kept files, the agent's own relative paths, 0600
  .keeping-<eval_id>-<hex>/         a copy being made; renamed to <eval_id>/ once complete

1. ``keep`` copies the folder the agent wrote (after it ended, no process of it alive) into the
   store and returns what it kept, ``[{path, size_bytes, sha256}]`` sorted by path, for the
   evaluation's ``artifacts``. The folder was written by untrusted code: it is walked with
   directory descriptors, nothing is opened through a symbolic link (``O_NOFOLLOW`` on every
   component, safefs), and only regular files are copied. Links, FIFOs, sockets, devices,
   hard-linked files (a second name for a file the agent may not have been able to read),
   files and folders not owned by the evaluation's uid, unsafe names (not UTF-8, control or
   invisible characters, a backslash) and paths too deep or too long are left out, each with
   its reason.
2. Bounds: ``MAX_ARTIFACT_BYTES`` for the bytes of all kept files together (0 keeps none),
   ``MAX_FILES`` files, ``MAX_PARTS`` components and ``MAX_PATH_BYTES`` bytes a path,
   ``MAX_ENTRIES`` entries walked. Files are taken in path order; one that would take the total
   past MAX_ARTIFACT_BYTES is left out whole (never cut), and later smaller ones may still fit.
   Bytes are counted while copying, not trusted from ``stat``: a file that grew is left out too.
3. What was left out is on ``Kept.omitted``; ``Kept.summary()`` is the sentence for the
   evaluation's log, so the evaluation says what it did not keep.
4. The store is read only through paths listed on the evaluation (``open_listed``: the API's
   route and the admin's page serve nothing else) and is removed with the row (reaper.purge_old) or as an orphan
   (reaper.remove_orphan_artifacts).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import logging
import os
import stat
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from evaluations.safefs import SafeFSError, open_root_dir, open_subdir, remove_entry_nofollow

logger = logging.getLogger("term_executor.artifacts")

STORE_FOLDER = "artifacts"
KEEPING_PREFIX = ".keeping-"
MAX_FILES = 1000  # listed on every GET /evaluate/{id}: ~150 bytes each
MAX_PARTS = 16  # components of a path: a file at most 15 folders below /logs/agent
MAX_PATH_BYTES = 1024  # UTF-8 bytes of a whole path
MAX_NAME_BYTES = 255  # of one component, as every Linux file system
MAX_ENTRIES = 100_000  # files, folders and others walked before the walk stops (as MAX_FILES' default)
MAX_SHOWN_OMISSIONS = 20  # named in the summary sentence; the rest counted
_CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the walk's lstat must not hang the open.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_ODD_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")  # control, format (U+202E...), surrogates, separators


class UnsafeName(ValueError):
    """A path that is not a safe artifact name; the message says why."""


@dataclass(frozen=True)
class Omission:
    path: str  # as safe to print: an unsafe name is shown escaped
    reason: str


@dataclass(frozen=True)
class Source:
    """One place whose files are kept (SPEC §17, §23): the entry ``name`` of the folder ``open_parent()``
    returns a handle of (the caller closes nothing: ``keep_sources`` does), a folder whose files are
    listed under ``listed`` (``()``: by their own relative paths, as /logs/agent's) or one regular
    file listed as ``listed``. The entry is never followed: a link there is left out. ``owner_uid``:
    what its files must be owned by (None: no owner check, as for an image's own root); ``placed_at``:
    its path in a separate verifier (None: not copied there); ``shown``: how a log line names it."""

    shown: str
    listed: tuple[str, ...]
    open_parent: Callable[[], tuple[int, str]]
    owner_uid: int | None = None
    placed_at: str | None = None
    exclude: tuple[str, ...] = ()  # a folder's tar --exclude patterns (Harbor's ``ArtifactConfig.exclude``)

    @classmethod
    def folder(cls, folder: Path, owner_uid: int | None, shown: str = "/logs/agent", **fields) -> Source:
        """A folder of the executor's own making (its parent is trusted), as /logs/agent's."""
        return cls(shown, fields.pop("listed", ()), lambda: (open_root_dir(folder.parent), folder.name),
                   owner_uid, **fields)  # fmt: skip


@dataclass(frozen=True)
class Placement:
    """Where a kept file goes in a separate verifier (``Source.placed_at``), with its permission bits."""

    path: str
    mode: int


@dataclass
class Kept:
    """What ``keep`` did: the files kept (the evaluation's ``artifacts``) and what it left out."""

    artifacts: list[dict] = field(default_factory=list)
    omitted: list[Omission] = field(default_factory=list)
    error: str = ""  # the store could not be written: nothing kept
    sources: tuple[str, ...] = ("/logs/agent",)  # how the summary names where they came from
    placed: dict[str, Placement] = field(default_factory=dict)  # listed path -> its place in a separate verifier

    @property
    def total_bytes(self) -> int:
        return sum(entry["size_bytes"] for entry in self.artifacts)

    def summary(self) -> str:
        """One sentence for the evaluation's log: what was kept and what was not, and why."""
        files = len(self.artifacts)
        origin = ", ".join(self.sources[:MAX_SHOWN_OMISSIONS])
        text = f"artifacts: kept {files} file{'' if files == 1 else 's'} ({self.total_bytes} bytes) from {origin}"
        if self.error:
            return f"{text}; {self.error}"
        if self.omitted:
            shown = "; ".join(f"{o.path} ({o.reason})" for o in self.omitted[:MAX_SHOWN_OMISSIONS])
            more = len(self.omitted) - MAX_SHOWN_OMISSIONS
            text += f"; left out {len(self.omitted)}: {shown}" + (f"; and {more} more" if more > 0 else "")
        return text


def store_root(config) -> Path:
    return config.data_dir / STORE_FOLDER


def check_path(path: str) -> list[str]:
    """The components of ``path`` if it is a safe artifact name, else ``UnsafeName`` saying why.

    Safe: relative, ``/``-separated, 1 to MAX_PARTS components, none empty, ``.`` or ``..``, each
    at most MAX_NAME_BYTES and the whole at most MAX_PATH_BYTES of valid UTF-8, with no control or
    invisible character and no backslash. What ``keep`` lists and the only names the API serves.
    """
    if not isinstance(path, str) or not path:
        raise UnsafeName("the path is empty")
    try:
        size = len(path.encode("utf-8"))  # a name of undecodable bytes holds surrogates: refused here
    except UnicodeEncodeError:
        raise UnsafeName("the path is not valid UTF-8") from None
    if size > MAX_PATH_BYTES:
        raise UnsafeName(f"the path is longer than {MAX_PATH_BYTES} bytes")
    parts = path.split("/")
    if len(parts) > MAX_PARTS:
        raise UnsafeName(f"the path is more than {MAX_PARTS} names deep")
    for part in parts:
        _check_name(part)
    return parts


def _check_name(name: str) -> None:
    if name == "":
        raise UnsafeName("the path has an empty name (a leading, trailing or double '/')")
    if name in (".", ".."):
        raise UnsafeName(f"the path names '{name}'")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeName("the path is not valid UTF-8") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise UnsafeName(f"a name is longer than {MAX_NAME_BYTES} bytes")
    for char in name:
        if char == "\\":
            raise UnsafeName("the path contains a backslash")
        if unicodedata.category(char) in _ODD_CATEGORIES:
            raise UnsafeName(f"the path contains the control or invisible character U+{ord(char):04X}")


def _shown(parts: list[str] | tuple[str, ...]) -> str:
    """A path for a log line: safe names as they are, others escaped (no control character gets out)."""
    text = "/".join(parts)
    try:
        check_path(text)
    except UnsafeName:
        text = ascii(text)
    return text if len(text) <= 200 else text[:200] + "..."


def kept_folder(eval_id, config) -> Path:
    """The store's folder of what an evaluation kept so far (a task of [[steps]] keeps each step's over the
    earlier steps', pipeline/collect.py)."""
    return store_root(config) / _eval_folder_name(eval_id)


def _eval_folder_name(eval_id) -> str:
    return str(uuid.UUID(str(eval_id)))  # canonical: nothing but hex and dashes reaches a path


# -- keeping ------------------------------------------------------------------------------------


def keep(eval_id, folder: Path, config, *, owner_uid: int | None) -> Kept:
    """Copy the files the agent left in ``folder`` (its ``/logs/agent``) into the store (``keep_sources``).

    Call it after the agent ended and no process of it is alive. ``owner_uid``: the evaluation's
    leased uid; files and folders owned by anyone else are left out (None: no owner check, for a
    service without the sandbox)."""
    return keep_sources(eval_id, [Source.folder(folder, owner_uid)], config)


def keep_sources(eval_id, sources: list[Source], config) -> Kept:
    """Copy the files of ``sources``, in their order, into the store, and say what was kept.

    Returns the kept files sorted by path and what was left out; never raises for what the sources
    hold. A listed path another source's file already took is left out (the first claim stands, as
    Harbor's collection keeps it). A store that cannot be written (disk full) keeps nothing:
    ``Kept.error`` says why, and the evaluation goes on.
    """
    name = _eval_folder_name(eval_id)
    kept = Kept(sources=tuple(source.shown for source in sources))
    if config.max_artifact_bytes <= 0:
        return kept
    handles: list[int] = []
    try:
        candidates = []
        for source in sources:
            candidates += _candidates(source, handles, kept.omitted)
        if candidates:
            _copy_all(name, candidates, config, kept)
    finally:
        for fd in handles:
            os.close(fd)
    kept.omitted.sort(key=lambda o: o.path)
    kept.artifacts.sort(key=lambda entry: entry["path"])
    if kept.artifacts or kept.omitted or kept.error:
        log = logger.warning if kept.error else logger.info
        log("evaluation %s: %s", name, kept.summary())
    return kept


def _candidates(source: Source, handles: list[int], omitted: list[Omission]) -> list[_Candidate]:
    """The files of one source that may be kept, sorted; its handles added to ``handles``."""
    missing = [] if not source.listed else [Omission(source.shown, "not there")]  # /logs/agent never made: silent
    try:
        parent_fd, entry = source.open_parent()
    except FileNotFoundError:
        omitted += missing
        return []
    except OSError as exc:
        omitted.append(Omission(source.shown, f"cannot be reached: {_reason(exc)}"))
        return []
    handles.append(parent_fd)
    try:
        st = os.stat(entry, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        omitted += missing
        return []
    except OSError as exc:
        omitted.append(Omission(source.shown, f"cannot be opened: {_reason(exc)}"))
        return []
    if stat.S_ISDIR(st.st_mode):
        try:
            root_fd = os.open(entry, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            omitted.append(Omission(source.shown, f"cannot be opened: {_reason(exc)}"))
            return []
        handles.append(root_fd)
        if source.owner_uid is not None and source.listed and st.st_uid != source.owner_uid:
            omitted.append(Omission(source.shown, f"owned by uid {st.st_uid}, not the evaluation's"))
            return []
        return _Walk(root_fd, source, omitted).files()
    walk = _Walk(parent_fd, source, omitted)
    reason = walk.refusal(source.listed, st) if source.listed else "not a folder"
    if reason:
        omitted.append(Omission(source.shown, f"cannot be opened: {reason}" if not source.listed else reason))
        return []
    return [_Candidate(source.listed, parent_fd, (entry,), source)]


@dataclass(frozen=True)
class _Candidate:
    parts: tuple[str, ...]  # its listed path's names
    base_fd: int  # the folder ``rel`` starts from: its source's
    rel: tuple[str, ...]
    source: Source

    @property
    def path(self) -> str:
        return "/".join(self.parts)

    @property
    def placement(self) -> str | None:
        """Its path in a separate verifier: a folder source's place plus its own path, a file's place."""
        placed_at = self.source.placed_at
        if placed_at is None or self.parts == self.source.listed:
            return placed_at
        return "/".join((placed_at.rstrip("/"), *self.rel))


def excluded(parts: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    """Whether GNU tar's ``--exclude=PATTERN`` (its defaults: not anchored, wildcards, ``*`` matching
    ``/``) leaves out the member ``./`` + ``parts`` of ``tar -C SOURCE .``, as Harbor collects a folder
    artifact: a pattern matches the whole name or any tail of it that starts after a ``/``; a folder
    left out is left out with everything below it (the caller does not enter it)."""
    name = "./" + "/".join(parts)
    tails = [name] + [name[i + 1 :] for i, char in enumerate(name) if char == "/"]
    return any(fnmatch.fnmatchcase(tail, pattern) for pattern in patterns for tail in tails)


class _Walk:
    """The regular files below an open folder of one source that may be kept, and why each other entry may not."""

    def __init__(self, root_fd: int, source: Source, omitted: list[Omission]):
        self.root_fd = root_fd
        self.source = source
        self.owner_uid = source.owner_uid
        self.omitted = omitted
        self.device = os.fstat(root_fd).st_dev
        self.seen = 0
        self.found: list[_Candidate] = []

    def files(self) -> list[_Candidate]:
        self._scan(self.root_fd, ())
        if self.seen > MAX_ENTRIES:
            self.omitted.append(
                Omission(self.source.shown, f"holds over {MAX_ENTRIES} entries: the rest were not looked at")
            )
        return sorted(self.found, key=lambda c: c.path)

    def _omit(self, rel: tuple[str, ...], reason: str) -> None:
        listed = (*self.source.listed, *rel)
        self.omitted.append(Omission(_shown(listed) if listed else self.source.shown, reason))

    def _scan(self, dir_fd: int, rel: tuple[str, ...]) -> None:
        """One folder, then its sub-folders (recursion is bounded by MAX_PARTS)."""
        try:
            with os.scandir(dir_fd) as entries:
                listed = []
                for entry in entries:
                    self.seen += 1
                    if self.seen > MAX_ENTRIES:
                        break
                    listed.append(entry)
        except OSError as exc:
            self._omit(rel, f"folder cannot be listed: {_reason(exc)}")
            return
        for entry in listed:  # those counted, even once the bound is reached: the rest were never seen
            parts = (*rel, entry.name)
            if self.source.exclude and excluded(parts, self.source.exclude):
                continue  # the task left it out (a folder: all of it), as tar --exclude does: no omission
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished since the listing
            reason = self.refusal((*self.source.listed, *parts), st)
            if reason:
                self._omit(parts, reason)
            elif stat.S_ISDIR(st.st_mode):
                self._enter(dir_fd, parts)
            else:
                self.found.append(_Candidate((*self.source.listed, *parts), self.root_fd, parts, self.source))

    def refusal(self, parts: tuple[str, ...], st: os.stat_result) -> str:
        """Why the entry to be listed as ``parts`` may not be kept ("" when it may)."""
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            return "a symbolic link"
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return _kind(mode)
        try:
            _check_name(parts[-1])
        except UnsafeName as exc:
            return f"unsafe name: {exc}"
        if self.owner_uid is not None and st.st_uid != self.owner_uid:
            return f"owned by uid {st.st_uid}, not the evaluation's"
        if stat.S_ISDIR(mode):
            if st.st_dev != self.device:
                return "a folder on another file system"
            if len(parts) >= MAX_PARTS:
                return f"a folder more than {MAX_PARTS - 1} levels deep"
            return ""
        if st.st_nlink > 1:
            return f"a file with {st.st_nlink} hard links"
        if len("/".join(parts).encode()) > MAX_PATH_BYTES:
            return f"a path longer than {MAX_PATH_BYTES} bytes"
        return ""

    def _enter(self, dir_fd: int, parts: tuple[str, ...]) -> None:
        try:
            child = os.open(parts[-1], _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self._omit(parts, f"folder cannot be opened: {_reason(exc)}")
            return
        try:
            self._scan(child, parts)
        finally:
            os.close(child)


def _copy_all(name: str, candidates: list[_Candidate], config, kept: Kept) -> None:
    """Copy the candidates in their order into a new folder, then publish it by a rename."""
    store = store_root(config)
    budget = config.max_artifact_bytes
    staging = f"{KEEPING_PREFIX}{name}-{os.urandom(4).hex()}"
    try:
        store.mkdir(mode=0o700, parents=True, exist_ok=True)
        store_fd = open_root_dir(store)
    except OSError as exc:
        kept.error = f"the artifact store {store} cannot be used: {_reason(exc)}"
        return
    try:
        os.mkdir(staging, 0o700, dir_fd=store_fd)
        stage_fd = os.open(staging, _DIR_FLAGS, dir_fd=store_fd)
        try:
            used = 0
            claims = _Claims()
            for candidate in candidates:
                if len(kept.artifacts) >= MAX_FILES:
                    kept.omitted.append(Omission(_shown(candidate.parts), f"over {MAX_FILES} files"))
                    continue
                if not claims.take(candidate.parts):
                    kept.omitted.append(Omission(_shown(candidate.parts), "its listed path is another file's"))
                    continue
                entry = _copy_one(stage_fd, candidate, budget - used, kept)
                if entry is not None:
                    kept.artifacts.append(entry)
                    used += entry["size_bytes"]
        finally:
            os.close(stage_fd)
        if kept.artifacts:
            remove_entry_nofollow(store_fd, name)  # an earlier keep of the same evaluation
            os.rename(staging, name, src_dir_fd=store_fd, dst_dir_fd=store_fd)
        else:
            remove_entry_nofollow(store_fd, staging)
    except OSError as exc:
        kept.error = f"nothing kept: the artifact store {store} could not be written: {_reason(exc)}"
        kept.artifacts.clear()
        kept.placed.clear()
        try:
            remove_entry_nofollow(store_fd, staging)
        except OSError:
            pass  # left for the reaper (remove_orphan_artifacts)
    finally:
        os.close(store_fd)


class _Claims:
    """Listed paths taken so far: each file's, and the folders above each (no path is both)."""

    def __init__(self):
        self.files: set[tuple[str, ...]] = set()
        self.folders: set[tuple[str, ...]] = set()

    def take(self, parts: tuple[str, ...]) -> bool:
        above = [parts[:depth] for depth in range(1, len(parts))]
        if parts in self.files or parts in self.folders or any(folder in self.files for folder in above):
            return False
        self.files.add(parts)
        self.folders.update(above)
        return True


def _copy_one(stage_fd, candidate: _Candidate, room: int, kept: Kept) -> dict | None:
    """Copy one file if it still is what the walk saw and fits in ``room`` bytes; else note why not.

    Reading errors are the source's (noted); writing errors are the store's (raised).
    """
    parts, rel, omitted, owner_uid = candidate.parts, candidate.rel, kept.omitted, candidate.source.owner_uid
    try:
        parent_fd = open_subdir(candidate.base_fd, list(rel[:-1]), create=False)
    except SafeFSError:
        omitted.append(Omission(_shown(parts), "its folder changed after it was listed"))
        return None
    try:
        src = os.open(rel[-1], _READ_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        omitted.append(Omission(_shown(parts), f"cannot be opened: {_reason(exc)}"))
        return None
    finally:
        os.close(parent_fd)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or (owner_uid is not None and st.st_uid != owner_uid):
            omitted.append(Omission(_shown(parts), "it changed after it was listed"))
            return None
        if st.st_size > room:
            omitted.append(Omission(_shown(parts), f"{st.st_size} bytes: {_over_cap(room)}"))
            return None
        dest_dir = open_subdir(stage_fd, list(parts[:-1]), create=True)
        try:
            entry = _stream(src, dest_dir, candidate, room, omitted)
        finally:
            os.close(dest_dir)
        if entry is not None and candidate.placement is not None:
            # as Harbor's upload makes them: the image's root's, readable; an executable stays one
            kept.placed[entry["path"]] = Placement(candidate.placement, stat.S_IMODE(st.st_mode) & 0o755 | 0o644)
        return entry
    finally:
        os.close(src)


def _stream(src: int, dest_dir: int, candidate: _Candidate, room: int, omitted: list) -> dict | None:
    """Read ``src`` into a new file while hashing and counting; past ``room`` bytes it is dropped."""
    name = candidate.parts[-1]
    dest = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dest_dir)
    digest = hashlib.sha256()
    size = 0
    try:
        while True:
            try:
                chunk = os.read(src, min(_CHUNK, room - size + 1))
            except OSError as exc:
                omitted.append(Omission(_shown(candidate.parts), f"cannot be read: {_reason(exc)}"))
                break
            if not chunk:
                return {"path": candidate.path, "size_bytes": size, "sha256": digest.hexdigest()}
            size += len(chunk)
            if size > room:
                omitted.append(Omission(_shown(candidate.parts), f"grew while copied: {_over_cap(room)}"))
                break
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(dest, view) :]
    finally:
        os.close(dest)
    os.unlink(name, dir_fd=dest_dir)
    return None


def _over_cap(room: int) -> str:
    return f"over MAX_ARTIFACT_BYTES, {room} bytes were left"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


# -- serving and removing -----------------------------------------------------------------------


class NotListed(LookupError):
    """A safe path the evaluation does not list: never served, whatever the store holds."""


def open_listed(eval_id, listed: list | None, path: str, config) -> tuple[BinaryIO, dict]:
    """The kept file ``path`` of an evaluation whose ``artifacts`` are ``listed``, open for reading,
    and its entry there (``{path, size_bytes, sha256}``). ``UnsafeName`` for an unsafe path,
    ``NotListed`` for one the evaluation does not list, ``FileNotFoundError`` for one the store
    no longer holds. What the API and the admin serve, after each checked who may see it."""
    check_path(path)
    entry = next((a for a in listed or [] if isinstance(a, dict) and a.get("path") == path), None)
    if entry is None:
        raise NotListed(f"evaluation {eval_id} has no artifact {path}")
    return open_artifact(eval_id, path, config), entry


def open_artifact(eval_id, path: str, config) -> BinaryIO:
    """One kept file, open for reading. ``UnsafeName`` for a path ``keep`` never lists;
    ``FileNotFoundError`` when the store does not hold it. The caller checks first that the
    evaluation lists ``path`` (the store is the service's own, but the list is the contract)."""
    parts = check_path(path)
    missing = FileNotFoundError(errno.ENOENT, f"artifact {path} of evaluation {eval_id} is not stored")
    try:
        folder_fd = open_root_dir(store_root(config) / _eval_folder_name(eval_id))
    except SafeFSError:
        raise missing from None
    try:
        parent_fd = open_subdir(folder_fd, parts[:-1], create=False)
    except SafeFSError:
        raise missing from None
    finally:
        os.close(folder_fd)
    try:
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent_fd)
    except OSError:
        raise missing from None
    finally:
        os.close(parent_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise missing
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def remove(eval_ids, config) -> int:
    """Remove the kept files of these evaluations (their rows are going); how many folders went."""
    store = store_root(config)
    try:
        store_fd = open_root_dir(store)
    except SafeFSError:
        return 0  # no store yet
    removed = 0
    try:
        for eval_id in eval_ids:
            name = _eval_folder_name(eval_id)
            try:
                os.stat(name, dir_fd=store_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            remove_entry_nofollow(store_fd, name)
            removed += 1
    finally:
        os.close(store_fd)
    return removed


@dataclass(frozen=True)
class StoredFolder:
    name: str
    eval_id: uuid.UUID
    complete: bool  # False: a copy ``keep`` was making (its process may have died)


def stored_folders(config) -> list[StoredFolder]:
    """The store's folders named for an evaluation (anything else in it is left alone)."""
    try:
        names = os.listdir(store_root(config))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        complete = not name.startswith(KEEPING_PREFIX)
        id_text = name if complete else name[len(KEEPING_PREFIX) :].rpartition("-")[0]
        try:
            eval_id = uuid.UUID(id_text)
        except ValueError:
            continue
        if complete and name != str(eval_id):
            continue
        found.append(StoredFolder(name, eval_id, complete))
    return found


def remove_folder(config, name: str) -> None:
    """Remove one folder ``stored_folders`` listed, never following a link."""
    store_fd = open_root_dir(store_root(config))
    try:
        remove_entry_nofollow(store_fd, name)
    finally:
        os.close(store_fd)
