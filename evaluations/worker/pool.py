"""One process per evaluation, at most `capacity` at once.

A ProcessPoolExecutor breaks as a whole when one child dies; here each
evaluation has its own multiprocessing.Process, the worker waits on their
sentinels, and a child that dies only fails its own evaluation.

The processes come from multiprocessing's forkserver, but that forkserver is
a fork of the worker (``start_forkserver``), not the fresh interpreter
multiprocessing would start and import Django into a second time: the worker
imports the pipeline once, freezes its heap (``gc.freeze``) and forks, so the
worker, its forkserver and every evaluation process share those pages
(bench/RESULTS.md: the forkserver's private memory 38 -> ~2 MB).

A cancel reaches an evaluation process as one byte on a pipe of its own, not
as a ``multiprocessing.Event``: an Event is five named semaphores, and named
semaphores need multiprocessing's resource tracker, one more process, to
unlink them after a crash. A pipe needs nothing and vanishes with its
holders, so the pool runs without a resource tracker.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from executor_project.process import name_process

_PR_SET_PDEATHSIG = 1
CANCEL_BYTE = b"c"  # written once on an evaluation's cancel pipe (child.py reads it)


@dataclass
class Running:
    eval_id: str
    process: multiprocessing.Process
    cancel: Connection  # the write end of the evaluation process's cancel pipe
    started: float = field(default_factory=time.monotonic)
    cancel_sent: bool = False


class Pool:
    def __init__(self, capacity: int, sandbox: str, target=None):
        """``target(eval_id, sandbox, cancel_channel)`` runs in each process: child.main unless a test says."""
        self.capacity = capacity
        self.sandbox = sandbox
        self.context = multiprocessing.get_context("forkserver")
        start_forkserver()
        if target is None:
            from evaluations.worker.child import main as target
        self.target = target
        self.running: dict[str, Running] = {}

    @property
    def free(self) -> int:
        return self.capacity - len(self.running)

    def start(self, eval_id) -> None:
        eval_id = str(eval_id)
        cancel_r, cancel_w = self.context.Pipe(duplex=False)
        try:
            process = self.context.Process(
                target=self.target, args=(eval_id, self.sandbox, cancel_r), name=f"eval-{eval_id}", daemon=False
            )
            process.start()  # the forkserver hands the child its own copy of the read end
        except BaseException:
            cancel_w.close()
            raise
        finally:
            cancel_r.close()
        self.running[eval_id] = Running(eval_id, process, cancel_w)

    def cancel(self, eval_id: str) -> None:
        entry = self.running.get(eval_id)
        if entry is not None and not entry.cancel_sent:
            entry.cancel_sent = True
            try:
                os.write(entry.cancel.fileno(), CANCEL_BYTE)
            except OSError:
                pass  # it has exited (EPIPE): reap() reports it

    def sentinels(self) -> list[int]:
        return [entry.process.sentinel for entry in self.running.values()]

    def reap(self) -> list[tuple[str, int]]:
        """Remove finished children; return [(eval_id, exitcode)]."""
        finished = []
        for eval_id, entry in list(self.running.items()):
            if not entry.process.is_alive():
                entry.process.join()
                entry.cancel.close()
                finished.append((eval_id, entry.process.exitcode))
                del self.running[eval_id]
        return finished

    def kill_all(self) -> None:
        for entry in self.running.values():
            if entry.process.is_alive():
                entry.process.kill()


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
    """The forkserver outlives a worker killed with SIGKILL (it is reparented to init), and with it
    every evaluation process. So it asks the kernel to kill it when the worker dies; each evaluation
    process in turn learns of the forkserver's death through its own PR_SET_PDEATHSIG (child.py)."""
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
