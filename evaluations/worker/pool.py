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
"""

from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import os
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from executor_project.process import name_process

logger = logging.getLogger("term_executor.worker")

_PR_SET_PDEATHSIG = 1
SPARE_NAME = "te-spare"
SPARE_EXIT_SECS = 5.0  # a spare told to go exits at once; past this it is killed


@dataclass
class Spare:
    process: multiprocessing.Process
    handoff: Connection  # the write end of its pipe: the id goes there, then it is the liveness pipe
    pidfd: int


@dataclass
class Running:
    eval_id: str
    process: multiprocessing.Process
    alive: Connection  # the write end of the evaluation process's liveness pipe: held, never written
    pidfd: int = -1  # readable once the process has exited, whoever its parent is by then
    started: float = field(default_factory=time.monotonic)


class Pool:
    def __init__(self, capacity: int, runtime, target=None, *, spare: bool = False, ready=None):
        """``target(eval_id, runtime, alive_channel)`` runs in each process: child.main unless a test says.
        ``ready()``: what a spare does before it waits for its id (child.ready with child.main).

        ``runtime``: the resolved ``evaluations.runtime.Runtime``, handed to every evaluation.
        ``spare``: keep a process ready for the next id while there is room (``keep_spare``).
        """
        self.capacity = capacity
        self.runtime = runtime
        self.context = multiprocessing.get_context("forkserver")
        start_forkserver()
        if target is None:
            from evaluations.worker.child import main as target
            from evaluations.worker.child import ready
        self.target = target
        self.ready = ready
        self.running: dict[str, Running] = {}
        self.keeps_spare = spare
        self.spare: Spare | None = None

    @property
    def free(self) -> int:
        return self.capacity - len(self.running)

    def start(self, eval_id) -> None:
        """Run ``target`` for ``eval_id``: in the spare if a live one waits, else in a process forked now."""
        eval_id = str(eval_id)
        if self._hand_to_spare(eval_id):
            return
        process, alive_w = self._fork(target=self.target, args=(eval_id,), name=f"eval-{eval_id}")
        self.running[eval_id] = Running(eval_id, process, alive_w, os.pidfd_open(process.pid))

    def _fork(self, target, args: tuple, name: str) -> tuple[multiprocessing.Process, Connection]:
        """A process running ``target(*args, runtime, read end)``; return it and the pipe's write end."""
        alive_r, alive_w = self.context.Pipe(duplex=False)
        try:
            process = self.context.Process(target=target, args=(*args, self.runtime, alive_r), name=name, daemon=False)
            process.start()  # the forkserver hands the child its own copy of the read end
        except BaseException:
            alive_w.close()
            raise
        finally:
            alive_r.close()
        return process, alive_w

    def keep_spare(self) -> None:
        """Fork the spare if this pool keeps one, has none and has room for one more evaluation."""
        if self.keeps_spare and self.spare is None and self.free > 0:
            process, handoff = self._fork(target=wait_for_id, args=(self.target, self.ready), name="spare")
            self.spare = Spare(process, handoff, os.pidfd_open(process.pid))

    def _hand_to_spare(self, eval_id: str) -> bool:
        """Give ``eval_id`` to the spare, which becomes its process; False if no live spare took it."""
        spare, self.spare = self.spare, None
        if spare is None:
            return False
        if not _has_exited(spare.pidfd):
            try:
                spare.handoff.send_bytes(eval_id.encode())
            except OSError:  # it died meanwhile (EPIPE): its end is closed, nothing was read
                pass
            else:
                spare.process.name = f"eval-{eval_id}"
                self.running[eval_id] = Running(eval_id, spare.process, spare.handoff, spare.pidfd)
                return True
        _died(spare)
        return False

    def end_spare(self) -> None:
        """End the spare, if any: the end of its pipe tells it to exit (it ran nothing); wait for it."""
        spare, self.spare = self.spare, None
        if spare is None:
            return
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
        return pidfds + [self.spare.pidfd] if self.spare is not None else pidfds

    def reap(self) -> list[tuple[str, int]]:
        """Remove finished children, and a spare that died; return [(eval_id, exitcode)] of the children."""
        if self.spare is not None and _has_exited(self.spare.pidfd):
            spare, self.spare = self.spare, None
            _died(spare)
        finished = []
        for eval_id, entry in list(self.running.items()):
            if _has_exited(entry.pidfd):
                finished.append((eval_id, _exit_code(entry.process)))
                os.close(entry.pidfd)
                entry.alive.close()
                del self.running[eval_id]
        return finished

    def kill_all(self) -> None:
        for entry in self.running.values():
            if entry.process.is_alive():
                entry.process.kill()


def wait_for_id(target, ready, runtime, channel: Connection) -> None:
    """A spare's life: ``ready()`` (its own database connection: child.ready), then block until the
    worker hands it an id, then be that id's process (``target``, the same channel as its liveness
    pipe); the end of the pipe first means exit, nothing read or written.

    It is named SPARE_NAME (``ps``) while it waits, and takes back its inherited name with the id,
    so that its evaluation looks as one forked for it does."""
    with open("/proc/self/comm") as comm:
        inherited = comm.read().rstrip("\n")
    name_process(SPARE_NAME)
    if ready is not None:
        ready()
    try:
        eval_id = channel.recv_bytes().decode()
    except EOFError:
        return
    name_process(inherited)
    target(eval_id, runtime, channel)


def _has_exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def _collect(spare: Spare) -> int | None:
    """Let go of a spare that exited (or is about to, its pipe closed): its descriptors; return its exit code."""
    spare.handoff.close()
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
