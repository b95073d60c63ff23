"""The one place that starts processes.

Every command of every pipeline step goes through ``Spawner.run``, so limits,
output capture, sandboxing and killing are written once:

1. The step says what the command needs in a ``SandboxPolicy`` (policy.py);
   the spawner adds what the evaluation fixes (uid, rlimits, niceness, the
   runtime's namespaces) and the runtime renders it into the real argv.
2. Popen starts it in a new session (its own process group), with exactly
   the caller's environment plus the tag ``TERM_EXECUTOR_EVAL=<eval_id>``.
3. ``output.pump`` reads the merged output as it comes; a ``Monitor`` thread
   enforces time, memory, processes, disk, files and cancel, and kills
   everything of the evaluation the moment one is crossed.
4. Every limit the spawner sets comes back as a ``Limit`` in the result: the
   kernel's RLIMIT_FSIZE kill (SIGXFSZ) is the disk limit, a kernel OOM kill
   in the evaluation's cgroup the memory limit, and a command that filled the
   disk (or made too many files) and exited between two of the monitor's
   walks is caught by one last walk.
5. Where the host offers cgroups (the runtime says), every command of the
   evaluation runs in one cgroup of its own: memory (swap 0) and processes
   are enforced by the kernel, kills go through it, and its figures are the
   evaluation's ``resources``. ``close`` removes it.
6. Within ``phase(name)`` (SPEC §25), a sandboxed command runs as an exec in
   the phase's sandbox for its policy (phase.py): one bubblewrap for the
   phase's commands instead of one each; limits, output, monitor, kills and
   results as above; what a command left in it is killed when it ends, and
   the phase's end ends the sandbox. The executor's own commands (``fresh_tmp``) keep a
   sandbox of their own unless the phase is theirs (``executor=True``: one job's commands, as
   the agent's patch, sharing one fresh /tmp); those handed descriptors, always.
   ``prestart(name, ...)`` starts a coming phase's sandbox in a thread while other work goes on
   (the patch's while the agent runs): ``phase(name)`` takes it, ready.

The host process must be the evaluation's own (one per evaluation): the
spawner makes it a child subreaper and treats all its children as commands.

RLIMIT_NPROC counts every process of the uid on the machine. With a uid of
the evaluation's own (``exclusive_uid``, see ``uids.py``) those are exactly
the evaluation's processes, so it is ``max_processes`` plus a small margin:
the kernel stops a fork bomb between two samples, and the margin lets the
monitor see the excess and name it. A shared uid (the service not running
as root) gets twice ``max_processes``, a looser backstop. With its own uid,
a kill also takes every process of that uid, and (without the sandbox) the
disk quota and the file count also count what the uid left in the host's
shared temporary folders, the memory limit its SysV shared memory.

Exit codes: a command killed by signal N reports 128 + N (the shell's and
bwrap's convention), so both runtimes agree. ``exit_code`` is None when we
killed the command.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import logging
import os
import resource
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from evaluations.runtime import cgroups, initbin, killer, sysvipc, uids
from evaluations.runtime.background import Background
from evaluations.runtime.initchannel import ExecStartError, InitChannel, InitGone
from evaluations.runtime.monitor import Monitor, Peaks, folder_usage
from evaluations.runtime.output import OutputCapture, pump, pump_fds
from evaluations.runtime.phase import PhaseKey, PhaseSandbox
from evaluations.runtime.policy import (
    COMMAND_NICENESS,
    NICE_BY_THREAD,
    RLimits,
    SandboxPolicy,
    cgroup_joins,
    without_joins,
)
from evaluations.runtime.sandbox import SYSTEM_PATH, fresh_tmp, prepare_mount_points, private_tmp, system_tool
from evaluations.runtime.types import MIB, CancelEvent, CommandResult, Limit, Limits, Verdict
from evaluations.safefs import TreeUsage, remove_tree_nofollow

if TYPE_CHECKING:
    from evaluations.runtime.sandbox import Launch, Runtime

log = logging.getLogger(__name__)

_NPROC_HEADROOM = 2  # shared uid: twice the limit
_NPROC_MARGIN = 16  # own uid: the limit plus this
_UNREPORTED = object()  # a sandbox that did not report its pid 1
_HELD_MAX_FDS = 16  # init.c's MAX_HELD_FDS: the descriptors a held launch takes
_HELD_EXIT_SECS = 5.0  # a held launcher's exit once told to end (a cgroup move it waits on, at most)
_FILE_TOO_LARGE = 128 + signal.SIGXFSZ  # the kernel's answer to a write past RLIMIT_FSIZE


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
        measured: tuple[Path, ...] = (),
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
        # Folders outside the session whose bytes and files count with it (an image build's
        # layers in the making, images/build.py), walked as the session folder is.
        self.measured = tuple(Path(path) for path in measured)
        # True only for a uid leased from the pool (uids.py): no other process may run as it.
        self.exclusive_uid = exclusive_uid and uid is not None
        # True while every command has run in a sandbox seen to end with all its processes.
        self._all_confirmed_gone = runtime.contains_processes
        self._sandbox_init: int | object | None = None  # the running command's sandbox pid 1
        self.cgroup: cgroups.EvalCgroup | None = None  # made by the first command (its limits)
        self._cgroup_ahead: _CgroupAhead | None = None  # the cgroup in the making (``make_cgroup_ahead``)
        self.peaks = Peaks()  # over every command: the evaluation's resources without a cgroup
        self._phase: str | None = None  # the open phase's name (``phase``)
        self._phase_base: Path | None = None  # where the init's folder is made (WORKSPACE_BASE)
        self._phase_sandboxes: dict[PhaseKey, PhaseSandbox] = {}
        self._phase_executor = False  # the open phase's executor commands share its sandboxes too
        self._prestarts: dict[str, _Prestart] = {}  # coming phases' sandboxes, starting (``prestart``)
        self._retired: list[PhaseSandbox] = []  # ended phases' sandboxes, told to end (``phase(retire=)``)
        self._backgrounds: list[Background] = []  # processes beside the commands (``background``)
        self._held: _HeldLaunch | None = None  # the next command's launcher, in the cgroups already
        self._cpu_before = _children_cpu_seconds()
        killer.become_subreaper()
        for tool in ("prlimit", "setpriv", *(() if NICE_BY_THREAD else ("nice",))):
            system_tool(tool)  # fail now, not at the first command

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: dict[str, str],
        limits: Limits,
        policy: SandboxPolicy | None = None,
        stdin_data: bytes | None = None,
        pass_fds: Sequence[int] = (),
        meanwhile: Callable[[], None] | None = None,
    ) -> CommandResult:
        """Run one command to its end or its kill; nothing of a killed command outlives this.

        ``pass_fds``: descriptors the command inherits (a live sandbox's init socket, SPEC §24).
        ``meanwhile``: the caller's work that overlaps the command (SPEC §25), called on this
        thread once the command has started, before its output is read (a large output waits in
        its pipe meanwhile); the command's limits hold throughout (the monitor runs), and if it
        raises, the command is killed as for any other error here."""
        if self.cancel_event is not None and self.cancel_event.is_set():
            return CommandResult(None, "", 0, 0, Limit.CANCELLED, "cancelled")
        self._ensure_cgroup(limits)
        policy = policy or SandboxPolicy()
        if self._in_phase(policy, pass_fds):
            sandbox = self._phase_sandbox(policy, limits, Path(cwd))
            if sandbox is not None:
                return self._exec(
                    sandbox, argv, cwd=Path(cwd), env=env, limits=limits, stdin_data=stdin_data, meanwhile=meanwhile
                )
        with contextlib.ExitStack() as closing:
            policy = self._complete(policy, limits, closing)
            launch = self.runtime.launch(
                argv,
                policy,
                cwd=Path(cwd),
                env={**env, killer.TAG_VAR: self.eval_id},
            )
            closing.callback(launch.close)
            live_log = closing.enter_context(open(self.live_log, "ab", buffering=0)) if self.live_log else None
            capture = OutputCapture(limits.max_output_bytes, live_log)
            started = time.monotonic()
            proc = self._start(launch, stdin_data is not None, policy.niceness, tuple(pass_fds))
            if launch.info is not None:
                launch.info.close_write_end()  # bwrap holds its own copy
            monitor = Monitor(
                limits=limits,
                session_dir=self.session_dir,
                cancel_event=self.cancel_event,
                started_at=started,
                on_verdict=lambda verdict: self._kill(proc, verdict),
                cgroup=self.cgroup,
                **self._outside_usage(),
            )
            self._sandbox_init = None
            monitor.start()
            sandbox_init = None
            try:
                sandbox_init = self._adopt_sandbox_init(launch)
                if meanwhile is not None:
                    meanwhile()
                pump(proc, capture, stdin_data)
                capture.end_log()
                proc.wait()
            finally:
                monitor.stop()
                if monitor.verdict is not None or proc.poll() is None:
                    spare = self._spare_for(monitor.verdict)
                    killer.kill_all(self.eval_id, proc.pid, uid=self._own_uid, spare=spare)  # also after an exception
                    proc.wait()
                killer.release(proc.pid)
                self._confirm_gone(sandbox_init)
                killer.reap_orphans()
        code = proc.returncode
        return self._result(128 - code if code < 0 else code, monitor, capture, limits, started)

    def background(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: dict[str, str],
        limits: Limits,
        policy: SandboxPolicy,
        init_base: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> Background:
        """Start ``argv`` as a command is started, and return at once: it runs beside the commands
        that follow, spared by ``sweep``, until ``Background.stop`` or ``close`` (background.py).
        ``limits``: its rlimits, cgroup and output cap (no timeout, no monitor: the cgroup holds it).
        In an image, as a user bubblewrap cannot set a sandbox up as (``ImageRoot.run_as``, not root:
        only the map's user and root can), the sandbox is the image's root's and the init
        (``init_base``: where it is built, WORKSPACE_BASE) switches to that user and execs ``argv``.
        ``pass_fds``: descriptors it inherits (a live sandbox's service's init socket, SPEC §24)."""
        self._ensure_cgroup(limits)
        closing = contextlib.ExitStack()
        try:
            pass_fds = tuple(pass_fds)
            image = policy.image
            if image is not None and image.run_as is not None and image.run_as[0] != 0:
                if init_base is None:
                    raise ValueError(f"background {name}: another user than root or the map's needs init_base")
                binary = initbin.open_binary(init_base)
                closing.callback(os.close, binary)
                uid, gid = image.run_as
                argv = [initbin.exec_path(binary), "--as", str(uid), str(gid), *argv]
                policy = dataclasses.replace(policy, image=dataclasses.replace(image, run_as=(0, 0)))
                pass_fds = (*pass_fds, binary)
            policy = self._complete(policy, limits, closing)
            launch = self.runtime.launch(argv, policy, cwd=Path(cwd), env={**env, killer.TAG_VAR: self.eval_id})
            closing.callback(launch.close)
            proc = self._start(launch, False, policy.niceness, pass_fds)
            if launch.info is not None:
                launch.info.close_write_end()
            sandbox_init = self._adopt_pid(launch)  # None: nothing proves its end, later sweeps scan
        except BaseException:
            closing.close()
            raise
        started = Background(name, proc, OutputCapture(limits.max_output_bytes), closing, sandbox_init)
        self._backgrounds.append(started)
        return started

    def _spare_fn(self):
        """What a sweep leaves alone: the background processes' pids at each pass (None: nothing)."""
        if not self._backgrounds:
            return None

        def spared() -> set[int]:
            table = killer.processes()
            return {pid for started in self._backgrounds for pid in started.pids(table)}

        return spared

    # -- phases (SPEC §25, phase.py) ---------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, name: str, *, init_base: Path, executor: bool = False, retire: bool = False):
        """Within it, the sandboxed commands of one policy share one sandbox (``init_base``:
        WORKSPACE_BASE, where the init's folder is made); every one of them ends with it.
        ``executor``: the executor's own commands (``fresh_tmp``) share one too, and one /tmp.
        ``retire``: at the end, each sandbox is only told to end (its init's socket closed: no
        command can start in it, and its commands' leftovers were killed after each); the wait
        for its end is the next ``end_phase``'s (or ``sweep``'s, ``close``'s), off this path."""
        if self._phase is not None:
            raise RuntimeError(f"phase {name!r} inside phase {self._phase!r}: phases do not nest")
        self._phase, self._phase_base, self._phase_executor = name, Path(init_base), executor
        ended = False
        try:
            prestarted = self._take_prestart(name)
            if prestarted is not None:
                self._phase_sandboxes[prestarted.key] = prestarted
            yield
            ended = True
        finally:
            self._phase, self._phase_executor = None, False
            if retire and ended:
                self._retire_phase()
            else:
                self.end_phase()

    def prestart(
        self,
        name: str,
        policy: SandboxPolicy,
        limits: Limits,
        cwd: Path,
        *,
        init_base: Path,
        then: Callable[[EarlyRun], None] | None = None,
    ) -> None:
        """Start now the sandbox the commands of ``policy`` will share in the coming phase ``name``
        (opened with the same ``executor``), so that its bubblewrap and init start while other
        work goes on: launched here, its init awaited by a thread that does nothing else.
        ``phase(name)`` takes it once ready; ``end_prestart`` (``sweep``, ``close``) ends one
        never taken.

        ``then``: once the init runs, the same thread calls it with an ``EarlyRun`` of this
        sandbox (commands of the coming phase that need nothing of what runs meanwhile: the
        patch's reading of the base commit while the agent runs); not called when the sandbox
        did not start. ``phase(name)`` and ``end_prestart`` wait for its end."""
        if name in self._prestarts or not self._phaseable(policy, ()):
            return
        self._ensure_cgroup(limits)
        key = PhaseKey(policy, limits.disk_quota_bytes, limits.max_processes)
        launched = self._launch_phase_sandbox(key, policy, limits, Path(cwd), Path(init_base), name)
        if launched is not None:
            sandbox = launched[0]
            run = EarlyRun(sandbox, self.eval_id, limits)
            self._prestarts[name] = _Prestart(sandbox, lambda: self._await_phase_sandbox(*launched, name), run, then)

    def prestarted(self, name: str) -> bool:
        """Whether a sandbox was prestarted for phase ``name`` and no phase took it yet."""
        return name in self._prestarts

    def beside(self, name: str, work: Callable[[EarlyRun], None]) -> bool:
        """Run ``work`` with an ``EarlyRun`` of the sandbox prestarted for phase ``name``, on a
        thread of its own, beside the commands that follow in other phases (the agent's patch while
        the tests run, SPEC §25), once the prestart's own thread is done and if its sandbox runs.
        ``phase(name)`` waits for it; ``end_prestart`` ends the sandbox first, which ends whatever
        ``work`` runs. False, and nothing runs, when no sandbox was prestarted for ``name``."""
        start = self._prestarts.get(name)
        if start is None:
            return False
        start.also(work)
        return True

    def end_prestart(self, name: str | None = None) -> None:
        """End the sandbox prestarted for phase ``name`` (every one: None) if no phase took it:
        told to end first, so that no early command of its (``then``, ``beside``) is waited for."""
        for each in [name] if name is not None else list(self._prestarts):
            sandbox = self._take_prestart(each, ready_only=False, ending=True)
            if sandbox is not None:
                self._end_sandbox(sandbox)

    def _take_prestart(self, name: str, *, ready_only: bool = True, ending: bool = False) -> PhaseSandbox | None:
        """The sandbox prestarted for ``name``, once its thread is done; with ``ready_only``, None
        (and the sandbox ended) unless it is ready for execs and still alive. ``ending``: its init's
        socket closed before the wait (its early commands end with it)."""
        start = self._prestarts.pop(name, None)
        if start is None:
            return None
        if ending:
            start.sandbox.channel.close()
        sandbox, ready = start.result()
        if not ready_only or (ready and sandbox.clearable and sandbox.alive):
            if start.ran_early:
                sandbox.clear()  # what its early commands left running (one past its time): not the phase's
            return sandbox
        log.warning(
            "eval %s: phase %s: its prestarted sandbox did not start (%s)", self.eval_id, name, sandbox.errors()
        )
        self._end_sandbox(sandbox)
        return None

    def end_phase(self) -> None:
        """End every sandbox of the phase, and of earlier phases that retired theirs: its init's
        socket closed, its pid namespace seen gone."""
        for sandbox in [*self._retired, *self._phase_sandboxes.values()]:
            self._end_sandbox(sandbox)
        self._retired.clear()

    def _retire_phase(self) -> None:
        for sandbox in list(self._phase_sandboxes.values()):
            del self._phase_sandboxes[sandbox.key]
            sandbox.channel.close()  # the init exits, and with it the sandbox; awaited by end_phase
            self._retired.append(sandbox)

    def phase_pids(self) -> set[int]:
        """The open phase's sandboxes' own processes (not commands): bubblewrap, init, relay."""
        return set().union(*(sandbox.own_pids() for sandbox in self._phase_sandboxes.values()))

    def _in_phase(self, policy: SandboxPolicy, pass_fds: Sequence[int]) -> bool:
        return (
            self._phase is not None
            # the executor's own command: a sandbox and a /tmp of its own, unless the phase is its job's
            and (self._phase_executor or not policy.fresh_tmp)
            and self._phaseable(policy, pass_fds)
        )

    def can_share(self, policy: SandboxPolicy) -> bool:
        """Whether commands of ``policy`` can share a phase's sandbox here (``prestart`` one)."""
        return self._phaseable(policy, ())

    def _phaseable(self, policy: SandboxPolicy, pass_fds: Sequence[int]) -> bool:
        # In any root (the host's, an image's, a named one): the init runs from a descriptor, with no
        # mount point of its own there (phase.py).
        return self.runtime.contains_processes and not pass_fds

    def _phase_sandbox(self, policy: SandboxPolicy, limits: Limits, cwd: Path) -> PhaseSandbox | None:
        """The phase's sandbox for this policy, started by its first command; None if one cannot
        start here (the command then runs in a sandbox of its own, which says why if it fails too)."""
        key = PhaseKey(policy, limits.disk_quota_bytes, limits.max_processes)
        sandbox = self._phase_sandboxes.get(key)
        if sandbox is not None and sandbox.alive:
            return sandbox
        if sandbox is not None:
            self._end_sandbox(sandbox)
        launched = self._launch_phase_sandbox(key, policy, limits, cwd, self._phase_base, self._phase)
        if launched is None:
            return None
        sandbox = launched[0]
        if self._await_phase_sandbox(*launched, self._phase) and sandbox.clearable:
            self._phase_sandboxes[key] = sandbox
            return sandbox
        log.warning("eval %s: phase %s: no sandbox for its commands (%s)", self.eval_id, self._phase, sandbox.errors())
        self._end_sandbox(sandbox)
        return None

    def _launch_phase_sandbox(
        self, key: PhaseKey, policy: SandboxPolicy, limits: Limits, cwd: Path, base: Path, phase: str
    ) -> tuple[PhaseSandbox, Launch] | None:
        """A new sandbox for ``key``, started (its bubblewrap's Popen; ``_await_phase_sandbox``
        waits for its init); None without an init. Always from the thread that runs the phase's
        commands: bubblewrap dies with the thread that started it (``--die-with-parent``)."""
        try:
            binary = initbin.open_binary(base)
        except (initbin.InitUnavailable, OSError) as exc:  # no compiler here: a bubblewrap each, as before
            log.warning("eval %s: phase %s: no init for a shared sandbox: %s", self.eval_id, phase, exc)
            return None
        closing = contextlib.ExitStack()
        closing.callback(os.close, binary)
        channel = InitChannel()
        closing.callback(channel.close)
        try:
            completed = self._complete(PhaseSandbox.init_policy(policy), limits, closing)
            members = self.cgroup.pids if self.cgroup is not None else None
            sandbox = PhaseSandbox(
                key=key, policy=completed, channel=channel, binary=binary, closing=closing, members=members
            )
            env = {"PATH": SYSTEM_PATH, killer.TAG_VAR: self.eval_id}
            launch = self.runtime.launch(sandbox.init_argv(), completed, cwd=cwd, env=env)
            closing.callback(launch.close)
            sandbox.proc = self._start(launch, False, completed.niceness, (channel.init_fd, binary))
        except BaseException:
            closing.close()
            raise
        channel.close_init_end()
        if launch.info is not None:
            launch.info.close_write_end()
        return sandbox, launch

    def _await_phase_sandbox(self, sandbox: PhaseSandbox, launch: Launch, phase: str) -> bool:
        """Whether the launched sandbox's init runs. It may run in a ``prestart`` thread: it waits
        and reads, never kills nor ends anything, and touches no state of the running command."""
        try:
            return sandbox.started(sandbox.proc, self._adopt_pid(launch))
        except Exception:
            log.exception("eval %s: phase %s: its sandbox's start failed", self.eval_id, phase)
            return False  # the caller ends it (and, with it, what started)

    def _end_sandbox(self, sandbox: PhaseSandbox) -> None:
        if self._phase_sandboxes.get(sandbox.key) is sandbox:
            del self._phase_sandboxes[sandbox.key]
        proc = sandbox.proc
        sandbox.end(kill=lambda: killer.kill_all(self.eval_id, proc.pid, uid=self._own_uid, spare=self._spare_fn()))
        if proc is not None:
            killer.release(proc.pid)
        self._confirm_gone(sandbox.sandbox_init)
        killer.reap_orphans()

    def _exec(
        self,
        sandbox: PhaseSandbox,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: dict[str, str],
        limits: Limits,
        stdin_data: bytes | None,
        meanwhile: Callable[[], None] | None = None,
    ) -> CommandResult:
        """``run`` as an exec in the phase's sandbox: the same monitor, output and result; a
        verdict kills the sandbox (and every process of the evaluation, as ``run``'s does)."""
        env = sandbox.exec_env({**env, killer.TAG_VAR: self.eval_id}, cwd)
        with contextlib.ExitStack() as closing:
            live_log = closing.enter_context(open(self.live_log, "ab", buffering=0)) if self.live_log else None
            capture = OutputCapture(limits.max_output_bytes, live_log)
            started = time.monotonic()
            monitor = Monitor(
                limits=limits,
                session_dir=self.session_dir,
                cancel_event=self.cancel_event,
                started_at=started,
                on_verdict=lambda verdict: self._kill(sandbox.proc, verdict),
                cgroup=self.cgroup,
                **self._outside_usage(),
            )
            self._sandbox_init = sandbox.sandbox_init
            entry = None
            monitor.start()
            try:
                entry, out_r, in_w = sandbox.start_exec(list(argv), cwd, env, stdin_data is not None)
                closing.callback(os.close, out_r)
                if meanwhile is not None:
                    meanwhile()
                pump_fds(
                    out_r,
                    capture,
                    stdin_fd=in_w,
                    close_stdin=lambda: os.close(in_w),
                    stdin_data=stdin_data,
                    exited=lambda: entry.wait(0),
                )
                capture.end_log()
                entry.wait()  # its end, or the sandbox's (a verdict kills it)
            except InitGone:
                pass  # the sandbox ended before the exec began: a verdict, or its init killed
            except ExecStartError as exc:
                capture.feed(f"term-executor: could not start the command: {exc}\n".encode())
            finally:
                monitor.stop()
                if monitor.verdict is not None or entry is None or not entry.wait(0) or entry.gone:
                    self._end_sandbox(sandbox)  # nothing of a killed command outlives this
                else:
                    sandbox.clear()  # nor what a command that ended left running
        return self._result(_exec_exit_code(entry), monitor, capture, limits, started)

    def _result(
        self, code: int, monitor: Monitor, capture: OutputCapture, limits: Limits, started: float
    ) -> CommandResult:
        """A command's result: its exit code unless a limit ended it, the limit the monitor, the
        kernel or the last folder walk names, and its peaks (added to the evaluation's)."""
        verdict = monitor.verdict
        exit_code = None if verdict else code
        verdict = (
            verdict or monitor.kernel_verdict() or _file_size_verdict(code, limits) or monitor.final_folder_check()
        )
        self._add_peaks(monitor.peaks)
        return CommandResult(
            exit_code=exit_code,
            output=capture.text(),
            output_bytes=capture.total,
            duration_ms=int((time.monotonic() - started) * 1000),
            limit=verdict.limit if verdict else None,
            limit_detail=verdict.detail if verdict else None,
            peak_memory_bytes=monitor.peaks.memory_bytes,
            peak_processes=monitor.peaks.processes,
        )

    def make_cgroup_ahead(self, limits: Limits) -> None:
        """Start making the evaluation's cgroup now, in a thread (a cgroup's folders cost a few ms
        to make on v1, a memory one most), so that the first command finds it made rather than
        making it on its path; that command awaits it (``_ensure_cgroup``) and sets its own limits."""
        support = self.runtime.cgroups
        if support is None or not support.enforced or self.cgroup is not None or self._cgroup_ahead is not None:
            return
        self._cgroup_ahead = _CgroupAhead(self.eval_id, limits, support)

    def hold_launch(self) -> None:
        """Start the first command's launcher now (``_HeldLaunch``), so that it joins the
        evaluation's cgroups while the steps before that command go on (the pipeline calls it once
        the task is downloaded, the cgroup made meanwhile: ``make_cgroup_ahead``). Nothing without
        the cgroup (made, or its making awaited here), without the init's launcher, or with a
        launcher held already."""
        if self._held is not None:
            return
        cgroup = self.cgroup
        if cgroup is None and self._cgroup_ahead is not None:
            cgroup = self._cgroup_ahead.made()
            if cgroup is not None:  # taken as the first command takes it (a failure stays that command's)
                self.cgroup, self._cgroup_ahead = cgroup, None
        launcher = initbin.host_binary()
        if cgroup is None or launcher is None:
            return
        self._hold(str(launcher), tuple(str(path) for path in cgroup.procs_files()), COMMAND_NICENESS)

    def _hold(self, launcher: str, joins: tuple[str, ...], niceness: int) -> None:
        """The next command's launcher held; the cgroup's process limit allowing for it from the first.
        Best effort: where it cannot be started, the next command starts a launcher of its own."""
        try:
            if self.cgroup.reserved == 0:
                self.cgroup.reserve(1)
            self._held = _HeldLaunch(launcher, joins, niceness)
        except OSError as exc:
            log.warning("eval %s: no launcher held for the next command: %s", self.eval_id, exc)

    def _ensure_cgroup(self, limits: Limits) -> None:
        support = self.runtime.cgroups
        if support is None or not support.enforced:
            return
        if self._cgroup_ahead is not None:
            ahead, self._cgroup_ahead = self._cgroup_ahead, None
            self.cgroup = ahead.result()  # its error, if it could not be made, is the first command's
        if self.cgroup is None:
            self.cgroup = cgroups.EvalCgroup.create(
                self.eval_id, limits.memory_bytes, limits.max_processes, support=support
            )
        else:
            self.cgroup.set_limits(limits.memory_bytes, limits.max_processes)

    def _add_peaks(self, peaks: Peaks) -> None:
        self.peaks.memory_bytes = max(self.peaks.memory_bytes, peaks.memory_bytes)
        self.peaks.processes = max(self.peaks.processes, peaks.processes)
        self.peaks.disk_bytes = max(self.peaks.disk_bytes, peaks.disk_bytes)
        self.peaks.files = max(self.peaks.files, peaks.files)

    def resources(self) -> dict:
        """SPEC §12's ``resources`` so far: the cgroup's figures where there is one, else the monitor's."""
        peaks = self.peaks
        figures = {
            "peak_memory_bytes": peaks.memory_bytes,
            "cpu_seconds": round(max(0.0, _children_cpu_seconds() - self._cpu_before), 3),
            "peak_processes": peaks.processes,
            "peak_disk_bytes": peaks.disk_bytes,
            "peak_files": peaks.files,
        }
        if self.cgroup is not None:
            cpu = self.cgroup.cpu_seconds()
            figures["peak_memory_bytes"] = self.cgroup.peak_memory_bytes()
            figures["peak_processes"] = max(peaks.processes, self.cgroup.peak_processes())
            if cpu is not None:
                figures["cpu_seconds"] = round(cpu, 3)
        return figures

    def close(self) -> None:
        """After the last command: stop the background processes, remove the evaluation's cgroup
        (killing anything left in it)."""
        if self._cgroup_ahead is not None:  # made for a command that never came
            ahead, self._cgroup_ahead = self._cgroup_ahead, None
            with contextlib.suppress(Exception):  # unmade, it has nothing to remove
                self.cgroup = ahead.result()
        if self._held is not None:
            held, self._held = self._held, None
            held.close()
        self.end_prestart()
        self.end_phase()
        for started in self._backgrounds:
            if not started.stop():
                self._all_confirmed_gone = False
        self._backgrounds.clear()
        if self.cgroup is not None and self.cgroup.remove():
            self.cgroup = None

    def _complete(self, policy: SandboxPolicy, limits: Limits, closing: contextlib.ExitStack) -> SandboxPolicy:
        """The step's policy plus what this evaluation fixes for every command, its mount points
        made (sandbox.prepare_mount_points); a fresh tmp is removed when ``closing`` closes."""
        if self.exclusive_uid:
            nproc = limits.max_processes + _NPROC_MARGIN
        else:
            nproc = limits.max_processes * _NPROC_HEADROOM
        isolated = self.runtime.isolated
        tmp = None
        if isolated and policy.fresh_tmp:
            tmp = fresh_tmp(self.session_dir, self.uid)
            closing.callback(remove_tree_nofollow, tmp)
        elif isolated and not policy.image_tmp:
            tmp = private_tmp(self.session_dir, self.uid, sticky=policy.image is not None)
        policy = dataclasses.replace(
            policy,
            namespaces=isolated,
            uid=self.uid,
            rlimits=RLimits(fsize_bytes=limits.disk_quota_bytes, nproc=nproc),
            private_tmp=tmp,
            runtimes=self.runtime.language_runtimes if policy.root is None and policy.image is None else (),
            cgroup_procs=tuple(self.cgroup.procs_files()) if self.cgroup is not None else (),
        )
        prepare_mount_points(policy)
        return policy

    def _start(self, launch: Launch, with_stdin: bool, niceness: int, pass_fds: tuple[int, ...]) -> subprocess.Popen:
        """The launch's process: the held launcher told to run it where one fits (``_HeldLaunch``),
        else a new one; then the next command's launcher, held."""
        fds = (*launch.pass_fds, *pass_fds)
        held, self._held = self._held, None
        proc = None
        if held is not None:
            if held.fits(launch.argv, with_stdin, niceness):
                proc = held.go(launch.argv, launch.env, launch.cwd, fds)
            if proc is None:
                held.close()
        if proc is None:
            with killer.spawning() as awaiting, _niced(niceness):
                proc = subprocess.Popen(
                    launch.argv,
                    stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,  # one pipe: the kernel keeps the two streams in order
                    cwd=launch.cwd,
                    env=launch.env,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=fds,
                )
                awaiting(proc.pid)
        log.debug("eval %s: pid %s started: %s", self.eval_id, proc.pid, launch.argv)
        joins = cgroup_joins(launch.argv)
        if joins and self.cgroup is not None:
            self._hold(launch.argv[0], joins, niceness)
        return proc

    def _adopt_sandbox_init(self, launch: Launch) -> int | None:
        """The running command's sandbox pid 1 (None without one), as ``_adopt_pid``; the monitor
        reads it (``_sandbox_shm_bytes``)."""
        pid = self._adopt_pid(launch)
        self._sandbox_init = _UNREPORTED if pid is None else pid
        return pid

    def _adopt_pid(self, launch: Launch) -> int | None:
        """The sandbox's pid 1 (None without one), kept from any reap until ``_confirm_gone``."""
        pid = (
            launch.info.sandbox_init() if launch.info is not None else None
        )  # only a runtime that contains processes has one
        if pid is None:
            self._all_confirmed_gone = False  # nothing proves this command left nothing behind
        else:
            killer.adopt(pid)
        return pid

    def _sandbox_shm_bytes(self) -> int:
        """The monitor's look at the running command's SysV shared memory (see sysvipc)."""
        init = self._sandbox_init
        if init is None:
            return 0  # bwrap has not made the namespace yet
        if init is _UNREPORTED:
            return sysvipc.sandbox_shm_bytes()  # every sandbox of ours, found by a scan
        return sysvipc.namespace_shm_bytes(init)

    def _sandbox_shm_files(self) -> TreeUsage:
        """The files of the running command's /dev/shm: its tmpfs caps their bytes (RAM, SHM_BYTES),
        not their number. Read through its pid 1's root; its bytes are not disk, so not counted."""
        init = self._sandbox_init
        if not isinstance(init, int):
            return TreeUsage()  # no namespace yet, or one that did not report its pid 1
        try:
            return TreeUsage(files=folder_usage(Path(f"/proc/{init}/root/dev/shm")).files)
        except OSError:
            return TreeUsage()  # the sandbox has just ended: its /dev/shm went with it

    def _confirm_gone(self, sandbox_init: int | None) -> None:
        """Wait for the command's sandbox to be empty: its pid 1 ends only after the kernel has
        killed and reaped every other process of its pid namespace."""
        if sandbox_init is not None and not killer.await_exit(sandbox_init):
            log.warning("eval %s: sandbox pid %s still running; the next sweep scans", self.eval_id, sandbox_init)
            self._all_confirmed_gone = False

    def _kill(self, proc: subprocess.Popen, verdict: Verdict) -> None:
        log.info("eval %s: killing pid %s: %s", self.eval_id, proc.pid, verdict.detail)
        spare = self._spare_for(verdict)
        if self.cgroup is not None and spare is None:
            self.cgroup.kill()  # every process the kernel counts in it, frozen first on v1
        killer.kill_all(self.eval_id, proc.pid, uid=self._own_uid, spare=spare)

    def _spare_for(self, verdict: Verdict | None):
        """A command over its time (or cancelled) is killed with what it started, the background
        processes spared (a healthcheck that hangs does not take the server it checks); over a
        limit of the whole evaluation (memory, processes, disk, files), everything goes."""
        if verdict is not None and verdict.limit not in (Limit.TIMEOUT, Limit.CANCELLED):
            return None
        return self._spare_fn()

    @property
    def _own_uid(self) -> int | None:
        return self.uid if self.exclusive_uid else None

    def _outside_usage(self) -> dict:
        """What the monitor adds to the tree and the session folder (see the module notes)."""
        if self.runtime.isolated:
            # /tmp is <session>/tmp and /dev/shm a capped tmpfs, both of the sandbox; its
            # SysV shared memory lives in its own IPC namespace, read there.
            return {"extra_memory": self._sandbox_shm_bytes, "extra_disk": self._sandbox_disk}
        uid = self._own_uid
        if uid is None:
            return {}  # a shared uid: what it owns is not this evaluation's alone
        return {"extra_disk": lambda: uids.owned_usage(uid), "extra_memory": lambda: sysvipc.owned_shm_bytes(uid)}

    def _sandbox_disk(self) -> TreeUsage:
        used = self._sandbox_shm_files()
        for folder in self.measured:
            used += folder_usage(folder)
        return used

    def scrub(self) -> None:
        """With its own uid: kill the uid's processes, remove its files in the host's shared
        temporary folders, at any depth, and its SysV IPC (uids.scrub); its own session folder
        is left alone. Nothing to do with a shared uid, nor when every command ran in a sandbox
        now confirmed empty: a sandboxed command cannot reach the host's temporary folders (nor
        can bwrap, which only mounts on folders sandbox.prepare_mount_points made), and its IPC
        lives in the sandbox's namespace."""
        if self.exclusive_uid and not self._all_confirmed_gone:
            uids.scrub(self.uid, keep=(self.session_dir,), spare=self._spare_fn())

    def sweep(self) -> int:
        """Kill every remaining process of this evaluation; return how many were killed.

        Without a scan when every command so far ran in a sandbox that was seen to end
        (``_confirm_gone``): none of their processes can remain, and every process of the
        evaluation is one of theirs or of a background process's sandbox (``background``), which
        a sweep leaves running, as a scan spares them. Any doubt (no sandbox, a sandbox that did not report
        its pid 1, or did not end in time) makes every later sweep scan /proc.
        """
        if self._all_confirmed_gone:
            return 0  # a phase's sandboxes were cleared after each exec (``_exec``)
        self.end_prestart()  # a scan kills by tag and uid: a phase's sandboxes would go too
        self.end_phase()
        count = killer.kill_all(self.eval_id, uid=self._own_uid, spare=self._spare_fn())
        if count:
            log.info("eval %s: swept %s leftover process(es)", self.eval_id, count)
        return count


class _CgroupAhead:
    """``EvalCgroup.create`` in a thread of its own (``Spawner.make_cgroup_ahead``); ``result``
    awaits it and returns the cgroup or raises what its making raised."""

    def __init__(self, eval_id: str, limits: Limits, support):
        self._made: cgroups.EvalCgroup | None = None
        self._error: BaseException | None = None

        def make() -> None:
            try:
                self._made = cgroups.EvalCgroup.create(
                    eval_id, limits.memory_bytes, limits.max_processes, support=support
                )
            except BaseException as exc:  # re-raised in the thread that needs the cgroup
                self._error = exc

        self._thread = threading.Thread(target=make, name="cgroup-ahead", daemon=True)
        self._thread.start()

    def result(self) -> cgroups.EvalCgroup:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._made

    def made(self) -> cgroups.EvalCgroup | None:
        """The cgroup once made, or None where its making failed (``result`` raises that)."""
        self._thread.join()
        return self._made


class _HeldLaunch:
    """The next command's launcher, started as the last one starts (``te-init --launch --cgroup ...
    --hold FD``): it joins the evaluation's cgroups while that command runs, then waits to be told
    the rest of its launch (``go``). A cgroup v1 move takes a global lock whose first writer waits
    for an RCU grace period, 5-11 ms here when no move came in the last few ms: on the command's
    path it was most of a sandbox's start (bench/RESULTS.md, issue 38, stop 52). It runs as root
    (the uid switch is part of the rest), in a session of its own, without the evaluation's tag:
    neither a kill of a command nor a sweep or scrub of the evaluation's uid takes it (a kill of
    the whole cgroup does: then it is not used). ``close`` ends it unused: its socket's end of
    file. Used only from the thread that started it (bubblewrap dies with that thread), with the
    cgroups, stdin and niceness it was started with."""

    def __init__(self, launcher: str, joins: tuple[str, ...], niceness: int):
        self.joins = joins
        self.niceness = niceness
        self.thread = threading.get_ident()
        self.socket, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        joined = [part for path in joins for part in ("--cgroup", path)]
        try:
            with killer.spawning() as awaiting, _niced(niceness):
                self.proc = subprocess.Popen(
                    [launcher, "--launch", *joined, "--hold", str(child.fileno())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    env={},
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(child.fileno(),),
                )
                awaiting(self.proc.pid)
        except BaseException:
            self.socket.close()
            raise
        finally:
            child.close()

    def fits(self, argv: Sequence[str], with_stdin: bool, niceness: int) -> bool:
        return (
            self.thread == threading.get_ident()
            and not with_stdin
            and niceness == self.niceness
            and cgroup_joins(argv) == self.joins
            and self.proc.poll() is None
        )

    def go(self, argv: Sequence[str], env: dict[str, str], cwd: Path, fds: tuple[int, ...]) -> subprocess.Popen | None:
        """The launch sent: its process (the held one's), or None if it could not be told."""
        fields = [str(cwd), str(len(env)), *(f"{k}={v}" for k, v in env.items()), str(len(fds)), *map(str, fds)]
        rest = without_joins(argv)
        fields += [str(len(rest)), *rest]
        if len(fds) > _HELD_MAX_FDS or any("\0" in field for field in fields):
            return None  # a launcher of its own (Popen refuses a NUL as it always did)
        request = os.memfd_create("te-launch", os.MFD_CLOEXEC)
        try:
            os.write(request, b"".join(os.fsencode(field) + b"\0" for field in fields))
            self.socket.sendmsg([b"G"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [request, *fds]))])
        except OSError:
            return None
        finally:
            os.close(request)
        self.socket.close()
        return self.proc

    def close(self) -> None:
        """Unused: its end of file, then its exit (or its kill), reaped."""
        self.socket.close()
        try:
            self.proc.wait(_HELD_EXIT_SECS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        killer.release(self.proc.pid)


class _Prestart:
    """A coming phase's sandbox, launched, and a thread awaiting its init (``Spawner.prestart``),
    then running ``then`` in it, if any; then ``also``'s work, each on a thread of its own."""

    def __init__(self, sandbox: PhaseSandbox, wait, run: EarlyRun, then=None):
        self.sandbox = sandbox
        self.ready = False
        self.run = run
        self._wait = wait
        self.ran_early = False
        self.thread = threading.Thread(target=self._first, args=(then,), name="phase-prestart", daemon=True)
        self.thread.start()

    def _first(self, then) -> None:
        self.ready = self._wait()
        self._early(then)

    def also(self, work) -> None:
        """``work`` with this sandbox's ``EarlyRun``, once what runs before it is done (its own thread)."""
        before = self.thread

        def after() -> None:
            before.join()
            self._early(work)

        self.thread = threading.Thread(target=after, name="phase-beside", daemon=True)
        self.thread.start()

    def _early(self, work) -> None:
        if work is None or not (self.ready and self.sandbox.clearable and self.sandbox.alive):
            return
        self.ran_early = True
        try:
            work(self.run)
        except Exception:  # the phase's own commands redo the work (the caller's ``then`` says so)
            log.exception("a prestarted sandbox's early commands failed")

    def result(self) -> tuple[PhaseSandbox, bool]:
        """The sandbox and whether its init runs, once known and its early work done (bounded:
        READY_WAIT_SECS, then the early commands' own timeouts)."""
        self.thread.join()
        return self.sandbox, self.ready


class EarlyRun:
    """gitrepo's CommandRunner for a prestarted sandbox's thread (``Spawner.prestart``'s ``then``):
    each command an exec in the sandbox, its output kept (never the live log: the running command's),
    its end awaited within ``timeout_secs``. No monitor: the evaluation's cgroup and the sandbox's
    rlimits hold it, the phase clears whatever it left (one that timed out too) when it takes the
    sandbox, and what it wrote in the session is walked by the phase's first exec's folder check."""

    def __init__(self, sandbox: PhaseSandbox, eval_id: str, limits: Limits):
        self.sandbox = sandbox
        self.eval_id = eval_id
        self.limits = limits

    def __call__(self, argv: Sequence[str], *, cwd: Path, env: dict[str, str], timeout_secs: float) -> CommandResult:
        sandbox = self.sandbox
        started = time.monotonic()
        deadline = started + timeout_secs
        capture = OutputCapture(self.limits.max_output_bytes, None)
        entry = None
        try:
            entry, out_r, _ = sandbox.start_exec(
                list(argv), Path(cwd), sandbox.exec_env({**env, killer.TAG_VAR: self.eval_id}, Path(cwd)), False
            )
            try:
                pump_fds(
                    out_r,
                    capture,
                    stdin_fd=None,
                    close_stdin=None,
                    stdin_data=None,
                    exited=lambda: entry.wait(0) or time.monotonic() > deadline,
                )
            finally:
                os.close(out_r)
            entry.wait(max(0.0, deadline - time.monotonic()))
        except (InitGone, ExecStartError) as exc:
            capture.feed(f"term-executor: could not start the command: {exc}\n".encode())
        duration_ms = int((time.monotonic() - started) * 1000)
        if entry is not None and not entry.wait(0):
            detail = f"timed out after {timeout_secs:g} s"
            return CommandResult(None, capture.text(), capture.total, duration_ms, Limit.TIMEOUT, detail)
        return CommandResult(_exec_exit_code(entry), capture.text(), capture.total, duration_ms)


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _exec_exit_code(entry) -> int:
    """An exec's exit status as a command's: 128 + N for a signal; a sandbox that ended under it
    (its init killed) is a SIGKILL."""
    if entry is None or entry.status is None:
        return 128 + signal.SIGKILL
    code = os.waitstatus_to_exitcode(entry.status)
    return 128 - code if code < 0 else code


def _file_size_verdict(exit_code: int, limits: Limits) -> Verdict | None:
    """A command the kernel stopped at RLIMIT_FSIZE (set from the disk quota): the disk limit."""
    if exit_code != _FILE_TOO_LARGE:
        return None
    return Verdict(Limit.DISK, f"file size limit exceeded (a single file over {limits.disk_quota_bytes // MIB} MiB)")


@contextlib.contextmanager
def _niced(niceness: int):
    """As root: this thread at ``niceness`` while it starts a command, which inherits it."""
    if not NICE_BY_THREAD:
        yield
        return
    thread = threading.get_native_id()  # on Linux, niceness is per thread
    before = os.getpriority(os.PRIO_PROCESS, thread)
    os.setpriority(os.PRIO_PROCESS, thread, max(before, niceness))
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, thread, before)  # lowering it again takes CAP_SYS_NICE
