"""Warm evaluations (SPEC §13): the pipeline's side of the workspace cache, one ``WorkspaceCache``.

The context holds one per evaluation (``Context.cache``, made with it); the
steps call its methods:

1. ``clone`` (cloning_repo): decide whether the cache is used, find the base
   commit's full id (in the mirror when the task names a branch, tag or short
   id), and with it the entry's key. A whole entry: the repository is
   mounted from it (``hit``). Otherwise take the key's build lock (or wait
   for the evaluation holding it: one build per key at a time), fetch the
   base from the mirror into a fresh repository, and run the install step as
   usual (``miss``).
2. ``restore`` (installing_deps): on a hit the venv and HOME are mounted
   from the entry and the install commands do not run.
3. ``keep`` (end of installing_deps): the builder moves repo/, venv/ and
   home/ into a build folder, seals it (root's files, a manifest) and
   renames it into place; then it runs from the entry exactly as a hit
   does. Anything going wrong there leaves the evaluation cold, never
   failed.
4. ``reset`` (running_tests): venv and HOME as the install step left them:
   a fresh overlay over the entry, whatever the agent did.
5. ``release`` (cleanup): unmount, drop the locks, remove an unfinished build.

Until ``clone`` has run (a step before it failed) every method does what the
pipeline does without a cache. The overlays themselves are cache/overlay.py's.

Who writes the mirror: never root on untrusted data. The mirror is root's
on disk, bound into the session idmapped to the evaluation's uid, and git
runs through the spawner as that uid in the sandbox: read-only to fetch the
base from, writable (under the mirror's exclusive lock) to fetch into.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from evaluations.cache import mounts, overlay
from evaluations.cache.store import FOLDERS, CacheUnavailable, Entry, Store, cache_key, move_in
from evaluations.models import CacheUse
from evaluations.pipeline import gitrepo, mirror
from evaluations.pipeline.session import Session
from evaluations.runtime import SandboxPolicy
from evaluations.safefs import copy_tree_nofollow, remove_tree_nofollow, tree_usage
from evaluations.tasks.spec import TaskSpec
from executor_project.config import Config

log = logging.getLogger("term_executor.cache")

MIRROR_POINT = ".mirror"  # where the mirror is bound in the session while git uses it
WAIT_POLL_SECS = 0.2


class MirrorFailed(OSError):
    """The mirror could not give the base commit (a full disk, a fetch that failed): clone without it."""


class GitAccess(Protocol):
    """How the cache runs git for the evaluation (pipeline/context.Context is one): its spawner, its policies."""

    def command_runner(self, policy: SandboxPolicy) -> gitrepo.CommandRunner: ...
    def executor_policy(self, *, network: bool) -> SandboxPolicy: ...
    def repository_env(self) -> dict[str, str]: ...
    def check_cancelled(self) -> None: ...


class WorkspaceCache:
    """One evaluation's use of the workspace cache: what it decided, the entry, the locks and mounts it holds."""

    def __init__(self, eval_id: str, config: Config, session: Session, stage: Callable[..., None]):
        self.eval_id = eval_id
        self.config = config
        self.session = session
        self.stage = stage  # the evaluation's ``cache`` column, written with the next transition (Context.stage)
        self.use: str | None = None  # CacheUse, once clone has decided
        self.store: Store | None = None  # None: nothing built, nothing served
        self.key = ""
        self.sha = ""
        self.repo = ""
        self.material: dict = {}
        self.entry: Entry | None = None  # the entry the session's folders are mounted from
        self.build_lock: int | None = None  # held by the evaluation building the key
        self.in_use: int | None = None
        self.mounted: dict[str, str] = {}  # each folder mounted from the entry: the name of its layers
        self.ready: dict[str, tuple[int, str]] = {}  # the tests' HOME and venv, made ahead (``prepare_reset``)
        self.manifest: dict | None = None  # the entry's, read once

    # -- cloning_repo -------------------------------------------------------------------------

    def clone(
        self, git: GitAccess, task: TaskSpec, material: Callable[[], dict | None], resolve_pin: str | None
    ) -> str | None:
        """Place the repository from the cache and return the base's sha; None: clone as without a cache.

        ``material()``: what the install step's result depends on besides the commit (SPEC §13),
        asked only when the cache would be used; None (a bad placeholder, an image task that
        installs into its writable layer) turns the cache off.
        """
        self._decide(task, material)
        self.stage(cache=self.use)
        if self.store is None:  # off, or the cache folder unusable (a warning said why)
            return None
        try:
            return self._clone(git, task, resolve_pin)
        except OSError as exc:  # MountError and MirrorFailed included
            log.warning("workspace cache unusable, cloning without it: %s", exc)
            self._go_cold()
            _empty(self.session.repo)
            return None

    def _decide(self, task: TaskSpec, material: Callable[[], dict | None]) -> None:
        self.use, self.store, self.material = self._choose(task, material)
        self.repo = task.repo

    def _choose(self, task: TaskSpec, material: Callable[[], dict | None]) -> tuple[str, Store | None, dict]:
        if self.config.workspace_cache == "off" or not task.cache or task.repo is None:
            return CacheUse.OFF, None, {}
        if os.geteuid() != 0 or self.session.uid is None:
            log.info("the workspace cache needs root (idmapped mounts, a uid per evaluation); not used")
            return CacheUse.OFF, None, {}
        found = material()
        if found is None:
            return CacheUse.OFF, None, {}  # a bad placeholder (installing_deps reports it), or nothing to keep
        store = Store(self.config.cache_root)
        try:
            store.ensure()
        except CacheUnavailable as exc:
            log.warning("workspace cache unusable, running cold: %s", exc)
            return CacheUse.MISS, None, {}
        return CacheUse.MISS, store, found

    def _go_cold(self) -> None:
        """From here on the evaluation runs as without a cache: nothing built, nothing served."""
        self._unlock()
        self._unmount_all()
        if self.in_use is not None:
            os.close(self.in_use)
            self.in_use = None
        self.entry = None
        self.store = None
        if self.use == CacheUse.HIT:
            self.use = CacheUse.MISS
            self.stage(cache=CacheUse.MISS)

    def _clone(self, git: GitAccess, task: TaskSpec, resolve_pin: str | None) -> str:
        timeout = self.config.clone_timeout_secs
        if gitrepo.is_full_sha(task.base_commit):
            self.sha = task.base_commit
        else:
            self.sha = self._with_mirror(git, task, resolve_pin, lambda m, run, env: mirror.resolve_in_mirror(
                run, mirror=m, base_commit=task.base_commit, env=env, timeout_secs=timeout))  # fmt: skip
        self.key = cache_key({**self.material, "commit": self.sha})
        entry = self._usable_entry(self.key)
        if entry is None:
            self.build_lock = self._take_build_lock(git, self.key)
            entry = self._usable_entry(self.key)  # built by whoever held the lock meanwhile
            if entry is not None:
                self._unlock()
        if entry is not None:
            self._start_from(entry)
            self._mount(entry, "repo")
            return self.sha
        return self._with_mirror(git, task, resolve_pin, lambda m, run, env: mirror.clone_from_mirror(
            run, mirror=m, base_commit=self.sha, dest=self.session.repo, env=env, timeout_secs=timeout))  # fmt: skip

    def _usable_entry(self, key: str) -> Entry | None:
        entry = self.store.entry(key)
        if entry is None:
            return None
        problem = self.store.verify(entry)
        if problem is None and time.time() - entry.created_at > self.config.cache_max_age_secs:
            problem = "older than CACHE_MAX_AGE_SECS"
        if problem is None and len(entry.meta.get("session_root", "")) != len(str(self.session.root)):
            problem = "built for session paths of another length"
        if problem is None:
            return entry
        log.warning("cache entry %s not used (%s): rebuilding it", key, problem)
        return None

    def _take_build_lock(self, git: GitAccess, key: str) -> int | None:
        """The key's build lock; while another evaluation builds it, wait (or give up and run cold)."""
        deadline = time.monotonic() + self.config.clone_timeout_secs + self.config.install_timeout_secs
        while True:
            fd = self.store.try_build_lock(key)
            if fd is not None or self.store.entry(key) is not None:
                return fd
            if time.monotonic() > deadline:
                log.warning("cache entry %s: still being built by another evaluation; running cold", key)
                return None
            git.check_cancelled()
            time.sleep(WAIT_POLL_SECS)

    def _start_from(self, entry: Entry) -> None:
        self.entry = entry
        self.use = CacheUse.HIT
        self.in_use = self.store.hold_in_use(entry)
        self.store.record_hit(entry)
        self.stage(cache=CacheUse.HIT)

    # -- the mirror --------------------------------------------------------------------------

    def _with_mirror(self, git: GitAccess, task: TaskSpec, resolve_pin: str | None, use):
        """``use(mirror_path, runner, env)`` on the task's mirror, fetching into it first when needed."""
        store, session, uid = self.store, self.session, self.session.uid
        name = hashlib.sha256(task.repo.encode()).hexdigest()[:32]
        path = store.mirrors / name
        lock = store.mirrors / f"{name}.lock"
        point = session.root / MIRROR_POINT
        read_env = gitrepo.git_env(session.home, "file")
        if mirror.names_a_commit_forever(task.base_commit) and (path / "HEAD").exists():
            try:
                with store.lock_file(lock, fcntl.LOCK_SH), overlay.idmapped_bind(path, point, uid, writable=False):
                    os.utime(lock)  # last used, for eviction
                    return use(point, git.command_runner(git.executor_policy(network=False)), read_env)
            except mirror.NotInMirror:
                pass
        fetch_env = git.repository_env()
        try:
            with store.lock_file(lock, fcntl.LOCK_EX):
                path.mkdir(mode=0o755, exist_ok=True)
                with overlay.idmapped_bind(path, point, uid, writable=True):
                    mirror.update_mirror(
                        git.command_runner(git.executor_policy(network=True)),
                        mirror=point,
                        repo_url=task.repo,
                        env=fetch_env,
                        timeout_secs=self.config.clone_timeout_secs,
                        resolve_pin=resolve_pin,
                    )
                _write_size(store, name, path)
            with store.lock_file(lock, fcntl.LOCK_SH), overlay.idmapped_bind(path, point, uid, writable=False):
                return use(point, git.command_runner(git.executor_policy(network=False)), read_env)
        except gitrepo.GitError as exc:  # NotInMirror included: clone_at says why, in its own words
            git.check_cancelled()
            raise MirrorFailed(errno.EIO, f"the mirror of {gitrepo.display_url(task.repo)}: {exc}") from None

    # -- installing_deps ------------------------------------------------------------------------

    def restore(self) -> bool:
        """On a hit: the venv and HOME from the entry; True when the install commands need not run."""
        if self.use != CacheUse.HIT:
            return False
        session = self.session
        try:
            for name in ("venv", "home"):
                self._mount(self.entry, name)
        except OSError as exc:  # the repository is mounted already: the entry's venv and HOME as copies
            log.warning("could not mount the cache entry's venv and HOME, copying them: %s", exc)
            for name in ("venv", "home"):
                if name in self.mounted:
                    self._unmount(name)
                remove_tree_nofollow(session.root / name)
                copy_tree_nofollow(self.entry.folder(name), session.root / name, session.uid)
                self._rewrite_session_paths(self.entry, name)
            session.keep_install_home()
        return True

    def keep(self) -> None:
        """After a successful install: store it when this evaluation builds the key; then keep HOME and venv."""
        if self.build_lock is None or self.store is None:
            self.session.keep_install_home()
            return
        store, session = self.store, self.session
        build = None
        moved: list[str] = []
        try:
            build = store.begin_build(self.key, self.eval_id)
            for name in FOLDERS:
                move_in(session.root / name, build / name)
                moved.append(name)
            meta = {"repo": self.repo, "commit": self.sha, "material": self.material, "eval_id": self.eval_id}
            store.seal(build, key=self.key, meta=meta, session_root=str(session.root))
            entry = store.publish(build, self.key)
            build = None
        except OSError as exc:
            log.warning("could not store the install step in the workspace cache (running cold): %s", exc)
            self._give_back(build, moved)
            self._unlock()
            session.keep_install_home()
            return
        self._unlock()
        self.entry = entry
        self.in_use = store.hold_in_use(entry)
        try:
            for name in FOLDERS:
                (session.root / name).mkdir(mode=0o700)
                self._mount(entry, name)
        except (OSError, mounts.MountError) as exc:
            log.warning("could not run from the new cache entry, copying it back: %s", exc)
            self._unmount_all()
            for name in FOLDERS:
                remove_tree_nofollow(session.root / name)
                copy_tree_nofollow(entry.folder(name), session.root / name, session.uid)
            session.keep_install_home()
        try:
            config = self.config
            store.evict(
                max_bytes=config.cache_max_bytes,
                max_files=config.cache_max_files,
                max_age_secs=config.cache_max_age_secs,
                keep=self.key,
            )
        except OSError as exc:
            log.warning("workspace cache eviction failed: %s", exc)

    def _give_back(self, build: Path | None, moved: list[str]) -> None:
        """Undo a failed store: the session's folders back in place, the evaluation's again."""
        session = self.session
        for name in moved:
            move_in(build / name, session.root / name)
            _chown_tree(session.root / name, session.uid)
        if build is not None:
            self.store.abandon(build)

    # -- running_tests -------------------------------------------------------------------------

    def prepare_reset(self) -> None:
        """While the agent runs: the overlays ``reset`` puts in place of HOME and the venv, made now
        with layers of their own and attached nowhere (cache/overlay.py ``detached_folder``): the
        agent's sandbox has no way to them, and ``reset`` then only swaps them in. None where they
        cannot be made (``reset`` makes them then, as without this)."""
        if "home" not in self.mounted or self.ready:
            return
        try:
            for name in ("venv", "home"):
                if name in self.mounted:
                    layers = f"{name}-tests"
                    ready = self._detached(self.entry, name, layers)
                    if ready is not None:
                        self.ready[name] = (ready, layers)
        except OSError as exc:
            log.info("the tests' HOME and venv are made after the agent's end: %s", exc)
            self._drop_ready()

    def reset(self) -> None:
        """HOME and the venv as the install step left them, for the tests."""
        if "home" not in self.mounted:
            self.session.restore_install_home()
            return
        for name in ("venv", "home"):
            if name in self.mounted:
                self._unmount(name)
                ready = self.ready.pop(name, None)
                if ready is None:
                    self._mount(self.entry, name)
                else:
                    self._attach(name, *ready)

    # -- cleanup -------------------------------------------------------------------------------

    def release(self) -> None:
        """Unmount the session's overlays and drop every lock: nothing of the evaluation holds the cache."""
        if self.use is None:  # clone never ran: nothing was taken
            return
        try:
            self._drop_ready()
            self._unmount_all()
        finally:
            self._unlock()
            if self.in_use is not None:
                os.close(self.in_use)
                self.in_use = None
            if self.store is not None:
                for build, eval_id in self.store.builds():
                    if eval_id == self.eval_id:
                        self.store.abandon(build)

    # -- mounts ------------------------------------------------------------------------------

    def _mount(self, entry: Entry, name: str) -> None:
        """``<session>/<name>`` from the entry (cache/overlay.py), its session paths made this session's."""
        ready = self._detached(entry, name, name)
        if ready is not None:
            self._attach(name, ready, name)

    def _detached(self, entry: Entry, name: str, layers: str) -> int | None:
        manifest, old = self._session_paths(entry)
        root, uid = self.session.root, self.session.uid
        return overlay.detached_folder(entry, name, root, uid, layers=layers, manifest=manifest, old=old)

    def _attach(self, name: str, ready: int, layers: str) -> None:
        mounts.attach_closing(ready, self.session.root / name)
        self.mounted[name] = layers

    def _unmount(self, name: str) -> None:
        overlay.unmount_folder(self.session.root, name, self.mounted.pop(name))

    def _unmount_all(self) -> None:
        overlay.unmount_session(self.session.root)
        self.mounted.clear()

    def _drop_ready(self) -> None:
        """The overlays made ahead and never attached: gone with their descriptors (their layers stay
        in the session folder, which takes them)."""
        for ready, _ in self.ready.values():
            os.close(ready)
        self.ready.clear()

    def _session_paths(self, entry: Entry) -> tuple[dict | None, str]:
        """The entry's manifest and the building session's path, which becomes this session's in the
        few files that recorded it; no manifest where the paths are already this session's."""
        old = entry.meta.get("session_root", "")
        if old == str(self.session.root):
            return None, old
        if self.manifest is None:
            self.manifest = self.store.manifest(entry)
        return self.manifest, old

    def _rewrite_session_paths(self, entry: Entry, name: str) -> None:
        """In a copy of the entry's ``name`` (no mount): its session paths made this session's."""
        manifest, old = self._session_paths(entry)
        if manifest is not None:
            root = self.session.root
            overlay.rewrite_session_paths(
                root / name, self.session.uid, name, old=old, new=str(root), manifest=manifest
            )

    def _unlock(self) -> None:
        if self.build_lock is not None:
            os.close(self.build_lock)
            self.build_lock = None


def _write_size(store: Store, name: str, path: Path) -> None:
    try:
        store.write_mirror_usage(name, tree_usage(path))
    except OSError:
        pass


def _chown_tree(top: Path, uid: int) -> None:
    for folder, subdirs, files in os.walk(top):
        os.chown(folder, uid, uid, follow_symlinks=False)
        for child in (*subdirs, *files):
            os.chown(os.path.join(folder, child), uid, uid, follow_symlinks=False)


def _empty(folder: Path) -> None:
    if folder.is_dir() and not folder.is_symlink():
        for child in list(folder.iterdir()):
            remove_tree_nofollow(child)
