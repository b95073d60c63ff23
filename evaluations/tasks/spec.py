"""What every task format is read into (SPEC §4, §17, §19): ``TaskSpec`` and its parts, and
``TaskError``, the one refusal of a task folder. Plain data: nothing here reads a file (readers.py does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple


class TaskError(Exception):
    """The task folder is invalid; the message names the file or key at fault."""


@dataclass(frozen=True)
class TestSpec:
    """One test: a ``tests/*.sh`` script (``script`` holds its text) or a checks.txt line."""

    __test__ = False  # not a pytest test class

    name: str
    kind: str  # fail_to_pass | pass_to_pass | test | check
    script: str | None
    command: str | None
    source: str = ""  # where it came from: "tests/x.sh" or "checks.txt:3"


class SupportFile(NamedTuple):
    """A non-script file under tests/, written into the repository at ``relpath``."""

    relpath: str
    data: bytes
    mode: int


@dataclass(frozen=True)
class ImageEnvironment:
    """``environment: {image: REF}`` or ``{dockerfile: PATH, context: DIR, build_args, target}`` (SPEC §16).

    ``dockerfile`` and ``context`` are relative to the task root, checked to stay inside it.
    """

    image: str | None = None
    dockerfile: str | None = None
    context: str | None = None  # the Dockerfile's folder when not given
    build_args: dict[str, str] = field(default_factory=dict)
    target: str | None = None
    # Harbor's [environment] workdir: where the agent and the tests run, over the image's WorkingDir
    # (an absolute, normalised path); None: the image's.
    workdir: str | None = None

    @property
    def kind(self) -> str:
        return "image" if self.image is not None else "dockerfile"

    @property
    def ref(self) -> str:
        return self.image if self.image is not None else self.dockerfile


@dataclass(frozen=True)
class SeparateVerifier:
    """Harbor's ``[verifier] environment_mode = "separate"`` (SPEC §23): the verifier's own image, in a
    root of its own into which only the collected artifacts are copied, as Harbor's
    ``resolve_verifier_environment_definition`` chooses it: ``[verifier.environment] docker_image``, else
    ``tests/Dockerfile`` (context ``tests/``), else the task's own environment, built or pulled afresh."""

    environment: ImageEnvironment  # its image or Dockerfile, and its workdir over the image's WorkingDir
    # The image's own /tests (a tests/Dockerfile or [verifier.environment] docker_image: Harbor uploads
    # nothing then); False: the task's tests/ at /tests, as for a shared verifier.
    bundled: bool
    env: dict[str, str] = field(default_factory=dict)  # its environment's variables ([verifier.environment.env])
    memory_mb: int | None = None  # [verifier.environment] memory_mb, capped by MEMORY_LIMIT_MB
    build_timeout_secs: float | None = None  # [verifier.environment] build_timeout_sec, capped by BUILD_TIMEOUT_SECS


@dataclass(frozen=True)
class ServiceVolume:
    """A compose service's volume (SPEC §23): a named volume of the file's top-level ``volumes``
    (``volume``: one folder of the evaluation's session, bound in every service naming it), or one of
    Harbor's log folders (``log_folder``: /logs/agent or /logs/artifacts, the session's own folder main
    has there), bound at ``target`` (absolute, normalised)."""

    target: str
    volume: str | None = None
    log_folder: str | None = None
    read_only: bool = False


@dataclass(frozen=True)
class Service:
    """A compose service other than ``main`` (SPEC §23): a sandbox of its own beside the agent's,
    sharing its loopback; started before the agent, in ``depends_on`` order, kept until the end."""

    name: str
    environment: ImageEnvironment  # its image, or its build (paths relative to the task root)
    command: tuple[str, ...] | None = None  # over the image's Cmd
    entrypoint: tuple[str, ...] | None = None  # over the image's Entrypoint (and then without its Cmd)
    env: dict[str, str] = field(default_factory=dict)  # over the image's Env
    workdir: str | None = None  # over the image's WorkingDir
    user: str | None = None  # over the image's User
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, str] = field(default_factory=dict)  # name: service_started | service_healthy
    volumes: tuple[ServiceVolume, ...] = ()  # its named volumes and Harbor's log folders


@dataclass(frozen=True)
class Collect:
    """A [[verifier.collect]] command: run in ``service`` after the agent, before the verifier (Harbor's hooks)."""

    command: str
    service: str = "main"
    timeout_secs: float = 60.0
    user: str | None = None


@dataclass(frozen=True)
class Verifier:
    """How a Harbor or Terminal-Bench task's tests run (SPEC §17): after the agent, in a fresh sandbox on
    the file system it left, ``files`` at /tests, /logs/verifier empty, ``bash /tests/<script>`` from the
    working directory, with ``env`` on top of the task's; or (``separate``) in an environment of its own."""

    script: str  # relative to /tests: "test.sh" (Harbor) or "run-tests.sh" (Terminal-Bench 1.x)
    files: list[SupportFile] = field(default_factory=list)  # every file of /tests, the script included
    env: dict[str, str] = field(default_factory=dict)
    isolated: bool = False  # [verifier] isolated: the image plus only the working directory the agent left
    separate: SeparateVerifier | None = None  # [verifier] (or a step's [steps.verifier]) environment_mode = "separate"


AGENT_LOGS, ARTIFACTS_DIR, VERIFIER_LOGS = "/logs/agent", "/logs/artifacts", "/logs/verifier"  # Harbor's
ARTIFACTS_LISTED = "artifacts"  # the first name of a collected artifact's listed path (Harbor's trial artifacts/)


@dataclass(frozen=True)
class ArtifactEntry:
    """What the agent leaves that is collected after it (SPEC §23, Harbor's ``ArtifactConfig``): the file or
    folder at ``source`` (absolute, normalised) in the agent's environment, listed as ``artifacts/`` plus
    ``destination`` (relative) or the source's own path, and copied into a separate verifier at ``source``."""

    source: str
    destination: str | None = None
    service: str = "main"  # a compose service's root to read ``source`` from (SPEC §23); listed alike
    exclude: tuple[str, ...] = ()  # a folder's patterns left out (tar --exclude, artifacts.excluded)

    @property
    def listed(self) -> str:
        return f"{ARTIFACTS_LISTED}/{self.destination or self.source.lstrip('/')}"


@dataclass(frozen=True)
class FirstProcess:
    """SPEC §23: how the environment's first process starts, as its container's would
    (pipeline/services.py): ``entrypoint`` and ``command`` are the compose service's, or None for the
    image's ENTRYPOINT and CMD (a compose ``entrypoint`` drops the image's CMD, as in Docker)."""

    entrypoint: tuple[str, ...] | None = None
    command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Healthcheck:
    """``[environment.healthcheck]`` (Harbor's ``HealthcheckConfig``, Docker's HEALTHCHECK): ``command``
    (``bash -c``) must exit 0 before the agent runs; failures during ``start_period_sec`` (checked
    every ``start_interval_sec``) do not count, then ``retries`` consecutive ones (every
    ``interval_sec``) mean never healthy. Each check within ``timeout_sec``. Harbor's defaults."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3
    # A compose service's ``healthcheck: test`` (tasks/compose.py): its argv ("CMD"; "CMD-SHELL" is
    # ``/bin/sh -c text``), ``command`` then only its text for the log; None: ``bash -c command``.
    argv: tuple[str, ...] | None = None

    @property
    def run_argv(self) -> list[str]:
        return list(self.argv) if self.argv is not None else ["bash", "-c", self.command]


NO_NETWORK, PUBLIC, ALLOWLIST = "no-network", "public", "allowlist"
NETWORK_MODES = (NO_NETWORK, PUBLIC, ALLOWLIST)
ENVIRONMENT, AGENT, VERIFIER = "environment", "agent", "verifier"  # whose network (SPEC §23)


@dataclass(frozen=True)
class NetworkRequest:
    """A network a task asks for (Harbor's ``NetworkPolicy``): ``mode`` one of NETWORK_MODES;
    ``allowed_hosts`` (``allowlist`` only) host names, ``*.`` wildcards, IPv4 and IPv6 addresses and
    CIDRs, in the egress proxy's syntax without ports (tasks/harbor.py checks them)."""

    mode: str = PUBLIC
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskRequest:
    """What a task asks for beyond SPEC §4 (task.toml, task.yaml); each capped by the operator's own
    setting when applied (the smaller wins). None: the task did not say."""

    agent_timeout_secs: float | None = None
    verifier_timeout_secs: float | None = None
    build_timeout_secs: float | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network: NetworkRequest | None = None  # [environment]'s: every phase's unless its own table says
    agent_network: NetworkRequest | None = None  # [agent]'s, for the agent's phase
    verifier_network: NetworkRequest | None = None  # [verifier]'s, for the tests' phase
    agent_user: str | None = None  # [agent] user (a name or uid in the image): the image's User when None
    verifier_user: str | None = None  # [verifier] user: the image's User when None (Harbor 0.25)

    def phase_network(self, phase: str) -> NetworkRequest:
        """The network ``phase`` (ENVIRONMENT, AGENT, VERIFIER) runs with: its own table's if it
        has one, else [environment]'s, else ``public`` (Harbor's ``resolve_trial_network_plan``)."""
        own = {ENVIRONMENT: None, AGENT: self.agent_network, VERIFIER: self.verifier_network}[phase]
        return own or self.network or NetworkRequest()


GRADERS = ("exit_code", "reward_file", "pytest", "swebench")
MEAN, FINAL = "mean", "final"  # Harbor's multi_step_reward_strategy
REWARD_STRATEGIES = (MEAN, FINAL)


SETUP_SCRIPT = "setup.sh"  # a step's workdir/setup.sh (Harbor's ``step_setup_path``)


@dataclass(frozen=True)
class TaskStep:
    """One ``[[steps]]`` entry of a Harbor task (SPEC §23, tasks/harbor_steps.py): its agent's prompt and
    request, its verifier (the task's tests/ under its own steps/<name>/tests/), when it stops the rest
    (``min_reward``: a number gating the ``reward`` key, or a table of keys) and its reference solution."""

    name: str
    prompt: str
    verifier: Verifier
    request: TaskRequest  # the task's, with the step's timeouts and phase networks resolved as Harbor does
    min_reward: float | dict[str, float] | None = None
    solution: str | None = None  # steps/<name>/solution/solve.sh, else the task's solution/solve.sh
    solution_files: list[SupportFile] = field(default_factory=list)
    healthcheck: Healthcheck | None = None  # its own: after its setup, before its agent (as the task's)
    artifacts: tuple[ArtifactEntry, ...] = ()  # its own, collected with the task's after its agent
    collect: tuple[Collect, ...] = ()  # [[steps.verifier.collect]]: run after its agent, after the task's
    workdir_files: list[SupportFile] = field(default_factory=list)  # steps/<name>/workdir/: into WorkingDir first

    @property
    def setup(self) -> bool:
        """steps/<name>/workdir/setup.sh: run (``bash setup.sh``) in WorkingDir once the files are there."""
        return any(file.relpath == SETUP_SCRIPT for file in self.workdir_files)


@dataclass(frozen=True)
class SwebenchTests:
    """workspace.yaml's ``swebench:`` mapping (SPEC §19, read by tasks/swebench.py): one test
    command over the test files, each id's status read from its log by ``parser``."""

    __test__ = False  # not a pytest test class

    test_cmd: str  # shell text; the test files follow it, each quoted
    test_files: list[str]
    parser: str  # a name of grading/parsers/swebench_logs.PARSERS
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    deleted_files: list[str] = field(default_factory=list)  # removed before the command (the test patch's)
    eval_script: str | None = None  # SWE-bench 5.0's eval script: the test command, test_cmd empty
    eval_type: str = "pass_and_fail"  # or fail_only (SWE-bench's EvalType)


@dataclass(frozen=True)
class TaskSpec:
    root: Path
    repo: str | None  # None: no repository; the task runs in its image's WorkingDir (SPEC §16)
    base_commit: str | None
    version: str | None
    language: str | None
    install: list[str]
    static_assets: dict  # raw workspace.yaml mapping; validated by the assets module
    env: dict[str, str]
    prompt: str
    original_pr: str | None
    tests: list[TestSpec] = field(default_factory=list)  # scripts (name order), then checks
    support_files: list[SupportFile] = field(default_factory=list)
    # A name under ENVIRONMENTS_ROOT (whether it exists is checked at preparing_environment), or an image.
    environment: str | ImageEnvironment | None = None
    # SPEC §23 (Harbor tasks): the image's first process, started before the agent; None: none starts.
    first_process: FirstProcess | None = None
    healthcheck: Healthcheck | None = None  # SPEC §23: must pass before the agent runs (pipeline/services.py)
    cache: bool = True  # workspace.yaml `cache: false`: never served from nor stored in the workspace cache
    # SPEC §17: the folder's format, how test output becomes a result, and (Harbor, Terminal-Bench) how
    # the verifier runs, what the task asks for, its metadata and its reference solution (a bash script).
    format: str = "workspace"  # workspace | harbor | terminal-bench
    grader: str = "exit_code"  # one of GRADERS
    verifier: Verifier | None = None
    request: TaskRequest = field(default_factory=TaskRequest)
    metadata: dict | None = None
    solution: str | None = None
    # What the reference solution finds at /solution (Harbor: every file of solution/, solve.sh
    # included, as its OracleAgent uploads them); empty when the script needs nothing beside it.
    solution_files: list[SupportFile] = field(default_factory=list)
    # Harbor's [solution.env]: on top of everything else for the reference solution's run alone
    # (verify_tasks' solution agent, as Harbor's oracle scopes it); never an agent's to see.
    solution_env: dict[str, str] = field(default_factory=dict)
    swebench: SwebenchTests | None = None  # grader swebench: what runs and how its log is read
    # SPEC §22: a compose volume binding a folder of the task at the working directory: what the agent
    # finds there (the folder without its tests and solution; the tests come back as support_files)
    workdir_files: list[SupportFile] | None = None
    # SPEC §19: a workspace task's reference solution as a diff of its repository (SWE-Forge's and
    # import_swebench's ``patch``), applied by verify_tasks' gold-patch agent; never the agent's to see.
    patch: str | None = None
    # SPEC §23: task.toml's top-level ``artifacts``, collected after the agent beside /logs/artifacts
    artifacts: tuple[ArtifactEntry, ...] = ()
    # SPEC §23: a Harbor task's [[steps]], run in order in one environment, and how the task's reward is
    # made of theirs (MEAN or FINAL); empty for a task of one step.
    steps: tuple[TaskStep, ...] = ()
    reward_strategy: str = MEAN
    # SPEC §23: environment/docker-compose.yaml's services other than ``main``, in start order, and
    # [[verifier.collect]]'s commands, run after the agent
    services: tuple[Service, ...] = ()
    collect: tuple[Collect, ...] = ()
    # SPEC §23: the named volumes main's compose service binds (the agent's environment)
    volumes: tuple[ServiceVolume, ...] = ()


def image_task(root: Path, **fields) -> TaskSpec:
    """The TaskSpec of a task that runs in its image (Harbor, Terminal-Bench): no repository, no cache."""
    return TaskSpec(
        root=root,
        repo=None,  # the image's WorkingDir is the workspace (SPEC §16)
        base_commit=None,
        version=None,
        language=None,
        install=[],
        static_assets={},
        original_pr=None,
        cache=False,
        **fields,
    )
