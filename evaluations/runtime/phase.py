"""A phase's sandbox (SPEC §25): one bubblewrap for every command of a phase, each an exec.

``Spawner.phase(name)`` opens a phase of the pipeline (the task's install commands, its tests); a
command run inside it goes to a ``PhaseSandbox``: one bubblewrap around the init of the live
sandboxes (``init.c``, ``initchannel.py``), started by the phase's first command with that
command's policy, and each command an exec in it, a message and a fork instead of a new user
namespace, mount tree and pid namespace. Commands of one phase with another policy (or other
rlimits) get a sandbox of their own; no sandbox outlives its phase, and none serves two phases: the
agent never shares one with the tests, nor with the executor's own git work (SPEC §5, §17, §20).

1. What a command sees is what the same command sees in a bubblewrap of its own: the sandbox is
   rendered from the command's completed policy (sandbox.render), the exec gets exactly the
   environment bwrap would have set (and the relay's proxy variables when it has network), its
   working directory and uid (the image's user in an image, else the evaluation's uid).
2. Limits are the spawner's: the evaluation's cgroup and rlimits hold the whole sandbox, the
   monitor watches each exec as it watches a command, and a verdict kills the sandbox (the next
   command of the phase starts another).
3. ``clear``, after each exec, kills from the host every process of the sandbox but its pid 1,
   the init and the egress relay: nothing a command left running outlives it, as when each ran in
   a pid namespace of its own (a /proc scan, about 2 ms, instead of a new sandbox). ``end`` closes the init's socket (the init
   exits, and with it the pid namespace), then kills from the host what did not go.
4. The init is not dumpable: no process of the sandbox can ptrace it, so an exit status it reports
   is the exec's. It remains the sandbox's word (DESIGN), as the exit status of a command was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from evaluations.network.egress.relay import RELAY_NAME, proxy_env
from evaluations.runtime import initbin, killer
from evaluations.runtime.initchannel import Exec, InitChannel, exec_request
from evaluations.runtime.policy import SandboxPolicy

log = logging.getLogger(__name__)

READY_WAIT_SECS = 30.0  # a bubblewrap that has not run the init by then has failed
END_WAIT_SECS = 5.0  # the init's exit, after its socket closed, before the host kills
_ERROR_BYTES = 4096  # what bubblewrap (or the relay) printed, kept for a sandbox that fails


@dataclasses.dataclass(frozen=True)
class PhaseKey:
    """Which commands of a phase share a sandbox: the same policy and the same rlimits."""

    policy: SandboxPolicy
    fsize_bytes: int
    max_processes: int


class PhaseSandbox:
    """One bubblewrap around the init, for the commands of one phase that share its ``PhaseKey``."""

    def __init__(
        self,
        *,
        key: PhaseKey,
        policy: SandboxPolicy,
        channel: InitChannel,
        binary: int,
        closing: contextlib.ExitStack,
        members: Callable[[], Iterable[int]] | None = None,
    ):
        self.key = key
        self.policy = policy  # completed: what the sandbox was rendered from
        self.channel = channel
        self.binary = binary  # the init, open (initbin.open_binary): run from it, no mount point
        self.members = members  # the evaluation's cgroup's processes, where it has one: every one of the sandbox's
        self.closing = closing  # the fresh tmp, the launch's descriptors: closed by ``end``
        self.proc: subprocess.Popen | None = None
        self.sandbox_init: int | None = None  # bubblewrap's pid 1 of the namespace (host pid)
        self._init: tuple[int, int] | None = None  # the init: (host pid, start time)
        self._relay: set[tuple[int, int]] = set()  # the egress relay's listening process: (pid, start)
        self._errors = bytearray()
        self._drain: threading.Thread | None = None
        self._next_exec = 0

    @staticmethod
    def init_policy(policy: SandboxPolicy) -> SandboxPolicy:
        """The command's policy, for the init. In an image whose commands run as another user than
        the map's (``ImageRoot.run_as``: a verifier's), the init is the image's root, which starts
        each exec as that user, as a live sandbox's does: bubblewrap cannot itself switch to a user
        and a group that are both not its own."""
        image = policy.image
        if image is not None and image.run_as is not None:
            policy = dataclasses.replace(policy, image=dataclasses.replace(image, run_as=(0, 0)))
        return policy

    def init_argv(self) -> list[str]:
        """Run from its descriptor (passed to bubblewrap with the socket's), so neither an image's
        layer nor a read-only root needs a mount point for it. With network, the relay (render's
        prefix) listens before the init starts: the init's first word comes after it."""
        return [initbin.exec_path(self.binary), str(self.channel.init_fd)]

    @property
    def has_relay(self) -> bool:
        policy = self.policy
        return policy.namespaces and policy.network and policy.egress_socket is not None

    def started(self, proc: subprocess.Popen, sandbox_init: int | None) -> bool:
        """After Popen: drain what bubblewrap prints, wait for the init; False if it never ran."""
        self.proc = proc
        self.sandbox_init = sandbox_init
        self._drain = threading.Thread(target=self._read_errors, name="phase-sandbox-output", daemon=True)
        self._drain.start()
        if not self.channel.wait_ready(READY_WAIT_SECS) or self.channel.closed:
            return False
        if sandbox_init is not None:
            # Before any exec, the sandbox holds only the init and the relay (which the relay's
            # prefix started before becoming the init): named by their names now, when no command
            # of the phase could have taken one, and by (pid, start) afterwards.
            table = self._table()
            inside = killer.subtree(sandbox_init, table)
            named = [(proc, _comm(proc.pid)) for proc in table if proc.pid in inside]
            inits = [(proc.pid, proc.start) for proc, name in named if name == initbin.NAME]
            if len(inits) == 1:
                self._init = inits[0]
                self._relay = {(proc.pid, proc.start) for proc, name in named if name == RELAY_NAME}
        return True

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and not self.channel.closed

    @property
    def clearable(self) -> bool:
        """Whether ``clear`` can tell the init and the relay from the rest (bubblewrap reported its
        pid 1 and the init is its one child): else each command needs a sandbox of its own."""
        return self.sandbox_init is not None and self._init is not None

    def _table(self) -> list:
        """The processes to look among for the sandbox's: the evaluation cgroup's members (a few,
        where the host has hundreds; a process of the sandbox cannot leave the cgroup), or every
        process of the host without a cgroup, or when the read does not hold the sandbox's pid 1."""
        if self.members is not None and self.sandbox_init is not None:
            try:
                pids = set(self.members())
            except OSError:
                pids = set()
            if self.sandbox_init in pids:
                return killer.processes(pids)
        return killer.processes()

    def errors(self) -> str:
        return self._errors.decode("utf-8", "replace").strip()

    def exec_env(self, env: dict[str, str], cwd: Path) -> dict[str, str]:
        """What bubblewrap would have given the command: the proxy's variables first, when the
        relay runs (sandbox.render does the same), then the caller's, and PWD (bwrap sets it to
        its --chdir folder)."""
        return {**(proxy_env() if self.has_relay else {}), **env, "PWD": str(cwd)}

    def own_pids(self) -> set[int]:
        """The sandbox's own processes (host pids): bubblewrap, its pid 1, the init, the relay."""
        if self.proc is None:
            return set()
        table = self._table()
        return {self.proc.pid, *(pid for pid in (self.sandbox_init,) if pid is not None), *self._kept(table)}

    def _kept(self, table: list) -> set[int]:
        """The init and the relay (with the process each connection forks), as they are now."""
        alive = {(proc.pid, proc.start) for proc in table}
        kept = {pid for pid, start in (self._init, *self._relay) if (pid, start) in alive} if self._init else set()
        for relay, start in self._relay:
            if (relay, start) in alive:
                kept |= killer.subtree(relay, table)
        return kept

    def start_exec(self, argv: list[str], cwd: Path, env: dict[str, str], stdin: bool) -> tuple[Exec, int, int | None]:
        """Start one exec; returns it, the read end of its output (stdout and stderr in one pipe,
        as a command's), and the write end of its stdin when ``stdin``. Raises InitGone or
        ExecStartError."""
        request = exec_request(*self._ids(), str(cwd), argv, env)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        if stdin:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
        else:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None
        try:
            self._next_exec += 1
            entry = self.channel.start(self._next_exec, request, in_r, out_w, out_w)
        except BaseException:
            for fd in (out_r, in_w):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in (request, in_r, out_w):
                os.close(fd)
        return entry, out_r, in_w

    def _ids(self) -> tuple[int, int]:
        """The uid and gid the sandbox's commands run as, inside: their policy's image user
        (ImageRoot.ids) in an image, else the uid bubblewrap runs as (mapped to itself)."""
        policy = self.policy
        if self.key.policy.image is not None:
            return self.key.policy.image.ids
        if policy.uid is not None:
            return policy.uid, policy.uid
        return os.getuid(), os.getgid()

    def clear(self) -> int:
        """Kill every process of the sandbox but pid 1, the init and the relay (what a command
        left running); returns how many. From the host: nothing inside is asked."""
        if not self.clearable or not self.alive:
            return 0

        def leftovers() -> list:
            table = self._table()
            kept = self._kept(table)
            inside = killer.subtree(self.sandbox_init, table)
            return [proc for proc in table if proc.pid in inside and proc.pid not in kept and not proc.zombie]

        return killer.kill_until_none(leftovers, f"a phase sandbox's leftovers (pid {self.sandbox_init})")

    def end(self, kill: Callable[[], None]) -> None:
        """Close the init's socket (the sandbox ends with it); ``kill`` what is still running past
        END_WAIT_SECS. The caller confirms the pid namespace gone."""
        self.channel.close()
        if self.proc is not None:
            try:
                self.proc.wait(END_WAIT_SECS)
            except subprocess.TimeoutExpired:
                kill()
                self.proc.wait()
        if self._drain is not None:
            self._drain.join(timeout=END_WAIT_SECS)
        self.closing.close()

    def _read_errors(self) -> None:
        stream = self.proc.stdout
        try:
            while chunk := stream.read1(65536):
                self._errors += chunk
                del self._errors[: max(0, len(self._errors) - _ERROR_BYTES)]
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                stream.close()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as file:
            return file.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
