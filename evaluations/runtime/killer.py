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
import select
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

TAG_VAR = "TERM_EXECUTOR_EVAL"

_PR_SET_CHILD_SUBREAPER = 36
_subreaper_pid: int | None = None

# Popen objects still waiting for their pid: a reap must leave those alone.
# Spawning and reaping hold the same lock, so a fresh child cannot be reaped
# between fork and registration.
_spawn_lock = threading.Lock()
_awaited_pids: set[int] = set()

# Children of the host that are not commands (see become_subreaper, protect).
# Kept with their start time, so a pid reused by a later command is not protected.
_protected: list[Proc] = []

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
    _protected[:] = [proc for proc in processes() if proc.ppid == _subreaper_pid]


def protect(pid: int) -> None:
    """Never count or kill ``pid`` and its subtree: a child of the host that is not a command."""
    proc = _stat(pid)
    if proc is None:
        raise ProcessLookupError(pid)
    _protected.append(proc)


def protected_pids() -> set[int]:
    """The pids ``protect`` (or ``become_subreaper``) set aside that still run: not commands."""
    return {proc.pid for proc in _protected if proc.same_process()}


@contextlib.contextmanager
def spawning():
    """Hold while starting a command; call the yielded function with its pid."""
    with _spawn_lock:
        yield _awaited_pids.add


def release(pid: int) -> None:
    """The command's Popen has collected its status; its pid is no longer ours to guard."""
    with _spawn_lock:
        _awaited_pids.discard(pid)


def adopt(pid: int) -> None:
    """``pid`` is (or is about to be reparented as) our child and ``await_exit`` will reap it:
    ``reap_orphans`` leaves it alone, so its pid cannot be reused while we wait on it."""
    with _spawn_lock:
        _awaited_pids.add(pid)


def await_exit(pid: int, timeout: float = _KILL_BUDGET_SECS) -> bool:
    """Wait until the adopted ``pid`` has exited, reap it if it is our child, and release it.

    False if it still runs after ``timeout`` (it is released all the same: a later
    ``reap_orphans`` takes its zombie).
    """
    try:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return True  # gone and reaped (by the parent it had before us)
        try:
            if not select.select([fd], [], [], timeout)[0]:
                return False
        finally:
            os.close(fd)
        _reap(pid)
        return True
    finally:
        release(pid)


def _foreign_pids() -> set[int]:
    """Children of this process that are not commands.

    Those it had before becoming a subreaper, those registered with
    ``protect``, and the helpers multiprocessing starts behind our back
    (its children, the resource tracker, the forkserver).
    """
    pids = {proc.pid for proc in _protected if proc.same_process()}
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


@dataclass(frozen=True, slots=True)
class Proc:
    """One process as ``/proc/<pid>/stat`` showed it. ``(pid, start)`` names it: a pid
    reused by a later process has another start time."""

    pid: int
    ppid: int
    zombie: bool  # exited or exiting: holds a pid, runs nothing
    start: int  # clock ticks after boot
    rss: int  # bytes; 0 for a zombie
    exited: bool = False  # a zombie: exit() is over, only the status is left
    kernel_thread: bool = False  # runs no user code, belongs to no uid of ours

    def same_process(self) -> bool:
        """Whether this pid still names this process (alive, or a zombie not yet reaped)."""
        now = _stat(self.pid)
        return now is not None and now.start == self.start

    def finished(self) -> bool:
        """Whether exit() is over for this process (a zombie, reaped, or its pid reused)."""
        now = _stat(self.pid)
        return now is None or now.start != self.start or now.exited

    def kill(self) -> bool:
        """SIGKILL this very process (not a later one that reused its pid); False if it is gone."""
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        try:
            now = _stat(self.pid)  # the pidfd holds the pid: checked once, it cannot change owner
            if now is None or now.start != self.start:
                return False
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)


_PAGE = os.sysconf("SC_PAGE_SIZE")
_PF_EXITING = 0x4  # include/linux/sched.h
_PF_KTHREAD = 0x00200000


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # gone, or not ours to read
        return None
    try:
        return os.read(fd, 65536)
    except OSError:  # a kernel thread's environ, a process gone meanwhile
        return None
    finally:
        os.close(fd)


def _stat(pid: int) -> Proc | None:
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
    fields = data[data.rindex(b")") + 2 :].split(None, 22)  # up to rss; the other 30 fields stay one
    # Dead: a zombie, or a process already inside exit() (PF_EXITING) that can never run user
    # code again, e.g. a sandbox's pid 1 whose namespaces the kernel is still tearing down.
    exited = fields[0] in (b"Z", b"X")
    flags = int(fields[6])
    dead = exited or bool(flags & _PF_EXITING)
    return Proc(pid, int(fields[1]), dead, int(fields[19]), int(fields[21]) * _PAGE, exited, bool(flags & _PF_KTHREAD))


def processes(pids: Iterable[int] | None = None) -> list[Proc]:
    """Every process on the host that runs user code: one read of ``/proc/<pid>/stat`` each.
    ``pids``: only those (a cgroup's members), not the whole host.

    Kernel threads (most of a quiet host's processes) are left out: none is ever a
    descendant, of a uid of ours or tagged. (psutil builds an object per process and
    reads several files; the sweeps and the monitor's samples ran three such passes:
    bench/RESULTS.md.)
    """
    found = []
    names = os.listdir("/proc") if pids is None else map(str, pids)
    for name in names:
        if name.isdigit() and (proc := _stat(int(name))) is not None and not proc.kernel_thread:
            found.append(proc)
    return found


def _uids(pid: int) -> tuple[int, ...]:
    """Real, effective, saved and filesystem uid, from ``/proc/<pid>/status`` (not the owner of
    ``/proc/<pid>``, which a process can make root's with PR_SET_DUMPABLE)."""
    data = _read(f"/proc/{pid}/status")
    if data is None or (at := data.find(b"\nUid:")) < 0:
        return ()
    return tuple(int(v) for v in data[at + 5 : data.index(b"\n", at + 1)].split())


def _carries_tag(pid: int, tag: bytes) -> bool:
    environ = _read_all(f"/proc/{pid}/environ")
    return environ is not None and tag in environ.split(b"\0")


def _read_all(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return None


def _tag(eval_id: str) -> bytes:
    return f"{TAG_VAR}={eval_id}".encode()


def subtree(root: int, table: list[Proc] | None = None) -> set[int]:
    """Every descendant of ``root`` (host pids, ``root`` left out), by the process table's parent links."""
    children: dict[int, list[int]] = {}
    for proc in processes() if table is None else table:
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def descendants(
    exclude: set[int] | None = None, *, zombies: bool = False, table: list[Proc] | None = None
) -> list[Proc]:
    """Every live descendant of this process, minus the subtrees rooted at ``exclude``.

    ``zombies``: include the exited-but-not-waited-for ones too (each still
    holds a pid and counts against RLIMIT_NPROC). ``table``: a scan already made.
    """
    exclude = _foreign_pids() if exclude is None else exclude
    children_of: dict[int, list[Proc]] = defaultdict(list)
    for proc in processes() if table is None else table:
        children_of[proc.ppid].append(proc)
    found: list[Proc] = []
    stack = [os.getpid()]
    while stack:
        for child in children_of.get(stack.pop(), ()):
            if child.pid in exclude:
                continue
            stack.append(child.pid)
            if zombies or not child.zombie:
                found.append(child)
    return found


def owned_by(uid: int, table: list[Proc] | None = None) -> list[Proc]:
    """Every live process whose real, effective, saved or filesystem uid is ``uid``."""
    return [p for p in (processes() if table is None else table) if not p.zombie and uid in _uids(p.pid)]


def tagged(eval_id: str, table: list[Proc] | None = None) -> list[Proc]:
    """Every live process whose environment carries this evaluation's tag."""
    me, tag = os.getpid(), _tag(eval_id)
    return [
        p
        for p in (processes() if table is None else table)
        if p.pid != me and not p.zombie and _carries_tag(p.pid, tag)
    ]


def _ancestors(table: list[Proc]) -> set[int]:
    """This process and its ancestors: never a target, whatever their uid or environment."""
    parent_of = {p.pid: p.ppid for p in table}
    found, pid = set(), os.getpid()
    while pid and pid not in found:
        found.add(pid)
        pid = parent_of.get(pid, 0)
    return found


def evaluation_processes(
    eval_id: str, *, uid: int | None = None, spare: Callable[[], set[int]] | None = None
) -> list[Proc]:
    """What a kill must take, in one pass over /proc.

    With a uid of the evaluation's own, its processes are its descendants and
    that uid's: every command starts as the uid, and none can leave it
    (no_new_privs: no setuid program works), so the environments need not be
    read. With a shared uid (or from another process, as the reaper), the tag
    finds those that left the tree. ``spare``: the pids to leave alone (the
    spawner's background processes, read at each pass).
    """
    table = processes()
    found = {p.pid: p for p in descendants(table=table)}
    if uid is not None:
        found.update((p.pid, p) for p in owned_by(uid, table))
    else:
        found.update((p.pid, p) for p in tagged(eval_id, table))
    for pid in (*_ancestors(table), *(spare() if spare is not None else ())):
        found.pop(pid, None)
    return list(found.values())


def kill_all(
    eval_id: str,
    process_group: int | None = None,
    *,
    uid: int | None = None,
    spare: Callable[[], set[int]] | None = None,
) -> int:
    """SIGKILL the group, then every process of the evaluation until none is left.

    ``uid``: the evaluation's own uid (never a shared one): its processes go too. ``spare``: as
    ``evaluation_processes``'.
    Returns how many distinct processes were signalled.
    """
    if process_group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process_group, signal.SIGKILL)
    return kill_until_none(lambda: evaluation_processes(eval_id, uid=uid, spare=spare), f"evaluation {eval_id}")


def kill_tagged(tag: str) -> int:
    """SIGKILL every process whose environment carries ``tag``, and nothing else (not this process's
    other descendants): one live sandbox's exec among the others (sandboxes/host.py)."""
    return kill_until_none(lambda: tagged(tag), f"processes tagged {tag}")


def kill_until_none(find: Callable[[], list[Proc]], what: str) -> int:
    """SIGKILL what ``find`` returns until it returns nothing (a fork storm forks while we
    kill), then wait until each killed process is through exit(). Returns how many were killed."""
    killed: dict[int, Proc] = {}
    refused: set[int] = set()
    deadline = time.monotonic() + _KILL_BUDGET_SECS
    while targets := [p for p in find() if p.pid not in refused]:
        for proc in targets:
            try:
                if proc.kill():
                    killed[proc.pid] = proc
            except PermissionError:
                log.warning("cannot kill pid %s of %s: access denied", proc.pid, what)
                refused.add(proc.pid)
        reap_orphans()
        if time.monotonic() > deadline:
            log.error(
                "%s: processes still alive after %ss of killing: %s",
                what,
                _KILL_BUDGET_SECS,
                sorted(p.pid for p in targets),
            )
            break
        time.sleep(0.002)  # let the kernel turn the killed into zombies
    # A process inside exit() is dead to the scan, but would still look alive to anyone else
    # for a moment: what we killed is over before we return.
    while not all(proc.finished() for proc in killed.values()) and time.monotonic() < deadline:
        time.sleep(0.001)
    reap_orphans()
    return len(killed)


def reap_orphans() -> int:
    """waitpid every zombie child that no Popen is waiting for; return how many.

    ``waitid(WNOWAIT)`` names a zombie child without consuming it: in the common
    case (none, or an orphan such as a sandbox's pid 1 reparented to us) that is
    one syscall per zombie and no scan. Only when the zombie it names is one we
    must leave alone (a command's own pid, a helper's) are the others found by a
    scan of /proc.
    """
    reaped = 0
    with _spawn_lock:
        keep: set[int] | None = None
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return reaped  # no children at all
            if info is None:
                return reaped
            if keep is None:
                keep = _awaited_pids | _foreign_pids()
            if info.si_pid in keep:
                break
            reaped += _reap(info.si_pid)
        me = os.getpid()
        for proc in processes(own_children()):
            if proc.ppid == me and proc.exited and proc.pid not in keep:
                reaped += _reap(proc.pid)
    return reaped


def own_children() -> list[int] | None:
    """This process's children, zombies included, from each of its threads' ``children`` file (a
    few reads where a scan of /proc reads hundreds: a command's end found its own zombie among
    the awaited and scanned the host, 2.5 ms of each phase exec); None where the kernel has no
    such file (CONFIG_PROC_CHILDREN), and the caller scans the host."""
    pids: list[int] = []
    try:
        threads = os.listdir("/proc/self/task")
        for tid in threads:
            try:
                with open(f"/proc/self/task/{tid}/children", "rb") as listing:
                    pids.extend(map(int, listing.read().split()))
            except FileNotFoundError:
                if not os.path.isdir(f"/proc/self/task/{tid}"):
                    continue  # a thread that ended since the listing
                return None
    except OSError:
        return None
    return pids


def _reap(pid: int) -> int:
    try:
        return int(os.waitpid(pid, os.WNOHANG)[0] != 0)
    except ChildProcessError:
        return 0
