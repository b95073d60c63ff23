"""The cache's folder: install snapshots (entries) and repository mirrors, with their locks.

CACHE_DIR/ (root's, 0700: no sandbox uid reaches anything here by path)
  entries/<key>/            one install snapshot, published by a rename once complete
      repo/ venv/ home/     as the install step left them, every file root's
      meta.json             key material, repository, commit, size, files, when built
      manifest.json         every folder's ctime (checked at restore), the files holding the session path
      hits                  one byte appended per hit: its size is the count, its mtime the last use
      in-use                flock'ed shared by every evaluation running from the entry
  entries/.build-<key>.<eval_id>/   an entry being built; the reaper removes one whose evaluation ended
  entries/.trash-<key>.<n>/         an entry replaced or evicted while in use, removed once free
  locks/<key>.lock          flock'ed by the one evaluation building <key>
  mirrors/<id>/ (+ .lock)   a bare mirror per repository URL (pipeline/mirror.py)
  mirrors/<id>.size, .files its bytes and files after its last fetch

Eviction counts bytes and files (inodes) alike: 200,000 empty files are a
few MB of blocks but 200,000 inodes of the host's disk, so an entry is
measured by both and the cache kept under both CACHE_MAX_BYTES and
CACHE_MAX_FILES.

Why a folder tree and not rows: the entries are files on this host, and
whatever reads them (metrics, ``manage.py cache``, eviction) must agree with
what is on disk even after a crash; a rename is the only commit point.

Corruption: the manifest holds the ctime of every folder of the entry. A
file added, removed or renamed anywhere changes its folder's ctime (which no
one can set back), so ``verify`` catches it with one ``lstat`` per folder
(~700 for a 7000-file venv, a few ms) instead of one per file.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from evaluations.safefs import TreeUsage, remove_tree_nofollow, tree_usage

log = logging.getLogger("term_executor.cache")

# Bumped whenever what an entry holds or how it is laid out changes: older entries become misses.
# 2: the repository keeps the tags of the base and its ancestors (SPEC §19); format-1 entries have none.
CACHE_FORMAT = 2
FOLDERS = ("repo", "venv", "home")
BUILD_PREFIX = ".build-"
TRASH_PREFIX = ".trash-"
# Files larger than this are not searched for the session path (wheels, caches, binaries).
_SCAN_MAX_BYTES = 4 * 1024 * 1024


class CacheUnavailable(OSError):
    """The cache folder cannot be used now (unwritable, full); the evaluation runs cold."""


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    meta: dict

    @property
    def created_at(self) -> float:
        return float(self.meta.get("created_at", 0))

    @property
    def size_bytes(self) -> int:
        return int(self.meta.get("size_bytes", 0))

    @property
    def files(self) -> int | None:
        """Its files and folders as built; None for an entry built before they were counted."""
        files = self.meta.get("files")
        return None if files is None else int(files)

    @property
    def usage(self) -> TreeUsage:
        return TreeUsage(self.size_bytes, self.files or 0)

    def folder(self, name: str) -> Path:
        return self.path / name

    def hits(self) -> tuple[int, float]:
        """(hits so far, when last used)."""
        try:
            st = os.stat(self.path / "hits")
        except OSError:
            return 0, self.created_at
        return st.st_size, st.st_mtime


def cache_key(material: dict) -> str:
    """The key of an entry: a digest of everything the install step's result depends on."""
    text = json.dumps({"format": CACHE_FORMAT, **material}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.entries = self.root / "entries"
        self.locks = self.root / "locks"
        self.mirrors = self.root / "mirrors"

    # -- setting up ------------------------------------------------------------------------

    def ensure(self) -> None:
        """Make the folders (root's, 0700); CacheUnavailable if they cannot be made or written."""
        try:
            for folder in (self.root, self.entries, self.locks, self.mirrors):
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                st = os.lstat(folder)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                    raise CacheUnavailable(errno.EPERM, f"{folder} is not a folder of uid {os.geteuid()}")
                if st.st_mode & 0o077:
                    os.chmod(folder, 0o700)
            if not os.access(self.entries, os.W_OK):
                raise CacheUnavailable(errno.EACCES, f"{self.entries} is not writable")
        except CacheUnavailable:
            raise
        except OSError as exc:
            raise CacheUnavailable(exc.errno or errno.EIO, f"cache folder {self.root}: {exc.strerror or exc}") from None

    # -- locks -----------------------------------------------------------------------------

    @contextmanager
    def lock_file(self, path: Path, mode: int) -> Iterator[int]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, mode)
            yield fd
        finally:
            os.close(fd)

    def try_build_lock(self, key: str) -> int | None:
        """The key's build lock if free now (an fd to close to release it), else None."""
        fd = os.open(self.locks / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def hold_in_use(self, entry: Entry) -> int:
        """A shared lock on the entry while an evaluation runs from it: eviction skips it."""
        fd = os.open(entry.path / "in-use", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    # -- reading ---------------------------------------------------------------------------

    def entry(self, key: str) -> Entry | None:
        path = self.entries / key
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        if meta.get("key") != key or meta.get("format") != CACHE_FORMAT:
            return None
        return Entry(key, path, meta)

    def verify(self, entry: Entry) -> str | None:
        """None if the entry is whole; else what is wrong with it."""
        try:
            manifest = json.loads((entry.path / "manifest.json").read_text())
            for relpath, ctime_ns in manifest["dirs"]:
                st = os.lstat(entry.path / relpath)
                if not stat.S_ISDIR(st.st_mode):
                    return f"{relpath} is no longer a folder"
                if st.st_ctime_ns != ctime_ns:
                    return f"{relpath} changed after the entry was built"
        except FileNotFoundError as exc:
            return f"{Path(exc.filename).relative_to(entry.path) if exc.filename else 'a file'} is missing"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"unreadable manifest: {exc}"
        return None

    def manifest(self, entry: Entry) -> dict:
        return json.loads((entry.path / "manifest.json").read_text())

    def all_entries(self) -> list[Entry]:
        found = []
        try:
            names = sorted(os.listdir(self.entries))
        except OSError:
            return []
        for name in names:
            if not name.startswith("."):
                entry = self.entry(name)
                if entry is not None:
                    found.append(entry)
        return found

    def record_hit(self, entry: Entry) -> None:
        try:
            fd = os.open(
                entry.path / "hits", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
            )
            try:
                os.write(fd, b".")
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("could not count a hit of cache entry %s: %s", entry.key, exc)

    def size_bytes(self) -> int:
        """Bytes the cache holds (see ``usage``)."""
        return self.usage().bytes

    def usage(self) -> TreeUsage:
        """Bytes and files the cache holds: entries as measured when built, mirrors as after their
        last fetch."""
        total = TreeUsage()
        for entry in self.all_entries():
            total += entry.usage
        for name in self.mirror_names():
            total += TreeUsage(_read_count(self.mirrors / f"{name}.size"), _read_count(self.mirrors / f"{name}.files"))
        return total

    def write_mirror_usage(self, name: str, usage: TreeUsage) -> None:
        """Record a mirror's bytes and files after a fetch (``usage`` counts them)."""
        (self.mirrors / f"{name}.size").write_text(str(usage.bytes))
        (self.mirrors / f"{name}.files").write_text(str(usage.files))

    # -- building --------------------------------------------------------------------------

    def begin_build(self, key: str, eval_id: str) -> Path:
        build = self.entries / f"{BUILD_PREFIX}{key}.{eval_id}"
        if build.exists() or build.is_symlink():
            remove_tree_nofollow(build)
        try:
            build.mkdir(mode=0o700)
        except OSError as exc:
            raise CacheUnavailable(exc.errno or errno.EIO, f"cannot start a cache entry: {exc.strerror}") from None
        return build

    def seal(self, build: Path, *, key: str, meta: dict, session_root: str) -> None:
        """Make the moved-in folders root's, find the files holding ``session_root``, write the manifest."""
        dirs: list[tuple[str, int]] = []
        rewrite: list[str] = []
        links: list[str] = []
        needle = os.fsencode(session_root)
        for name in FOLDERS:
            top = build / name
            for folder, subdirs, files in os.walk(top):
                os.chown(folder, 0, 0, follow_symlinks=False)
                dirs.append((os.path.relpath(folder, build), os.lstat(folder).st_ctime_ns))
                for child in (*subdirs, *files):
                    path = os.path.join(folder, child)
                    st = os.lstat(path)
                    if stat.S_ISLNK(st.st_mode):
                        os.chown(path, 0, 0, follow_symlinks=False)
                        if needle in os.fsencode(os.readlink(path)):
                            links.append(os.path.relpath(path, build))
                    elif not stat.S_ISDIR(st.st_mode):
                        os.chown(path, 0, 0, follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode) and _holds(path, st, needle):
                            rewrite.append(os.path.relpath(path, build))
        _write_json(build / "manifest.json", {"dirs": dirs, "rewrite": rewrite, "links": links})
        (build / "in-use").touch(mode=0o600)
        usage = tree_usage(build)
        _write_json(
            build / "meta.json",
            {**meta, "key": key, "format": CACHE_FORMAT, "session_root": session_root, "size_bytes": usage.bytes,
             "files": usage.files, "created_at": time.time()},
        )  # fmt: skip
        os.chmod(build, 0o755)

    def publish(self, build: Path, key: str) -> Entry:
        """Put a sealed build in place of whatever entry ``key`` had (moved aside if in use)."""
        target = self.entries / key
        if target.exists() or target.is_symlink():
            self._discard(target, key)
        os.rename(build, target)
        entry = self.entry(key)
        if entry is None:
            raise CacheUnavailable(errno.EIO, f"cache entry {key} unreadable right after it was written")
        return entry

    def abandon(self, build: Path) -> None:
        try:
            remove_tree_nofollow(build)
        except OSError as exc:
            log.warning("could not remove the unfinished cache entry %s (the reaper will): %s", build, exc)

    # -- removing --------------------------------------------------------------------------

    def remove(self, key: str) -> bool:
        """Remove the entry now, or move it aside until the evaluations using it end; False if absent."""
        target = self.entries / key
        if not (target.exists() or target.is_symlink()):
            return False
        self._discard(target, key)
        return True

    def _discard(self, target: Path, key: str) -> None:
        trash = self.entries / f"{TRASH_PREFIX}{key}.{uuid.uuid4().hex[:8]}"
        os.rename(target, trash)
        self._remove_if_free(trash)

    def _remove_if_free(self, folder: Path) -> bool:
        try:
            fd = os.open(folder / "in-use", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            fd = None  # no lock file: nothing can be using it
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # an evaluation's overlay still reads it: the next pass removes it
            remove_tree_nofollow(folder)
            return True
        finally:
            if fd is not None:
                os.close(fd)

    def evict(self, *, max_bytes: int, max_files: int, max_age_secs: int, keep: str | None = None) -> list[str]:
        """Entries past ``max_age_secs`` (or built before files were counted), then the least
        recently used until the cache fits both ``max_bytes`` and ``max_files``."""
        removed = []
        now = time.time()
        self._empty_trash()
        self._old_mirrors(max_age_secs)
        entries = []
        for entry in self.all_entries():
            unmeasured = entry.files is None  # its files would count as none: it goes, once
            if entry.key != keep and (now - entry.created_at > max_age_secs or unmeasured):
                self.remove(entry.key)
                removed.append(entry.key)
            else:
                entries.append(entry)
        total = self.usage()
        for entry in sorted(entries, key=lambda e: e.hits()[1]):
            if total.bytes <= max_bytes and total.files <= max_files:
                break
            if entry.key == keep:
                continue
            self.remove(entry.key)
            removed.append(entry.key)
            total -= entry.usage
        return removed

    def mirror_names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.mirrors) if not n.endswith((".lock", ".size", ".files")))
        except OSError:
            return []

    def remove_mirror(self, name: str) -> bool:
        """Remove a mirror no evaluation is using now (its lock taken without waiting)."""
        fd = os.open(self.mirrors / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            remove_tree_nofollow(self.mirrors / name)
            (self.mirrors / f"{name}.size").unlink(missing_ok=True)
            (self.mirrors / f"{name}.files").unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)

    def clear_mirrors(self) -> int:
        return sum(1 for name in self.mirror_names() if self.remove_mirror(name))

    def _old_mirrors(self, max_age_secs: int) -> None:
        now = time.time()
        for name in self.mirror_names():
            try:
                last_used = os.stat(self.mirrors / f"{name}.lock").st_mtime
            except OSError:
                last_used = 0
            if now - last_used > max_age_secs:
                self.remove_mirror(name)

    def _empty_trash(self) -> None:
        try:
            names = os.listdir(self.entries)
        except OSError:
            return
        for name in names:
            if name.startswith(TRASH_PREFIX):
                try:
                    self._remove_if_free(self.entries / name)
                except OSError as exc:
                    log.warning("could not remove %s yet: %s", name, exc)

    def builds(self) -> list[tuple[Path, str]]:
        """(folder, eval_id) of every unfinished build."""
        found = []
        try:
            names = os.listdir(self.entries)
        except OSError:
            return []
        for name in names:
            if name.startswith(BUILD_PREFIX):
                found.append((self.entries / name, name.rpartition(".")[2]))
        return found


def _holds(path: str, st: os.stat_result, needle: bytes) -> bool:
    # A .pyc records its source's path, but the import system replaces it with the real one
    # (importlib's _fix_up_module): left alone, so a restore touches a few files, not thousands.
    if st.st_size > _SCAN_MAX_BYTES or st.st_size < len(needle) or path.endswith(".pyc"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as handle:
        return needle in handle.read()


def _read_count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _write_json(path: Path, value) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as handle:
        json.dump(value, handle, separators=(",", ":"))
        handle.flush()
        os.fsync(handle.fileno())


def move_in(source: Path, target: Path) -> None:
    """Move a session folder into a build (or back): a rename, or a copy when the cache is on another disk."""
    try:
        os.rename(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copytree(source, target, symlinks=True)
        remove_tree_nofollow(source)
