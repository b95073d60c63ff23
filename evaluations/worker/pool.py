"""One process per evaluation, at most `capacity` at once.

A ProcessPoolExecutor breaks as a whole when one child dies; here each
evaluation has its own multiprocessing.Process, the worker waits on their
sentinels, and a child that dies only fails its own evaluation.

The processes come from multiprocessing's forkserver, but that forkserver is
a fork of the worker (``start_forkserver``), not the fresh interpreter
multiprocessing would start and import Django into a second time: the worker
imports the pipeline once, freezes its heap (``gc.freeze``) and forks, so the
worker, its forkserver and every evaluation process share those pages
(the figures: bench/RESULTS.md).

Each evaluation process gets the read end of a pipe whose write end only the
worker holds: its end of file tells the evaluation that the worker died
(child.py). Cancels do not travel here: they are written to the evaluation's
row, which the evaluation process watches (pipeline/cancel.py). No
``multiprocessing.Event`` either: named semaphores need multiprocessing's
resource tracker, one more process; a pipe needs nothing and vanishes with
its holders, so the pool runs without a resource tracker.

A pool may keep one spare (``spare=True``): a process forked ahead, while the
pool has room, that waits for its work's id on that same pipe. ``start``
hands the id to the spare rather than forking then, so the fork,
multiprocessing's start-up and the evaluation's database connection (opened by
the spare as it starts: child.ready) are off the claim's path; the spare then calls the
target exactly as a process started for the id would, and the pipe goes on
as its liveness pipe. Until it has an id a spare is nobody's: not running,
not counted, and the end of its pipe (the worker stopped or died) ends it
having read or written no row. A spare that died is replaced; its work never
waited on it (``start`` forks as before when no live spare is there).

Such a pool's processes are kept for the next id (``reuses``, EVAL_PROCESS_REUSES): a process
whose evaluation ended, and that left the process as it found it (``ProcessState``: no thread,
child, descriptor, working folder, environment, limit, niceness, umask or signal handler of its
own; its private memory under ``REUSE_MAX_PRIVATE_BYTES``), says so on its report pipe and waits
for another id; the pool keeps it as a warm spare (its pages copied, its caches built: the
throughput of bench/run +8 to +15 points, bench/RESULTS.md), beside the spare that never ran, if
there is one, and hands it the next id first. So a pool waits with at most two spares, one fresh and
one warm, and forks no spare while it has one. Any other ending is an exit, as before; a process
past ``reuses`` evaluations exits too.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import os
import resource
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from evaluations.runtime import killer
from executor_project.process import kept_descriptors, name_process

logger = logging.getLogger("term_executor.worker")

_PR_SET_PDEATHSIG = 1
SPARE_NAME = "te-spare"
SPARE_EXIT_SECS = 5.0  # a spare told to go exits at once; past this it is killed
# An ended evaluation's threads (its watchers, drains) are done by then, or its process is not kept.
THREADS_END_SECS = 5.0
REUSE_MAX_PRIVATE_BYTES = 64 << 20  # a process holding more of its own after an evaluation exits instead


@dataclass
class Spare:
    process: multiprocessing.Process
    handoff: Connection  # the write end of its pipe: the id goes there, then it is the liveness pipe
    pidfd: int
    report: Connection | None = None  # the read end of its report pipe: the id of each evaluation it ended
    warm: bool = False  # it ran an evaluation already


@dataclass
class Running:
    eval_id: str
    process: multiprocessing.Process
    alive: Connection  # the write end of the evaluation process's liveness pipe: held, never written
    pidfd: int = -1  # readable once the process has exited, whoever its parent is by then
    started: float = field(default_factory=time.monotonic)
    report: Connection | None = None  # readable once it ended its evaluation and waits for another


class Pool:
    def __init__(
        self,
        capacity: int,
        runtime,
        target=None,
        *,
        spare: bool = False,
        ready=None,
        leave=None,
        tidy=None,
        reuses: int = 1,
    ):
        """``target(eval_id, runtime, alive_channel)`` runs in each process: child.main unless a test says.
        ``ready()``: what a spare does before it waits for its id (child.ready with child.main);
        ``leave()``: what it does before it exits (child.leave); ``tidy()``: what a spare's evaluation
        left for later, started once its end is reported (``tidy(wait=True)`` before the process
        exits: child.tidy).

        ``runtime``: the resolved ``evaluations.runtime.Runtime``, handed to every evaluation.
        ``spare``: keep a process ready for the next id while there is room (``keep_spare``); then
        each process may run up to ``reuses`` evaluations, one after another (see the module notes).
        """
        self.capacity = capacity
        self.runtime = runtime
        self.context = multiprocessing.get_context("forkserver")
        start_forkserver()
        if target is None:
            from evaluations.worker.child import leave, ready, tidy
            from evaluations.worker.child import main as target
        self.target = target
        self.ready = ready
        self.leave = leave
        self.tidy = tidy
        self.reuses = reuses if spare else 1
        self.running: dict[str, Running] = {}
        self.keeps_spare = spare
        self.spares: list[Spare] = []  # at most one warm (first) and one fresh

    @property
    def free(self) -> int:
        return self.capacity - len(self.running)

    def start(self, eval_id, note: str = "") -> None:
        """Run ``target`` for ``eval_id``: in the spare if a live one waits, else in a process forked
        now. ``note``: text given to ``target`` beside the id (``note=``; the claim's transition)."""
        eval_id = str(eval_id)
        if self._hand_to_spare(eval_id, note):
            return
        if not self.keeps_spare:
            kwargs = {"note": note} if note else {}
            process, alive_w = self._fork(self.target, (eval_id,), f"eval-{eval_id}", kwargs)
            self.running[eval_id] = Running(eval_id, process, alive_w, _pidfd(process))
            return
        spare = self._fork_spare(f"eval-{eval_id}", waiting=False)  # a spare's life, its id at once: kept after
        try:
            spare.handoff.send_bytes(_handoff(eval_id, note))
        except BaseException:
            self._end(spare)
            raise
        self.running[eval_id] = Running(eval_id, spare.process, spare.handoff, spare.pidfd, report=spare.report)

    def _fork(self, target, args: tuple, name: str, kwargs=None) -> tuple[multiprocessing.Process, Connection]:
        """A process running ``target(*args, runtime, read end, **kwargs)``; return it and the pipe's write end."""
        alive_r, alive_w = self.context.Pipe(duplex=False)
        try:
            process = self.context.Process(
                target=target, args=(*args, self.runtime, alive_r), kwargs=kwargs or {}, name=name, daemon=False
            )
            process.start()  # the forkserver hands the child its own copy of the read end
        except BaseException:
            alive_w.close()
            raise
        finally:
            alive_r.close()
        return process, alive_w

    @property
    def spare(self) -> Spare | None:
        """The spare the next id goes to: a warm one, else the fresh one."""
        return self.spares[0] if self.spares else None

    def keep_spare(self) -> None:
        """Fork a spare if this pool keeps one, has none and has room for one more evaluation."""
        if self.keeps_spare and not self.spares and self.free > 0:
            self.spares.append(self._fork_spare("spare", waiting=True))

    def _fork_spare(self, name: str, *, waiting: bool) -> Spare:
        """A process living ``wait_for_id``: ready, then waiting for an id on its liveness pipe
        (``waiting``: named a spare meanwhile; not one sent its id at once)."""
        report_r, report_w = self.context.Pipe(duplex=False)
        try:
            args = (self.target, self.ready, self.leave, self.tidy, report_w, self.reuses, waiting)
            process, handoff = self._fork(target=wait_for_id, args=args, name=name)
        except BaseException:
            report_r.close()
            raise
        finally:
            report_w.close()
        return Spare(process, handoff, _pidfd(process), report_r)

    def _hand_to_spare(self, eval_id: str, note: str) -> bool:
        """Give ``eval_id`` (and ``note``) to a spare, the warm one first, which becomes its process;
        False if no live spare took it."""
        while self.spares:
            spare = self.spares.pop(0)
            if not _has_exited(spare.pidfd):
                try:
                    spare.handoff.send_bytes(_handoff(eval_id, note))
                except OSError:  # it died meanwhile (EPIPE): its end is closed, nothing was read
                    pass
                else:
                    spare.process.name = f"eval-{eval_id}"
                    self.running[eval_id] = Running(
                        eval_id, spare.process, spare.handoff, spare.pidfd, report=spare.report
                    )
                    return True
            _died(spare)
        return False

    def end_spare(self) -> None:
        """End the spares, if any: the end of its pipe tells each to exit (it waits for an id); wait for them."""
        spares, self.spares = self.spares, []
        for spare in spares:
            self._end(spare)

    @staticmethod
    def _end(spare: Spare) -> None:
        spare.handoff.close()
        if not select.select([spare.pidfd], [], [], SPARE_EXIT_SECS)[0]:
            spare.process.kill()
            select.select([spare.pidfd], [], [])
        _collect(spare)

    def sentinels(self) -> list[int]:
        """What to wait on: each process's pidfd (the spare's too: a dead spare is replaced). Not
        multiprocessing's sentinel, which is the forkserver's report and ends (as "exit code 255")
        when the forkserver dies, though the evaluation process, adopted by us (a subreaper), runs on."""
        pidfds = [entry.pidfd for entry in self.running.values()]
        reports = [entry.report for entry in self.running.values() if entry.report is not None]
        return pidfds + reports + [spare.pidfd for spare in self.spares]

    def reap(self) -> list[tuple[str, int]]:
        """Remove finished children, and a spare that died; return [(eval_id, exitcode)] of the children.
        A process that ended its evaluation and waits for another counts as exit code 0 and becomes
        a spare (``_kept``)."""
        for spare in [spare for spare in self.spares if _has_exited(spare.pidfd)]:
            self.spares.remove(spare)
            _died(spare)
        finished = []
        for eval_id, entry in list(self.running.items()):
            if _ended_its_evaluation(entry):
                del self.running[eval_id]
                finished.append((eval_id, 0))
                self._kept(Spare(entry.process, entry.alive, entry.pidfd, entry.report, warm=True))
            elif _has_exited(entry.pidfd):
                finished.append((eval_id, _exit_code(entry.process)))
                os.close(entry.pidfd)
                entry.alive.close()
                if entry.report is not None:
                    entry.report.close()
                del self.running[eval_id]
        return finished

    def _kept(self, spare: Spare) -> None:
        """A process that ran an evaluation is the warm spare, first in line (it runs its next
        evaluation faster than a fresh one would); beside a warm spare already, it is let go."""
        if any(waiting.warm for waiting in self.spares):
            self._end(spare)
            return
        spare.process.name = "spare"
        self.spares.insert(0, spare)

    def kill_all(self) -> None:
        for entry in self.running.values():
            if entry.process.is_alive():
                entry.process.kill()


def wait_for_id(
    target, ready, leave, tidy, report: Connection, reuses: int, named: bool, runtime, channel: Connection
) -> None:
    """A spare's life: ``ready()`` (its own database connection: child.ready), then block until the
    worker hands it an id, then be that id's process (``target``, the same channel as its liveness
    pipe); the end of the pipe first means exit, nothing read or written. Then, up to ``reuses``
    evaluations in all, while each left the process as it was before ``ready`` (``ProcessState``,
    read after ``leave``): the ended id on ``report``, ``tidy()`` and ``ready()`` again (while the
    worker claims the next id, which waits in the pipe), and wait for the next.
    ``tidy(wait=True)`` and ``leave()`` before it exits, however.

    It is named SPARE_NAME (``ps``) while it waits (``named``: a process forked with its id is not
    a spare yet), and takes back its inherited name with the id, so that its evaluation looks as
    one forked for it does."""
    with open("/proc/self/comm") as comm:
        inherited = comm.read().rstrip("\n")
    if named:
        name_process(SPARE_NAME)
    try:
        found = ProcessState.now(channel, report) if reuses > 1 else None
        if ready is not None:
            ready()
        for ran in range(1, reuses + 1):
            try:
                eval_id, _, note = channel.recv_bytes().decode().partition("\n")
            except EOFError:
                return
            name_process(inherited)
            target(eval_id, runtime, channel, **({"note": note} if note else {}))
            if ran == reuses or found is None:
                return
            if leave is not None:
                leave()  # its connections closed (and what SQLite keeps open for them), to be opened again
            changed = found.changed()
            if changed:
                logger.info("the evaluation process is not kept for another evaluation: %s", changed)
                return
            name_process(SPARE_NAME)
            try:
                report.send_bytes(eval_id.encode())  # first: the worker claims the next id meanwhile
            except OSError:  # the worker is gone: its pipe's end comes next
                return
            if tidy is not None:
                tidy()
            if ready is not None:
                ready()
    finally:
        if tidy is not None:
            tidy(wait=True)
        if leave is not None:
            leave()


class ProcessState:
    """What an evaluation process must be again after an evaluation to run another (``wait_for_id``):
    as it was before its first (its connections closed both times). An evaluation's threads (its watchers, drains, a monitor) are given
    THREADS_END_SECS to end; anything else left or changed, or more than REUSE_MAX_PRIVATE_BYTES of
    memory of its own, and the process exits rather than carry it into the next evaluation."""

    def __init__(self, pipes: tuple[int, ...]):
        self.pipes = pipes
        self.threads = set(threading.enumerate())
        self.state = self._read()

    @classmethod
    def now(cls, *pipes: Connection) -> ProcessState:
        return cls(tuple(pipe.fileno() for pipe in pipes))

    def _read(self) -> dict:
        umask = os.umask(0o077)
        os.umask(umask)
        with open("/proc/self/cgroup") as cgroups:
            cgroup = cgroups.read()
        return {
            "descriptors": sorted(set(map(int, os.listdir("/proc/self/fd"))) - {*self.pipes, *kept_descriptors()}),
            "working folder": os.getcwd(),
            "environment": dict(os.environ),
            "umask": umask,
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
            "limits": {name: resource.getrlimit(getattr(resource, name)) for name in _RLIMITS},
            "signal handlers": {signum: signal.getsignal(signum) for signum in signal.valid_signals()},
            "ids": (os.getresuid(), os.getresgid(), os.getgroups()),
            "cgroups": cgroup,
            "mount namespace": os.readlink("/proc/self/ns/mnt"),
        }

    def changed(self) -> str:
        """What differs from the ready process ("" when nothing): names only, never values."""
        deadline = time.monotonic() + THREADS_END_SECS
        for thread in set(threading.enumerate()) - self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = [thread.name for thread in set(threading.enumerate()) - self.threads]
        if left:
            return f"threads still running: {', '.join(sorted(left))}"
        killer.reap_orphans()
        children = killer.own_children()
        if children is None or children:
            return "child processes left" if children else "its children cannot be listed"
        now = self._read()
        differing = [name for name, value in self.state.items() if now[name] != value]
        if "descriptors" in differing:
            differing[differing.index("descriptors")] = _descriptors_changed(
                self.state["descriptors"], now["descriptors"]
            )
        if differing:
            return f"changed: {', '.join(differing)}"
        private = _private_bytes()
        if private > REUSE_MAX_PRIVATE_BYTES:
            return f"{private >> 20} MiB of memory of its own"
        return ""


_RLIMITS = sorted(name for name in dir(resource) if name.startswith("RLIMIT_") and name != "RLIMIT_NLIMITS")


def _descriptors_changed(before: list[int], after: list[int]) -> str:
    """What the descriptors' change was: how many closed, and the kinds of those opened, never a path."""
    opened = sorted(set(after) - set(before))
    kinds = []
    for fd in opened:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kinds.append(target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "a file")
    return f"descriptors ({len(set(before) - set(after))} closed, {len(opened)} opened: {', '.join(kinds)})"


def _private_bytes() -> int:
    """The process's own memory (USS: Private_Clean + Private_Dirty of smaps_rollup)."""
    total = 0
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def _handoff(eval_id: str, note: str) -> bytes:
    """What a spare reads (``wait_for_id``): the id, then the note on a line of its own if any."""
    return f"{eval_id}\n{note}".encode() if note else eval_id.encode()


def _ended_its_evaluation(entry: Running) -> bool:
    """Whether ``entry``'s process reported its evaluation's end (and waits for another id)."""
    if entry.report is None or not entry.report.poll():
        return False
    try:
        ended = entry.report.recv_bytes().decode()
    except (EOFError, OSError):  # it exits (its pidfd will say): nothing more to wait for here
        entry.report.close()
        entry.report = None
        return False
    return ended == entry.eval_id and not _has_exited(entry.pidfd)


def _pidfd(process) -> int:
    """A descriptor that is readable once ``process`` has exited: its pidfd; or, when it is gone
    already (our processes are the forkserver's children, which reaps one that ended at once before
    we ask: ESRCH), one readable now (a pipe whose write end is closed). Its exit code is then the
    forkserver's report (``_exit_code``), as for any other."""
    try:
        return os.pidfd_open(process.pid)
    except ProcessLookupError:
        read, write = os.pipe2(os.O_CLOEXEC)
        os.close(write)
        return read


def _has_exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def _collect(spare: Spare) -> int | None:
    """Let go of a spare that exited (or is about to, its pipe closed): its descriptors; return its exit code."""
    spare.handoff.close()
    if spare.report is not None:
        spare.report.close()
    exitcode = _exit_code(spare.process)
    os.close(spare.pidfd)
    return exitcode


def _died(spare: Spare) -> None:
    """A spare that died before its id (killed, out of memory): let go of it; keep_spare forks another."""
    logger.warning("the spare evaluation process died (%s); another replaces it", describe_exit(_collect(spare)))


def _exit_code(process: multiprocessing.Process) -> int | None:
    """The status of an exited evaluation process: ours to collect if we adopted it (its forkserver
    died first), else the forkserver's report."""
    try:
        pid, status = os.waitpid(process.pid, os.WNOHANG)
    except ChildProcessError:
        pid = 0
    if pid:
        return os.waitstatus_to_exitcode(status)
    process.join()
    return process.exitcode


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def start_forkserver() -> None:
    """Fork multiprocessing's forkserver from this process, once, instead of letting it start a new
    interpreter: the forkserver and every evaluation it forks share this process's Django and pipeline.

    Call it while this process has no other thread (a fork copies only the calling one, so a lock
    another thread held would stay held in the forkserver) and before anything is claimed.
    """
    from multiprocessing import connection, forkserver, resource_tracker

    from django.db import connections
    from django.db.models.sql import compiler  # noqa: F401  (every process's first query imports it: shared)

    from evaluations.worker import child  # noqa: F401  (Django and the pipeline, imported once, shared)

    server = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            return
        if threading.active_count() != 1:
            raise RuntimeError(f"start_forkserver: {threading.active_count()} threads; it must fork a lone thread")
        _without_resource_tracker(resource_tracker._resource_tracker)
        connections.close_all()  # no connection may be shared: each evaluation process opens its own
        gc.collect()
        gc.freeze()  # a later collection in any of the forks would write to, and so copy, every page it visits
        worker = os.getpid()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            # Every client holds the write end; the forkserver exits when the last one closes it.
            alive_r, alive_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the forkserver: it never returns from here
                code = 1
                try:
                    os.close(alive_w)
                    _become_forkserver(worker)
                    forkserver.main(listener.fileno(), alive_r, [])
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 0
                finally:
                    os._exit(code)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid


def _become_forkserver(worker: int) -> None:
    """The forkserver would outlive a worker killed with SIGKILL (reparented to init), so it asks
    the kernel to kill it when the worker dies. Evaluation processes learn of the worker's death
    from their liveness pipe (child.py), not from the forkserver's."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != worker:  # the worker died before the prctl took effect
        os._exit(1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)  # none of the worker's handlers: the worker stops it
    name_process("te-forkserver")


def _without_resource_tracker(tracker) -> None:
    """Let multiprocessing believe its resource tracker runs, without one.

    The tracker unlinks named semaphores and shared memory a crashed process left; the pool
    makes neither (cancels are pipes). But the forkserver protocol hands every new process the
    tracker's pipe, and asking for it starts the tracker (a whole interpreter) unless one
    answers: /dev/null answers every write, so nothing starts and nothing is tracked.
    """
    with tracker._lock:
        if tracker._fd is None:
            tracker._fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            tracker._pid = None
