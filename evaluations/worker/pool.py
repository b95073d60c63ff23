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

from executor_project.process import name_process

_PR_SET_PDEATHSIG = 1


@dataclass
class Running:
    eval_id: str
    process: multiprocessing.Process
    cancel_event: object
    started: float = field(default_factory=time.monotonic)
    cancel_sent: bool = False


class Pool:
    def __init__(self, capacity: int, sandbox: str):
        self.capacity = capacity
        self.sandbox = sandbox
        self.context = multiprocessing.get_context("forkserver")
        start_forkserver()
        self.running: dict[str, Running] = {}

    @property
    def free(self) -> int:
        return self.capacity - len(self.running)

    def start(self, eval_id) -> None:
        from evaluations.worker.child import main

        eval_id = str(eval_id)
        cancel_event = self.context.Event()
        process = self.context.Process(
            target=main, args=(eval_id, self.sandbox, cancel_event), name=f"eval-{eval_id}", daemon=False
        )
        process.start()
        self.running[eval_id] = Running(eval_id, process, cancel_event)

    def cancel(self, eval_id: str) -> None:
        entry = self.running.get(eval_id)
        if entry is not None and not entry.cancel_sent:
            entry.cancel_event.set()
            entry.cancel_sent = True

    def sentinels(self) -> list[int]:
        return [entry.process.sentinel for entry in self.running.values()]

    def reap(self) -> list[tuple[str, int]]:
        """Remove finished children; return [(eval_id, exitcode)]."""
        finished = []
        for eval_id, entry in list(self.running.items()):
            if not entry.process.is_alive():
                entry.process.join()
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
        _fork_resource_tracker(resource_tracker._resource_tracker)  # first: the forkserver's children share it
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


def _fork_resource_tracker(tracker) -> None:
    """multiprocessing's resource tracker (it unlinks the semaphores of evaluation processes that
    died), forked like the forkserver rather than started as one more interpreter (6 MB)."""
    with tracker._lock:
        if tracker._fd is not None:
            return
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(write_end)
                name_process("te-restracker")
                from multiprocessing import resource_tracker

                resource_tracker.main(read_end)  # until every holder of write_end has closed it
                code = 0
            finally:
                os._exit(code)
        os.close(read_end)
        tracker._fd = write_end
        tracker._pid = pid
