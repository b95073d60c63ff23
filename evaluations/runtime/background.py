"""A process that runs beside the evaluation's commands (``Spawner.background``): an environment's
first process (its entrypoint, SPEC §23), as a container's main process runs beside ``docker exec``.

1. Started as a command is (the same policy, uid, rlimits, cgroup and tag), in a sandbox of its own,
   but nobody waits for it: a thread reads its output into a bounded capture (head and tail, as a
   command's), so it never blocks on a full pipe, and collects its exit status.
2. It counts against the evaluation's limits through the evaluation's cgroup (memory, processes),
   as every process of the evaluation does; a command's verdict kills it with the rest.
3. ``Spawner.sweep`` (after the agent, before the tests) leaves it and its subtree alone: it is the
   environment's, not a leftover of a command. ``stop`` (the evaluation's end, ``Spawner.close``)
   kills its whole sandbox and waits until its pid namespace is gone: nothing of it outlives the
   evaluation.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading

from evaluations.runtime import killer
from evaluations.runtime.output import OutputCapture, pump


class Background:
    """One process started by ``Spawner.background``; its sandbox's pid 1 when the runtime has one."""

    def __init__(
        self,
        name: str,
        proc: subprocess.Popen,
        capture: OutputCapture,
        closing: contextlib.ExitStack,
        sandbox_init: int | None,
    ):
        self.name = name
        self.proc = proc
        self.capture = capture
        self.sandbox_init = sandbox_init
        self._closing = closing
        self._stopped = False
        self._reader = threading.Thread(target=self._read, name=f"background-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            pump(self.proc, self.capture, None)
            self.capture.end_log()
        finally:
            self.proc.wait()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """Its exit status once it ended by itself (128 + N for signal N), else None."""
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)

    def output(self) -> str:
        """What it printed so far (stdout and stderr in one, head and tail past the output cap)."""
        return self.capture.text()

    def pids(self, table: list[killer.Proc] | None = None) -> set[int]:
        """Its processes now (host pids): the process started and every descendant, its sandbox's
        included (nothing leaves a pid namespace)."""
        if self.proc.poll() is not None and self.sandbox_init is None:
            return set()
        return {self.proc.pid, *killer.subtree(self.proc.pid, table)}

    def stop(self) -> bool:
        """Kill it and everything it started; True when its sandbox was seen to end (idempotent)."""
        if self._stopped:
            return True
        self._stopped = True
        killer.kill_until_none(
            lambda: [proc for proc in killer.processes() if proc.pid in self.pids() and not proc.zombie],
            f"background process {self.name} (pid {self.proc.pid})",
        )
        self._reader.join()
        killer.release(self.proc.pid)
        gone = self.sandbox_init is None or killer.await_exit(self.sandbox_init)
        killer.reap_orphans()
        self._closing.close()
        return gone
