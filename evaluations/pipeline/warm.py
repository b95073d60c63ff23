"""Warm evaluations (SPEC §13): the pipeline's side of the workspace cache.

1. ``clone`` (cloning_repo): decide whether the cache is used, find the base
   commit's full id (in the mirror when the task names a branch, tag or short
   id), and with it the entry's key. A whole entry: the repository is
   mounted from it (``hit``). Otherwise take the key's build lock (or wait
   for the evaluation holding it: one build per key at a time), fetch the
   base from the mirror into a fresh repository, and run the install step as
   usual (``miss``).
2. ``restored`` (installing_deps): on a hit the venv and HOME are mounted
   from the entry and the install commands do not run.
3. ``keep`` (end of installing_deps): the builder moves repo/, venv/ and
   home/ into a build folder, seals it (root's files, a manifest) and
   renames it into place; then it runs from the entry exactly as a hit
   does. Anything going wrong there leaves the evaluation cold, never
   failed.
4. ``restore_install_state`` (running_tests): venv and HOME as the install
   step left them: a fresh overlay over the entry, whatever the agent did.
5. ``release`` (cleanup): unmount, drop the locks, remove an unfinished build.

Each session folder from an entry is an overlay: the entry, idmapped so
its root-owned files are the evaluation's uid's, under an upper folder in
the session (so the disk quota counts what the evaluation writes, not the
entry). Files recording the session path (venv launchers, ``.pth`` files of
editable installs) are rewritten in the overlay: session paths all have one
length (WORKSPACE_BASE/<uuid>), part of the key.

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
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from evaluations.cache import mounts
from evaluations.cache.store import FOLDERS, CacheUnavailable, Entry, Store, cache_key, move_in
from evaluations.models import CacheUse, Evaluation
from evaluations.pipeline import gitrepo, mirror, static
from evaluations.pipeline.context import Context, StepFailed
from evaluations.safefs import (
    copy_tree_nofollow,
    open_parent,
    remove_tree_nofollow,
    tree_usage,
)

log = logging.getLogger("term_executor.cache")

MIRROR_POINT = ".mirror"  # where the mirror is bound in the session while git uses it
LAYERS = ".layers"  # <session>/.layers/<folder>/{lower,upper,work}, root's
WAIT_POLL_SECS = 0.2


class MirrorFailed(OSError):
    """The mirror could not give the base commit (a full disk, a fetch that failed): clone without it."""


@dataclass
class WarmState:
    use: str
    store: Store | None = None
    key: str = ""
    sha: str = ""
    material: dict = field(default_factory=dict)
    entry: Entry | None = None  # the entry the session's folders are mounted from
    build_lock: int | None = None  # held by the evaluation building the key
    in_use: int | None = None
    mounted: list[str] = field(default_factory=list)
    manifest: dict | None = None  # the entry's, read once


# -- cloning_repo -------------------------------------------------------------------------


def clone(ctx: Context, resolve_pin: str | None) -> bool:
    """Place the repository from the cache; False when the caller should clone as without one."""
    state = ctx.cache = _decide(ctx)
    Evaluation.objects.filter(id=ctx.eval_id).update(cache=state.use)
    if state.store is None:  # off, or the cache folder unusable (a warning said why)
        return False
    try:
        return _clone(ctx, state, resolve_pin)
    except OSError as exc:  # MountError and MirrorFailed included
        log.warning("workspace cache unusable, cloning without it: %s", exc)
        _go_cold(ctx, state)
        _empty(ctx.session.repo)
        return False


def _go_cold(ctx: Context, state: WarmState) -> None:
    """From here on the evaluation runs as without a cache: nothing built, nothing served."""
    _unlock(state)
    _unmount_all(ctx)
    if state.in_use is not None:
        os.close(state.in_use)
        state.in_use = None
    state.entry = None
    state.store = None
    if state.use == CacheUse.HIT:
        state.use = CacheUse.MISS
        Evaluation.objects.filter(id=ctx.eval_id).update(cache=CacheUse.MISS)


def _clone(ctx: Context, state: WarmState, resolve_pin: str | None) -> bool:
    task = ctx.task
    store = state.store
    if gitrepo.is_full_sha(task.base_commit):
        state.sha = task.base_commit
    else:
        state.sha = _with_mirror(
            ctx,
            store,
            resolve_pin,
            lambda m, run, env: mirror.resolve_in_mirror(
                run, mirror=m, base_commit=task.base_commit, env=env, timeout_secs=ctx.config.clone_timeout_secs
            ),
        )
    state.key = cache_key({**state.material, "commit": state.sha})
    entry = _usable_entry(ctx, store, state.key)
    if entry is None:
        state.build_lock = _build_lock(ctx, store, state.key)
        entry = _usable_entry(ctx, store, state.key)  # built by whoever held the lock meanwhile
        if entry is not None:
            _unlock(state)
    if entry is not None:
        _start_from(ctx, state, entry)
        ctx.base_sha = state.sha
        _mount(ctx, entry, "repo")
        return True
    ctx.base_sha = _with_mirror(ctx, store, resolve_pin, lambda m, run, env: mirror.clone_from_mirror(
        run, mirror=m, base_commit=state.sha, dest=ctx.session.repo, env=env,
        timeout_secs=ctx.config.clone_timeout_secs))  # fmt: skip
    return True


def _decide(ctx: Context) -> WarmState:
    config = ctx.config
    if config.workspace_cache == "off" or not ctx.task.cache:
        return WarmState(CacheUse.OFF)
    if os.geteuid() != 0 or ctx.session.uid is None:
        log.info("the workspace cache needs root (idmapped mounts, a uid per evaluation); not used")
        return WarmState(CacheUse.OFF)
    try:
        material = _material(ctx)
    except StepFailed:
        return WarmState(CacheUse.OFF)  # a bad placeholder: installing_deps reports it as before
    store = Store(config.cache_root)
    try:
        store.ensure()
    except CacheUnavailable as exc:
        log.warning("workspace cache unusable, running cold: %s", exc)
        return WarmState(CacheUse.MISS)
    return WarmState(CacheUse.MISS, store=store, material=material)


def _material(ctx: Context) -> dict:
    """What the install step's result depends on, besides the commit (SPEC §13)."""
    environment = ctx.environment
    view = static.view(ctx)
    session = str(ctx.session.root)

    def general(text: str) -> str:  # without the sandbox, asset paths are in the session: rewritten on restore
        return text.replace(session, "<session>")

    return {
        "repo": ctx.task.repo,
        "install": [general(command) for command in static.fill(ctx, ctx.task.install)],
        "env": {name: general(value) for name, value in static.task_env(ctx).items()},
        "environment": [environment.name, environment.identity] if environment else None,
        "assets": [[a.name, a.save_path, a.kind, _digest(view.host_path(a))] for a in view.assets],
        # Paths the install step may have written into files, and what its commands ran with.
        "workspace_base": str(ctx.config.workspace_base),
        "command_path": ctx.command_path,
        "sandboxed": ctx.runtime.isolated,
    }


def _usable_entry(ctx: Context, store: Store, key: str) -> Entry | None:
    entry = store.entry(key)
    if entry is None:
        return None
    problem = store.verify(entry)
    if problem is None and time.time() - entry.created_at > ctx.config.cache_max_age_secs:
        problem = "older than CACHE_MAX_AGE_SECS"
    if problem is None and len(entry.meta.get("session_root", "")) != len(str(ctx.session.root)):
        problem = "built for session paths of another length"
    if problem is None:
        return entry
    log.warning("cache entry %s not used (%s): rebuilding it", key, problem)
    return None


def _build_lock(ctx: Context, store: Store, key: str) -> int | None:
    """The key's build lock; while another evaluation builds it, wait (or give up and run cold)."""
    deadline = time.monotonic() + ctx.config.clone_timeout_secs + ctx.config.install_timeout_secs
    while True:
        fd = store.try_build_lock(key)
        if fd is not None or store.entry(key) is not None:
            return fd
        if time.monotonic() > deadline:
            log.warning("cache entry %s: still being built by another evaluation; running cold", key)
            return None
        ctx.check_cancelled()
        time.sleep(WAIT_POLL_SECS)


def _start_from(ctx: Context, state: WarmState, entry: Entry) -> None:
    state.entry = entry
    state.use = CacheUse.HIT
    state.in_use = state.store.hold_in_use(entry)
    state.store.record_hit(entry)
    Evaluation.objects.filter(id=ctx.eval_id).update(cache=CacheUse.HIT)


# -- the mirror --------------------------------------------------------------------------


def _with_mirror(ctx: Context, store: Store, resolve_pin, use):
    """``use(mirror_path, runner, env)`` on the task's mirror, fetching into it first when needed."""
    task, config, session = ctx.task, ctx.config, ctx.session
    name = hashlib.sha256(task.repo.encode()).hexdigest()[:32]
    path = store.mirrors / name
    lock = store.mirrors / f"{name}.lock"
    point = session.root / MIRROR_POINT
    read_env = gitrepo.git_env(session.home, "file")
    if mirror.names_a_commit_forever(task.base_commit) and (path / "HEAD").exists():
        try:
            with store.lock_file(lock, fcntl.LOCK_SH), _bound(ctx, path, point, writable=False):
                os.utime(lock)  # last used, for eviction
                return use(point, ctx.command_runner(ctx.executor_policy(network=False)), read_env)
        except mirror.NotInMirror:
            pass
    fetch_env = ctx.repository_env()
    try:
        with store.lock_file(lock, fcntl.LOCK_EX):
            path.mkdir(mode=0o755, exist_ok=True)
            with _bound(ctx, path, point, writable=True):
                mirror.update_mirror(
                    ctx.command_runner(ctx.executor_policy(network=True)),
                    mirror=point,
                    repo_url=task.repo,
                    env=fetch_env,
                    timeout_secs=config.clone_timeout_secs,
                    resolve_pin=resolve_pin,
                )
            _write_size(store, name, path)
        with store.lock_file(lock, fcntl.LOCK_SH), _bound(ctx, path, point, writable=False):
            return use(point, ctx.command_runner(ctx.executor_policy(network=False)), read_env)
    except gitrepo.GitError as exc:  # NotInMirror included: clone_at says why, in its own words
        ctx.check_cancelled()
        raise MirrorFailed(errno.EIO, f"the mirror of {gitrepo.display_url(task.repo)}: {exc}") from None


@contextmanager
def _bound(ctx: Context, source: Path, point: Path, *, writable: bool):
    point.mkdir(mode=0o700, exist_ok=True)
    mounts.bind_idmapped(source, point, mounts.userns_fd(ctx.session.uid), writable=writable)
    try:
        yield
    finally:
        mounts.unmount(point)
        point.rmdir()


def _write_size(store: Store, name: str, path: Path) -> None:
    try:
        store.write_mirror_usage(name, tree_usage(path))
    except OSError:
        pass


# -- installing_deps ------------------------------------------------------------------------


def restored(ctx: Context) -> bool:
    """On a hit: the venv and HOME from the entry; True when the install commands need not run."""
    state = ctx.cache
    if state is None or state.use != CacheUse.HIT:
        return False
    session = ctx.session
    try:
        for name in ("venv", "home"):
            _mount(ctx, state.entry, name)
    except OSError as exc:  # the repository is mounted already: the entry's venv and HOME as copies
        log.warning("could not mount the cache entry's venv and HOME, copying them: %s", exc)
        for name in ("venv", "home"):
            if name in state.mounted:
                _unmount(ctx, name)
            remove_tree_nofollow(session.root / name)
            copy_tree_nofollow(state.entry.folder(name), session.root / name, session.uid)
            _rewrite_session_paths(ctx, state.entry, name)
        session.keep_install_home()
    return True


def keep(ctx: Context) -> None:
    """After a successful install: store it when this evaluation builds the key; then keep HOME and venv."""
    state = ctx.cache
    if state is None or state.build_lock is None or state.store is None:
        ctx.session.keep_install_home()
        return
    store, session = state.store, ctx.session
    build = None
    moved: list[str] = []
    try:
        build = store.begin_build(state.key, ctx.eval_id)
        for name in FOLDERS:
            move_in(session.root / name, build / name)
            moved.append(name)
        meta = {"repo": ctx.task.repo, "commit": state.sha, "material": state.material, "eval_id": ctx.eval_id}
        store.seal(build, key=state.key, meta=meta, session_root=str(session.root))
        entry = store.publish(build, state.key)
        build = None
    except OSError as exc:
        log.warning("could not store the install step in the workspace cache (running cold): %s", exc)
        _give_back(ctx, build, moved)
        _unlock(state)
        session.keep_install_home()
        return
    _unlock(state)
    state.entry = entry
    state.in_use = store.hold_in_use(entry)
    try:
        for name in FOLDERS:
            (session.root / name).mkdir(mode=0o700)
            _mount(ctx, entry, name)
    except (OSError, mounts.MountError) as exc:
        log.warning("could not run from the new cache entry, copying it back: %s", exc)
        _unmount_all(ctx)
        for name in FOLDERS:
            remove_tree_nofollow(session.root / name)
            copy_tree_nofollow(entry.folder(name), session.root / name, session.uid)
        session.keep_install_home()
    try:
        config = ctx.config
        store.evict(
            max_bytes=config.cache_max_bytes,
            max_files=config.cache_max_files,
            max_age_secs=config.cache_max_age_secs,
            keep=state.key,
        )
    except OSError as exc:
        log.warning("workspace cache eviction failed: %s", exc)


def _give_back(ctx: Context, build: Path | None, moved: list[str]) -> None:
    """Undo a failed store: the session's folders back in place, the evaluation's again."""
    session = ctx.session
    for name in moved:
        move_in(build / name, session.root / name)
        _chown_tree(session.root / name, session.uid)
    if build is not None:
        ctx.cache.store.abandon(build)


def _chown_tree(top: Path, uid: int) -> None:
    for folder, subdirs, files in os.walk(top):
        os.chown(folder, uid, uid, follow_symlinks=False)
        for child in (*subdirs, *files):
            os.chown(os.path.join(folder, child), uid, uid, follow_symlinks=False)


# -- running_tests -------------------------------------------------------------------------


def restore_install_state(ctx: Context) -> None:
    """HOME and the venv as the install step left them, for the tests."""
    state = ctx.cache
    if state is None or "home" not in state.mounted:
        ctx.session.restore_install_home()
        return
    for name in ("venv", "home"):
        if name in state.mounted:
            _unmount(ctx, name)
            _mount(ctx, state.entry, name)


# -- cleanup -------------------------------------------------------------------------------


def release(ctx: Context) -> None:
    """Unmount the session's layers and drop every lock: nothing of the evaluation holds the cache."""
    state = ctx.cache
    if state is None:
        return
    try:
        _unmount_all(ctx)
    finally:
        _unlock(state)
        if state.in_use is not None:
            os.close(state.in_use)
            state.in_use = None
        if state.store is not None:
            for build, eval_id in state.store.builds():
                if eval_id == ctx.eval_id:
                    state.store.abandon(build)


# -- mounts ------------------------------------------------------------------------------


def _mount(ctx: Context, entry: Entry, name: str) -> None:
    """``<session>/<name>``: a private, writable overlay of the entry's folder, as the evaluation's uid."""
    session, state = ctx.session, ctx.cache
    source = entry.folder(name)
    if name == "venv" and not any(source.iterdir()):
        return  # no venv was made (no Python): the folder stays the session's empty, root-owned one
    layers = session.root / LAYERS
    layers.mkdir(mode=0o700, exist_ok=True)
    base = layers / name
    base.mkdir(mode=0o700)
    lower, upper, work = base / "lower", base / "upper", base / "work"
    for folder in (lower, upper, work):
        folder.mkdir(mode=0o700)
    # The overlay's root takes its owner and mode from the upper folder.
    os.chown(upper, session.uid, session.uid)
    os.chmod(upper, stat.S_IMODE(os.lstat(source).st_mode))
    target = session.root / name
    mounts.bind_idmapped(source, lower, mounts.userns_fd(session.uid))
    try:
        mounts.mount_overlay(lower, upper, work, target)
    finally:
        mounts.unmount(lower)  # the overlay keeps its own reference: the entry is reachable only through it
    state.mounted.append(name)
    _rewrite_session_paths(ctx, entry, name)


def _unmount(ctx: Context, name: str) -> None:
    mounts.unmount(ctx.session.root / name)
    remove_tree_nofollow(ctx.session.root / LAYERS / name)
    ctx.cache.mounted.remove(name)


def _unmount_all(ctx: Context) -> None:
    root = ctx.session.root
    mounts.unmount_below(root)
    if (root / LAYERS).exists():
        remove_tree_nofollow(root / LAYERS)
    if ctx.cache is not None:
        ctx.cache.mounted.clear()


def _rewrite_session_paths(ctx: Context, entry: Entry, name: str) -> None:
    """The building session's path, in the few files that recorded it, becomes this session's."""
    old = entry.meta.get("session_root", "")
    new = str(ctx.session.root)
    if old == new:
        return
    old_b, new_b = os.fsencode(old), os.fsencode(new)
    state = ctx.cache
    if state.manifest is None:
        state.manifest = state.store.manifest(entry)
    manifest = state.manifest
    root = ctx.session.root
    for relpath in manifest.get("rewrite", []):
        if relpath.split("/", 1)[0] == name:
            _edit_file(root, relpath, lambda data: data.replace(old_b, new_b))
    for relpath in manifest.get("links", []):
        if relpath.split("/", 1)[0] == name:
            dir_fd, name_in_dir = open_parent(root, relpath, create=False)
            try:
                target = os.readlink(name_in_dir, dir_fd=dir_fd).replace(old, new)
                os.unlink(name_in_dir, dir_fd=dir_fd)
                os.symlink(target, name_in_dir, dir_fd=dir_fd)
                os.chown(name_in_dir, ctx.session.uid, ctx.session.uid, dir_fd=dir_fd, follow_symlinks=False)
            finally:
                os.close(dir_fd)


def _edit_file(root: Path, relpath: str, change) -> None:
    dir_fd, name = open_parent(root, relpath, create=False)
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)  # copied up here
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "r+b") as handle:
        data = change(handle.read())
        handle.seek(0)
        handle.write(data)
        handle.truncate()


# -- helpers -------------------------------------------------------------------------------


def _unlock(state: WarmState) -> None:
    if state.build_lock is not None:
        os.close(state.build_lock)
        state.build_lock = None


def _empty(folder: Path) -> None:
    if folder.is_dir() and not folder.is_symlink():
        for child in list(folder.iterdir()):
            remove_tree_nofollow(child)


def _digest(path: Path) -> str:
    """A static asset's content, as a digest (its staged copy's mtime changes every evaluation)."""
    digest = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    for folder, subdirs, files in os.walk(path):
        subdirs.sort()
        for name in sorted(files):
            child = Path(folder) / name
            digest.update(os.fsencode(child.relative_to(path)) + b"\0")
            if child.is_symlink():
                digest.update(b"link:" + os.fsencode(os.readlink(child)))
            elif child.is_file():
                digest.update(_digest(child).encode())
    return digest.hexdigest()
