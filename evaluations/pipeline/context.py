"""What the steps of one evaluation share, and the one way they run a command."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from assets import AssetView
from evaluations import lifecycle, livelog
from evaluations.environments import BadEnvironment, kinds, toolchains
from evaluations.environments.kinds import BaseEnvironment
from evaluations.grading.base import Grade
from evaluations.models import CANCEL_KINDS, ErrorKind, Evaluation
from evaluations.network import urlguard
from evaluations.network.egress import EgressProxy
from evaluations.network.egress.relay import direct
from evaluations.pipeline import gitrepo
from evaluations.pipeline.cancel import CancelState, Stop
from evaluations.pipeline.multistep import TaskSteps
from evaluations.pipeline.session import Session
from evaluations.pipeline.warm import WorkspaceCache
from evaluations.runtime import CommandResult, Limit, Limits, Mount, Runtime, SandboxPolicy, Spawner, initbin
from evaluations.runtime.netns import SharedNetwork
from evaluations.tasks.spec import TaskSpec
from executor_project.config import Config


class StepFailed(Exception):
    """The evaluation fails; the message is the cause (the step name is added).

    ``kind``: the SPEC §14 error_kind when the raiser knows it (ErrorKind.AGENT_INVALID for a
    broken agent install, say); None leaves it to the step's rule in run.py.
    """

    def __init__(self, message: str, *, kind: str | None = None):
        super().__init__(message)
        self.kind = kind


@contextlib.contextmanager
def environment_failure(kind: str | None = ErrorKind.INFRASTRUCTURE, prefix: str = "") -> Iterator[None]:
    """An environment's ``BadEnvironment`` in the block (a policy it cannot build, a mount point it
    cannot make, a program its root lacks) as the step's failure of ``kind`` (None: the step's rule,
    run.py), its sentence after ``prefix``: the one place it becomes one."""
    try:
        yield
    except BadEnvironment as exc:
        raise StepFailed(f"{prefix}{exc}", kind=kind) from None


def make_session_folder(session: Session, folder: Path, mode: int, *, owner, shown: str) -> None:
    """``Session.make_folder``, a folder it cannot make the step's failure (infrastructure), naming
    it as ``shown``: the one place that conversion is written."""
    try:
        session.make_folder(folder, mode, owner=owner)
    except OSError as exc:
        raise StepFailed(f"could not make {shown}: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None


class Cancelled(Exception):
    """The evaluation is cancelled (DELETE, TTL, agent timeout, shutdown).

    ``kind``: its error_kind: ErrorKind.AGENT_TIMEOUT for the agent's timeout; for a cancel
    asked on the row, models.CANCEL_KINDS by its reason (a shutdown is infrastructure); None: cancelled.
    """

    def __init__(self, message: str, *, kind: str | None = None):
        super().__init__(message)
        self.kind = kind


class WorkerLost(Exception):
    """The worker that owns this evaluation died; the evaluation fails."""


@dataclass
class Context:
    eval_id: str
    config: Config
    evaluation: Evaluation
    session: Session
    runtime: Runtime
    spawner: Spawner
    cancel: CancelState
    cache: WorkspaceCache  # the workspace cache's state; until cloning_repo decides, it acts as no cache
    env: BaseEnvironment  # what the task's commands run in: the host's until preparing_environment (kinds.py)
    progress: lifecycle.Progress  # the row's writer: transitions, and the steps' results with them (stage)
    task: TaskSpec | None = None
    base_sha: str = ""
    step: str = "queued"
    asset_excludes: list[str] = field(default_factory=list)
    static_assets: AssetView | None = None  # set by downloading_task (pipeline/static.py)
    closing: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # closed at cleanup
    egress: EgressProxy | None = None  # the evaluation's proxy: its commands' only way out (sandbox only)
    agent_interpreter: str | None = None  # absolute, chosen by downloading_task (pipeline/agentenv.py)
    grade: Grade | None = None  # set by running_tests: what the task's grader made of the tests (evaluations/grading/)
    # SPEC §23: the task's compose services other than main (name -> services.Running): their roots
    # prepared by preparing_environment, started by starting_environment (pipeline/services.py)
    services: dict = field(default_factory=dict)
    reset_for_tests: bool = False  # HOME and /tmp already reset after the agent, the tests' sandbox started (steps.py)
    # SPEC §23: the environment's network namespace, once its first process or healthcheck needs one
    # (pipeline/services.py): every task command's sandbox joins it, as a container's processes share one.
    netns: SharedNetwork | None = None
    # The evaluation's own loopback (run.py ``_prepare``, as root in a sandbox): one network namespace
    # that its sandboxes join one after another instead of a new one each, where no process of theirs
    # has a capability over it: the executor's git, and the task's install, the agent's install and the
    # agent on the host's system or a named root (not an image's, whose root keeps a namespace of its
    # own, as a container's root has; nor the tests, which get one of their own: ``task_policy``).
    loopback: SharedNetwork | None = None
    # SPEC §23: a separate verifier's environment, prepared with the agent's (pipeline/imageenv.py), which
    # becomes ``env`` as the tests begin (pipeline/collect.py), its memory limit, and where each kept
    # artifact goes in it (listed path -> artifacts.Placement). A task of [[steps]]: the running step's
    # (multistep.TaskSteps sets both as the step begins; every step's: ``separate_envs``).
    verifier_env: BaseEnvironment | None = None
    verifier_memory_mb: int | None = None
    placed: dict = field(default_factory=dict)
    steps: TaskSteps | None = None  # a task of [[steps]]: their run (pipeline/multistep.py), set by downloading_task
    agent_policy: SandboxPolicy | None = None  # the agent's, once its sandbox is prestarted (steps.py)
    # The agent's patch made beside the tests: staged at their end by this (agentpatch.AgentPatch.take)
    take_patch: Callable[[], None] | None = None

    def stage(self, **fields) -> None:
        """A step's results for the evaluation's row, written with the next transition or the end
        (lifecycle.Progress), never lost to a failure or a cancel that follows."""
        self.progress.stage(**fields)

    def separate_envs(self) -> list[BaseEnvironment]:
        """Every separate verifier's environment of the evaluation (SPEC §23): the task's, or each step's."""
        if self.steps is not None:
            return list(self.steps.separate.values())
        return [self.verifier_env] if self.verifier_env is not None else []

    def limits(self, timeout_secs: float) -> Limits:
        return Limits.of(self.config, timeout_secs)

    def base_env(self) -> dict[str, str]:
        """The clean environment every command starts from, the environment's (environments/kinds.py)."""
        env = self.env.command_env(self.trusted_ca)
        if self.services:  # SPEC §23: a service's name is the shared loopback, never the proxy's to reach
            env.update(direct(["main", *self.services]))
        return env

    @property
    def workdir(self) -> str:
        """Where the task's commands start, as they see it: the repository, or for a task without
        one (SPEC §16) its image's WorkingDir."""
        return self.env.workdir

    @contextlib.contextmanager
    def workdir_handle(self) -> Iterator[int]:
        """``workdir`` as the executor writes into it: a handle of the folder (``O_RDONLY |
        O_DIRECTORY``, closed after the block), for ``*at`` writes that never follow a link
        (safefs: ``clear_way``, ``write_file_nofollow``; the asset copier).

        The environment opens it (kinds.py): the session's repo/ ``O_NOFOLLOW``, or an image's
        WorkingDir resolved in the image's root, so the handle names a folder of the image's tree
        whatever that tree holds. Below the handle every write is by name, ``O_NOFOLLOW``: the tree
        the agent shaped is content, never a way onto the host, even if something were still
        changing it (the executor writes there only when no command of the evaluation runs).
        """
        with environment_failure(ErrorKind.TASK_INVALID):
            fd = self.env.open_workdir()
        try:
            yield fd
        finally:
            os.close(fd)

    def workdir_owner(self) -> int | None:
        """The host uid files the executor writes for the commands belong to (the image's user is the lease)."""
        return self.env.workdir_owner()

    @property
    def command_path(self) -> str:
        """The system PATH of the task's commands: the image's, the environment's, or the host's runtimes'."""
        return self.env.command_path

    @property
    def trusted_ca(self) -> toolchains.CaBundle | None:
        return toolchains.host_ca(self.config, sandboxed=self.runtime.isolated)

    def task_policy(
        self, *, network: bool, mounts: Sequence[Mount] = (), user: str = kinds.AGENT_USER, loopback: bool = False
    ) -> SandboxPolicy:
        """What a task's command may reach: the session's folders its environment binds, in its root;
        ``user``: whose user it runs as in an image (kinds.AGENT_USER, VERIFIER_USER, IMAGE_USER; SPEC §23).
        ``loopback``: the evaluation's own network namespace (``Context.loopback``), for the phases up to
        the agent's (its install, its own install, the agent); never the tests', which get one of their
        own: a socket the agent closed first stays in TIME_WAIT for a minute, and one of a listener
        without SO_REUSEADDR would refuse a test server its port even with the option."""
        ca = self.trusted_ca
        with environment_failure():  # an image's compose volumes (SPEC §23) bound too: kinds.Image.bind_volumes
            policy = self.env.sandbox_policy(
                network=network,
                mounts=mounts,
                ca_bundle=ca.host if ca is not None and self.runtime.isolated else None,
                user=user,
                **self._egress_fields(network),
                **({"netns": self.netns.path} if self.netns is not None else {}),
            )
        if loopback and policy.netns is None and policy.image is None and self.loopback is not None:
            policy = dataclasses.replace(policy, netns=self.loopback.path)
        return policy

    def repository_env(self) -> dict[str, str]:
        """git's environment for fetching the task's repository (clone, or into the cache's mirror).

        NO_PROXY empty: the repository's address was checked by the URL guard (a loopback
        test server included), and the proxy lets git reach exactly that (steps.cloning_repo).
        """
        allow = urlguard.git_allow_protocol(self.config.allow_file_urls)
        return {**gitrepo.git_env(self.session.home, allow), "NO_PROXY": "", "no_proxy": ""}

    def executor_policy(self, *, network: bool) -> SandboxPolicy:
        """The executor's own commands (clone, patch): the host's tools, the whole session writable,
        and a fresh, empty /tmp (never the agent's tmp/: issue 23)."""
        return SandboxPolicy(
            network=network,
            writable=(self.session.root,),
            fresh_tmp=True,
            **self._egress_fields(network),
            **({"netns": self.loopback.path} if self.loopback is not None else {}),
        )

    def _egress_fields(self, network: bool) -> dict:
        if not (network and self.egress is not None):
            return {}
        return {"egress_socket": Path(self.egress.socket_path), "relay_init": self.relay_init()}

    def relay_init(self) -> Path:
        """The init's folder, which the egress relay of a sandbox with network runs from (any root)."""
        return initbin.ensure_init(self.config.workspace_base)

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        timeout_secs: float,
        policy: SandboxPolicy,
        stdin_data: bytes | None = None,
        environment: BaseEnvironment | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> CommandResult:
        """Run one command of this evaluation in its environment (``environment``: another of its
        roots, a compose service's); a cancel raises Cancelled. ``meanwhile``: the caller's work
        while it runs (``Spawner.run``)."""
        limits = self.limits(timeout_secs)
        result = (environment or self.env).exec(
            argv, env=env, limits=limits, policy=policy, stdin_data=stdin_data, meanwhile=meanwhile
        )
        self._log_kill(result)
        if result.limit is Limit.CANCELLED:
            self.raise_cancelled()
        return result

    def _log_kill(self, result: CommandResult) -> None:
        """A command ended for a limit or a cancel says so in the log, right after its output."""
        if result.limit is Limit.CANCELLED:
            livelog.append_text(self.session.log, livelog.kill_line(f"cancelled: {self.cancel.reason or 'cancelled'}"))
        elif result.limit is not None:
            livelog.append_text(self.session.log, livelog.kill_line(result.limit_detail or result.limit.value))

    def phase(self, name: str, *, executor: bool = False, retire: bool = False):
        """A phase of this evaluation's commands (SPEC §25): those of one policy share one sandbox
        (runtime/phase.py); every one of them ends with the ``with`` block. ``executor``: the
        executor's own commands of one job (the agent's patch) share one too; ``retire``: the wait
        for the sandboxes' end is left to the next phase's end (Spawner.phase)."""
        return self.spawner.phase(name, init_base=self.config.workspace_base, executor=executor, retire=retire)

    def prestart(self, name: str, policy: SandboxPolicy, cwd: Path, *, then=None) -> None:
        """Start the sandbox of the coming phase ``name`` for ``policy`` now, in the background
        (runtime/spawner.py ``prestart``, and ``then`` there once it runs); the phase takes it,
        ready, or its end is ended unused."""
        limits = self.limits(self.config.agent_timeout_secs)  # only its disk and process limits matter
        self.spawner.prestart(name, policy, limits, cwd, init_base=self.config.workspace_base, then=then)

    def command_runner(
        self, policy: SandboxPolicy, *, meanwhile: Callable[[], None] | None = None
    ) -> Callable[..., CommandResult]:
        """gitrepo's CommandRunner: the executor's own commands, through the same spawner.
        ``meanwhile``: work of the caller's that overlaps the first of them (``Spawner.run``)."""
        pending = [meanwhile] if meanwhile is not None else []

        def run(argv, *, cwd, env, timeout_secs):
            limits = self.limits(timeout_secs)
            then = pending.pop() if pending else None
            result = self.spawner.run(argv, cwd=cwd, env=env, limits=limits, policy=policy, meanwhile=then)
            self._log_kill(result)
            return result

        return run

    def raise_cancelled(self):
        if self.cancel.stop is Stop.WORKER_LOST:
            raise WorkerLost(self.cancel.reason)
        reason = self.cancel.reason or "cancelled"
        raise Cancelled(reason, kind=CANCEL_KINDS.get(reason, ErrorKind.CANCELLED))

    def check_cancelled(self) -> None:
        if self.cancel.is_set():
            self.raise_cancelled()


def limit_failure(result: CommandResult, what: str, budget_name: str, budget: float) -> StepFailed | None:
    """The step's failure when the runtime ended ``what`` for a limit (None if it did not).

    A timeout is left to the step's rule (an install over INSTALL_TIMEOUT_SECS is the task's);
    memory, disk, files and processes are limit_exceeded.
    """
    if result.limit is Limit.TIMEOUT:
        return StepFailed(f"{what} timed out ({budget_name}={int(budget)} s)")
    if result.limit is not None:
        return StepFailed(f"{result.limit_detail} in {what}", kind=ErrorKind.LIMIT_EXCEEDED)
    return None


def last_line(output: str) -> str:
    """A failed command's cause, for the error sentence: its last non-empty line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def deadline_in(seconds: float) -> float:
    return time.monotonic() + seconds


def remaining(deadline: float) -> float:
    return deadline - time.monotonic()
