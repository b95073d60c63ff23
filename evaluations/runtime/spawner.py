"""The one place that starts processes.

Every command of every pipeline step goes through ``Spawner.run``, so limits,
output capture, sandboxing and killing are written once:

1. The runtime (``sandbox.py``) turns the argv into what is really started.
2. ``setpriv`` becomes the unprivileged uid (real, effective and saved uid
   and gid, no supplementary groups) when we are root, ``prlimit`` sets
   RLIMIT_FSIZE (= the disk quota), RLIMIT_NPROC and no core files; each
   execs the next program, so they cost execs, not processes, and need no
   ``preexec_fn`` (unsafe with threads). Switching uid in the exec chain
   rather than with Popen's ``user=`` lets Popen use vfork instead of copying
   this process's page tables (CPython forks whenever it must change uid
   itself). Commands run at nice 10: a child inherits the niceness of the
   thread that starts it, so as root the starting thread lowers itself for
   the moment of the Popen (``_niced``) instead of paying one more exec
   (``nice``, ~1 ms) per command; without root, which could not raise it
   back, ``nice -n 10`` stays in the chain.
3. Popen starts it in a new session (its own process group), with exactly
   the caller's environment plus the tag ``TERM_EXECUTOR_EVAL=<eval_id>``.
4. ``output.pump`` reads the merged output as it comes; a ``Monitor`` thread
   enforces time, memory, processes, disk and cancel, and kills everything of
   the evaluation the moment one is crossed.

The host process must be the evaluation's own (one per evaluation): the
spawner makes it a child subreaper and treats all its children as commands.

RLIMIT_NPROC counts every process of the uid on the machine. With a uid of
the evaluation's own (``exclusive_uid``, see ``uids.py``) those are exactly
the evaluation's processes, so it is ``max_processes`` plus a small margin:
the kernel stops a fork bomb between two samples, and the margin lets the
monitor see the excess and name it. A shared uid (the service not running
as root) gets twice ``max_processes``, a looser backstop. With its own uid,
a kill also takes every process of that uid, and (without the sandbox) the
disk quota also counts what the uid left in the host's shared temporary
folders, the memory limit its SysV shared memory.

Exit codes: a command killed by signal N reports 128 + N (the shell's and
bwrap's convention), so both runtimes agree. ``exit_code`` is None when we
killed the command.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evaluations.runtime import killer, sysvipc, uids
from evaluations.runtime.monitor import CancelEvent, Monitor, Verdict
from evaluations.runtime.output import OutputCapture, pump

if TYPE_CHECKING:
    from evaluations.runtime.sandbox import Launch, Runtime

log = logging.getLogger(__name__)

_NPROC_HEADROOM = 2  # shared uid: twice the limit
_NPROC_MARGIN = 16  # own uid: the limit plus this
_UNREPORTED = object()  # a sandbox that did not report its pid 1
COMMAND_NICENESS = 10  # below the service and the other evaluations' bookkeeping
_NICE_BY_THREAD = os.geteuid() == 0
_SYSTEM_BIN = "/usr/bin:/bin:/usr/sbin:/sbin"


@dataclass(frozen=True)
class Limits:
    timeout_secs: float
    memory_bytes: int  # RSS summed over the whole process tree
    disk_quota_bytes: int  # blocks allocated under the session folder (see monitor.folder_usage)
    max_processes: int
    max_output_bytes: int
    monitor_interval_ms: int = 100


@dataclass(frozen=True)
class Mount:
    """An extra bind under the sandbox, e.g. an asset at /static/<save_path>."""

    source: Path
    target: str
    writable: bool = False


@dataclass
class CommandResult:
    exit_code: int | None  # None if we killed it; 128 + N if signal N ended it
    output: str  # merged stdout+stderr, head + marker + tail, invalid UTF-8 replaced
    output_bytes: int  # everything the command printed
    duration_ms: int
    timed_out: bool
    limit: str | None  # None | "timeout" | "memory" | "disk" | "processes" | "cancelled"
    limit_detail: str | None  # e.g. "memory limit exceeded (4213 MiB > 4096 MiB)"
    peak_memory_bytes: int = 0
    peak_processes: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None


class Spawner:
    def __init__(
        self,
        *,
        eval_id: str,
        session_dir: Path,
        runtime: Runtime,
        uid: int | None,
        live_log: Path | None = None,
        cancel_event: CancelEvent | None = None,
        exclusive_uid: bool = False,
    ):
        if not eval_id:
            raise ValueError("eval_id must not be empty: it is the tag every process carries")
        if os.geteuid() == 0 and not uid:
            raise ValueError("running as root: commands need an unprivileged uid (SANDBOX_UID)")
        self.eval_id = eval_id
        self.session_dir = Path(session_dir)
        self.runtime = runtime
        self.uid = uid
        self.live_log = live_log
        self.cancel_event = cancel_event
        # True only for a uid leased from the pool (uids.py): no other process may run as it.
        self.exclusive_uid = exclusive_uid and uid is not None
        # True while every command has run in a sandbox seen to end with all its processes.
        self._all_confirmed_gone = runtime.contains_processes
        self._sandbox_init: int | object | None = None  # the running command's sandbox pid 1
        killer.become_subreaper()
        for tool in ("prlimit", "setpriv", *(() if _NICE_BY_THREAD else ("nice",))):
            _tool(tool)  # fail now, not at the first command

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: dict[str, str],
        limits: Limits,
        network: bool = False,
        writable: Sequence[Path] = (),
        mounts: Sequence[Mount] = (),
        stdin_data: bytes | None = None,
    ) -> CommandResult:
        """Run one command to its end or its kill; nothing of a killed command outlives this."""
        if self.cancel_event is not None and self.cancel_event.is_set():
            return CommandResult(None, "", 0, 0, False, "cancelled", "cancelled")
        launch = self.runtime.launch(
            argv,
            session_dir=self.session_dir,
            cwd=Path(cwd),
            env={**env, killer.TAG_VAR: self.eval_id},
            network=network,
            writable=writable,
            mounts=mounts,
        )
        with contextlib.ExitStack() as closing:
            closing.callback(launch.close)
            live_log = closing.enter_context(open(self.live_log, "ab", buffering=0)) if self.live_log else None
            capture = OutputCapture(limits.max_output_bytes, live_log)
            started = time.monotonic()
            proc = self._start([*self._limit_prefix(limits), *launch.argv], launch, stdin_data is not None)
            if launch.info is not None:
                launch.info.close_write_end()  # bwrap holds its own copy
            monitor = Monitor(
                limits=limits,
                session_dir=self.session_dir,
                cancel_event=self.cancel_event,
                started_at=started,
                on_verdict=lambda verdict: self._kill(proc, verdict),
                **self._outside_usage(),
            )
            self._sandbox_init = None
            monitor.start()
            sandbox_init = None
            try:
                sandbox_init = self._adopt_sandbox_init(launch)
                pump(proc, capture, stdin_data)
                proc.wait()
            finally:
                monitor.stop()
                if monitor.verdict is not None or proc.poll() is None:
                    killer.kill_all(self.eval_id, proc.pid, uid=self._own_uid)  # also after an exception
                    proc.wait()
                killer.release(proc.pid)
                self._confirm_gone(sandbox_init)
                killer.reap_orphans()
        verdict = monitor.verdict
        code = proc.returncode
        return CommandResult(
            exit_code=None if verdict else (128 - code if code < 0 else code),
            output=capture.text(),
            output_bytes=capture.total,
            duration_ms=int((time.monotonic() - started) * 1000),
            timed_out=verdict is not None and verdict.limit == "timeout",
            limit=verdict.limit if verdict else None,
            limit_detail=verdict.detail if verdict else None,
            peak_memory_bytes=monitor.peaks.memory_bytes,
            peak_processes=monitor.peaks.processes,
        )

    def _start(self, argv: list[str], launch: Launch, with_stdin: bool) -> subprocess.Popen:
        with killer.spawning() as awaiting, _niced():
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # one pipe: the kernel keeps the two streams in order
                cwd=launch.cwd,
                env=launch.env,
                start_new_session=True,
                close_fds=True,
                pass_fds=launch.pass_fds,
            )
            awaiting(proc.pid)
        log.debug("eval %s: pid %s started: %s", self.eval_id, proc.pid, argv)
        return proc

    def _adopt_sandbox_init(self, launch: Launch) -> int | None:
        """The sandbox's pid 1 (None without one), kept from any reap until ``_confirm_gone``."""
        pid = (
            launch.info.sandbox_init() if launch.info is not None else None
        )  # only a runtime that contains processes has one
        if pid is None:
            self._all_confirmed_gone = False  # nothing proves this command left nothing behind
            self._sandbox_init = _UNREPORTED
        else:
            killer.adopt(pid)
            self._sandbox_init = pid
        return pid

    def _sandbox_shm_bytes(self) -> int:
        """The monitor's look at the running command's SysV shared memory (see sysvipc)."""
        init = self._sandbox_init
        if init is None:
            return 0  # bwrap has not made the namespace yet
        if init is _UNREPORTED:
            return sysvipc.sandbox_shm_bytes()  # every sandbox of ours, found by a scan
        return sysvipc.namespace_shm_bytes(init)

    def _confirm_gone(self, sandbox_init: int | None) -> None:
        """Wait for the command's sandbox to be empty: its pid 1 ends only after the kernel has
        killed and reaped every other process of its pid namespace."""
        if sandbox_init is not None and not killer.await_exit(sandbox_init):
            log.warning("eval %s: sandbox pid %s still running; the next sweep scans", self.eval_id, sandbox_init)
            self._all_confirmed_gone = False

    def _kill(self, proc: subprocess.Popen, verdict: Verdict) -> None:
        log.info("eval %s: killing pid %s: %s", self.eval_id, proc.pid, verdict.detail)
        killer.kill_all(self.eval_id, proc.pid, uid=self._own_uid)

    @property
    def _own_uid(self) -> int | None:
        return self.uid if self.exclusive_uid else None

    def _outside_usage(self) -> dict:
        """What the monitor adds to the tree and the session folder (see the module notes)."""
        if self.runtime.isolated:
            # /tmp is <session>/tmp and /dev/shm a capped tmpfs, both of the sandbox; its
            # SysV shared memory lives in its own IPC namespace, read there.
            return {"extra_memory": self._sandbox_shm_bytes}
        uid = self._own_uid
        if uid is None:
            return {}  # a shared uid: what it owns is not this evaluation's alone
        return {"extra_disk": lambda: uids.owned_usage(uid), "extra_memory": lambda: sysvipc.owned_shm_bytes(uid)}

    def _limit_prefix(self, limits: Limits) -> list[str]:
        if self.exclusive_uid:
            nproc = limits.max_processes + _NPROC_MARGIN
        else:
            nproc = limits.max_processes * _NPROC_HEADROOM
        return _limit_prefix(limits, nproc, uid=self.uid, no_new_privs=not self.runtime.isolated)

    def scrub(self) -> None:
        """With its own uid: kill the uid's processes, remove its files in the host's shared
        temporary folders and its SysV IPC (uids.scrub). Nothing to do with a shared uid, nor
        when every command ran in a sandbox now confirmed empty: a sandboxed command cannot
        reach the host's temporary folders, and its IPC lives in the sandbox's namespace."""
        if self.exclusive_uid and not self._all_confirmed_gone:
            uids.scrub(self.uid)

    def sweep(self) -> int:
        """Kill every remaining process of this evaluation; return how many were killed.

        Without a scan when every command so far ran in a sandbox that was seen to end
        (``_confirm_gone``): none of their processes can remain, and every process of the
        evaluation is one of theirs. Any doubt (no sandbox, a sandbox that did not report
        its pid 1, or did not end in time) makes every later sweep scan /proc.
        """
        if self._all_confirmed_gone:
            return 0
        count = killer.kill_all(self.eval_id, uid=self._own_uid)
        if count:
            log.info("eval %s: swept %s leftover process(es)", self.eval_id, count)
        return count


def _limit_prefix(limits: Limits, nproc: int, *, uid: int | None = None, no_new_privs: bool = False) -> list[str]:
    prefix = []
    if uid is not None or no_new_privs:
        prefix.append(_tool("setpriv"))
        if uid is not None:
            prefix += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        if no_new_privs:
            # Without the sandbox: setuid/setgid/file-capability programs (su, crontab, at,
            # ping...) gain nothing, so the command cannot leave its uid or plant a cron job.
            # (bwrap sets no_new_privs itself, and a setuid bwrap must keep its bit.)
            prefix.append("--no-new-privs")
        prefix.append("--")
    prefix += [
        _tool("prlimit"),
        f"--fsize={limits.disk_quota_bytes}",  # one file cannot outgrow the whole quota
        f"--nproc={nproc}",  # kernel backstop against fork bombs (per uid, see above)
        "--core=0",  # no core dumps filling the session
        "--",
    ]
    if not _NICE_BY_THREAD:
        prefix += [_tool("nice"), "-n", str(COMMAND_NICENESS), "--"]
    return prefix


@contextlib.contextmanager
def _niced():
    """As root: this thread at COMMAND_NICENESS while it starts a command, which inherits it."""
    if not _NICE_BY_THREAD:
        yield
        return
    thread = threading.get_native_id()  # on Linux, niceness is per thread
    before = os.getpriority(os.PRIO_PROCESS, thread)
    os.setpriority(os.PRIO_PROCESS, thread, max(before, COMMAND_NICENESS))
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, thread, before)  # lowering it again takes CAP_SYS_NICE


@functools.cache
def _tool(name: str) -> str:
    path = shutil.which(name, path=_SYSTEM_BIN)
    if path is None:
        raise RuntimeError(f"{name} not found in {_SYSTEM_BIN}: install util-linux and coreutils")
    return path
