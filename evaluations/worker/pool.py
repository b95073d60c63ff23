"""One process per evaluation, at most `capacity` at once.

A ProcessPoolExecutor breaks as a whole when one child dies; here each
evaluation has its own multiprocessing.Process, the worker waits on their
sentinels, and a child that dies only fails its own evaluation.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from dataclasses import dataclass, field


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
        # The forkserver imports Django and the pipeline once; each evaluation forks from it.
        self.context.set_forkserver_preload(["evaluations.worker.forkserver_preload"])
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
