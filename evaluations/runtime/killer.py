"""Finding and killing every process of an evaluation.

An evaluation's processes are found two ways, and a kill uses both:

1. Descent: the process that hosts the spawner (one per evaluation) is a
   child subreaper, so a process that calls ``setsid`` or double-forks is
   reparented to it instead of to init, and stays in its tree.
2. The tag: every command gets ``TERM_EXECUTOR_EVAL=<eval_id>`` in its
   environment, which children inherit; a scan of ``/proc/*/environ`` finds
   them wherever they went (a process that clears its environment is still
   caught by 1).
3. The uid, when the evaluation has one of its own (``uids.py``): every
   process whose real, effective or saved uid is it belongs to the
   evaluation, whatever it did to its environment or its parentage.

A process storm may fork while we kill, so the kill loops until a scan finds
nothing alive. Zombies reparented to us are reaped here, but never the pid of
a command whose ``Popen`` is still waiting for it (that status is its own).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import defaultdict

import psutil

TAG_VAR = "TERM_EXECUTOR_EVAL"

_PR_SET_CHILD_SUBREAPER = 36
_subreaper_pid: int | None = None

# Popen objects still waiting for their pid: a reap must leave those alone.
# Spawning and reaping hold the same lock, so a fresh child cannot be reaped
# between fork and registration.
_spawn_lock = threading.Lock()
_awaited_pids: set[int] = set()

# Children of the host that are not commands (see become_subreaper, protect).
# Kept as psutil objects, so a pid reused by a later command is not protected.
_protected: list[psutil.Process] = []

_KILL_BUDGET_SECS = 10.0

log = logging.getLogger(__name__)


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (once per process).

    Children it already has are the host's own, not commands: they are
    protected from every kill (see ``protect``).
    """
    global _subreaper_pid
    if _subreaper_pid == os.getpid():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(code)}")
    _subreaper_pid = os.getpid()
    _protected[:] = psutil.Process().children()


def protect(pid: int) -> None:
    """Never count or kill ``pid`` and its subtree: a child of the host that is not a command."""
    _protected.append(psutil.Process(pid))


@contextlib.contextmanager
def spawning():
    """Hold while starting a command; call the yielded function with its pid."""
    with _spawn_lock:
        yield _awaited_pids.add


def release(pid: int) -> None:
    """The command's Popen has collected its status; its pid is no longer ours to guard."""
    with _spawn_lock:
        _awaited_pids.discard(pid)


def _foreign_pids() -> set[int]:
    """Children of this process that are not commands.

    Those it had before becoming a subreaper, those registered with
    ``protect``, and the helpers multiprocessing starts behind our back
    (its children, the resource tracker, the forkserver).
    """
    pids = {proc.pid for proc in _protected if proc.is_running()}
    pids.update(child.pid for child in multiprocessing.active_children())
    helpers = (
        getattr(getattr(multiprocessing, "resource_tracker", None), "_resource_tracker", None),
        getattr(getattr(multiprocessing, "forkserver", None), "_forkserver", None),
    )
    for helper in helpers:
        pid = getattr(helper, "_pid", None) or getattr(helper, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
    return pids


def descendants(exclude: set[int] | None = None, *, zombies: bool = False) -> list[psutil.Process]:
    """Every live descendant of this process, minus the subtrees rooted at ``exclude``.

    ``zombies``: include the exited-but-not-waited-for ones too (each still
    holds a pid and counts against RLIMIT_NPROC).

    One pass over /proc builds the parent map (psutil's own ``children`` does
    the same scan, but once per call and per recursion root).
    """
    exclude = _foreign_pids() if exclude is None else exclude
    children_of: dict[int, list[psutil.Process]] = defaultdict(list)
    for proc in psutil.process_iter(["ppid", "status"]):
        children_of[proc.info["ppid"]].append(proc)
    found: list[psutil.Process] = []
    stack = [os.getpid()]
    while stack:
        for child in children_of.get(stack.pop(), ()):
            if child.pid in exclude:
                continue
            stack.append(child.pid)
            if zombies or child.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(child)
    return found


def owned_by(uid: int) -> list[psutil.Process]:
    """Every live process whose real, effective or saved uid is ``uid``."""
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        uids = proc.info["uids"]
        if uids is not None and uid in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def tagged(eval_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries this evaluation's tag."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(TAG_VAR) == eval_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue  # gone, a kernel thread, or not ours to read
    return found


def kill_all(eval_id: str, process_group: int | None = None, *, uid: int | None = None) -> int:
    """SIGKILL the group, then every descendant and tagged process until none is left.

    ``uid``: the evaluation's own uid (never a shared one): its processes go too.
    Returns how many distinct processes were signalled.
    """
    if process_group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process_group, signal.SIGKILL)
    protected = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    killed: set[int] = set()
    deadline = time.monotonic() + _KILL_BUDGET_SECS
    while True:
        found = [*descendants(), *tagged(eval_id), *(owned_by(uid) if uid is not None else ())]
        targets = {p.pid: p for p in found if p.pid not in protected}
        if not targets:
            break
        for proc in targets.values():
            try:
                proc.kill()
                killed.add(proc.pid)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                log.warning("cannot kill pid %s of evaluation %s: access denied", proc.pid, eval_id)
                protected.add(proc.pid)
        reap_orphans()
        if time.monotonic() > deadline:
            log.error(
                "evaluation %s: processes still alive after %ss of killing: %s",
                eval_id,
                _KILL_BUDGET_SECS,
                sorted(targets),
            )
            break
        time.sleep(0.002)  # let the kernel turn the killed into zombies
    reap_orphans()
    return len(killed)


def reap_orphans() -> int:
    """waitpid every zombie child that no Popen is waiting for; return how many."""
    reaped = 0
    with _spawn_lock:
        if not _any_zombie_child():
            return 0  # the common case, for the price of one syscall instead of a /proc scan
        keep = _awaited_pids | _foreign_pids()
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return 0
        for child in children:
            if child.pid in keep:
                continue
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    continue
                pid, _ = os.waitpid(child.pid, os.WNOHANG)
                reaped += pid != 0
            except (psutil.Error, ChildProcessError):
                continue
    return reaped


def _any_zombie_child() -> bool:
    """Whether some child has exited and is not reaped yet (WNOWAIT: nothing is consumed)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False  # no children at all
