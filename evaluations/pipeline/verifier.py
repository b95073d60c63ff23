"""Harbor and Terminal-Bench tasks (SPEC §17): what the task asks for, /logs/agent, and the verifier.

1. ``apply_request`` (downloading_task): the task's timeouts, memory, storage and network, each capped by
   the operator's setting (the smaller wins), become the evaluation's Config; ``limits_applied`` records
   them. Each phase has its own network (SPEC §23: [agent] and [verifier] over [environment]):
   ``agent_network``/``verifier_network`` say whether its commands have one, ``phase_egress`` switches
   the evaluation's proxy to the phase's allowlist as the phase begins.
2. ``agent_mounts`` (running_agent): in an image, ``/logs/agent`` is the session's ``agent-logs/``, the
   sandbox uid's, and ``/logs/verifier`` an empty folder (Harbor mounts it in every phase; what the
   agent leaves there is removed when the verifier's is made, 3.); ``after_agent`` then, with no
   process of the agent alive, records what it changed outside its working directory
   (``system_changes``) and keeps what it left in /logs/agent (``artifacts``).
3. ``run_verifier`` (running_tests): a fresh sandbox on the file system the agent left (or, for
   ``[verifier] isolated``, on the image plus only its working directory), the task's tests at ``/tests``
   (root's, read-only), an empty ``/logs/verifier``, ``bash /tests/<script>`` from the working directory.
   The agent never saw any of the three: they exist only in the verifier's sandbox. An isolated
   verifier's ``bash`` is the image's, by its absolute path, and its ``PATH`` has no entry inside the
   working directory (imageenv.verifier_commands, SPEC §21).
4. Grading is the executor's, on what it captured and read after the verifier ended: ``run_verifier``
   returns the run (its output, its /logs/verifier folder) to the task's grader (evaluations/grading/),
   which reads it; ``reward_folder`` makes the same fresh /logs/verifier for a workspace task's scripts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

from evaluations import artifacts, livelog
from evaluations.environments import kinds
from evaluations.grading.base import VerifierRun
from evaluations.models import ErrorKind
from evaluations.network.egress.policy import parse_rules
from evaluations.pipeline import collect, imageenv
from evaluations.pipeline.context import Context, StepFailed
from evaluations.runtime import Mount
from evaluations.safefs import SafeFSError, remove_tree_nofollow, write_file_nofollow
from evaluations.tasks.spec import (
    AGENT,
    AGENT_LOGS,
    ALLOWLIST,
    ARTIFACTS_DIR,
    ENVIRONMENT,
    NO_NETWORK,
    VERIFIER,
    VERIFIER_LOGS,
    NetworkRequest,
    SeparateVerifier,
    SupportFile,
    TaskRequest,
)
from executor_project.config import Config

TESTS = "/tests"


# -- 1. what the task asks for --------------------------------------------------------------------


def apply_request(ctx: Context) -> None:
    """The task's request capped by the operator's settings, as the evaluation's Config; recorded."""
    task = ctx.task
    if task.format == "workspace":  # SPEC §19: SWE-Forge's difficulty, difficulty_score, install_config
        ctx.stage(task_format=task.format, task_metadata=task.metadata)
        return
    request = task.request
    operator = ctx.config
    ctx.config = capped_config(operator, request, ctx.evaluation.timeout_secs)
    applied = ctx.config
    cpus = os.cpu_count() or 1
    limits = {
        "agent_timeout_secs": applied.agent_timeout_secs,
        "verifier_timeout_secs": applied.test_timeout_secs,
        "build_timeout_secs": applied.build_timeout_secs,
        "memory_mb": applied.memory_limit_mb,
        "storage_mb": applied.disk_quota_mb,
        # Not enforced as a quota: the host's cores are shared by MAX_CONCURRENT_EVALS (docs/tasks.md).
        "cpus": min(float(request.cpus), float(cpus)) if request.cpus is not None else None,
        **_network_limits("", request.phase_network(ENVIRONMENT)),  # network, allowed_hosts: [environment]'s
        "agent_network": agent_network(ctx),
        "verifier_network": verifier_network(ctx),
        **_network_limits("agent_", request.phase_network(AGENT)),
        **_network_limits("verifier_", request.phase_network(VERIFIER)),
    }
    separate = task.verifier.separate if task.verifier is not None and not task.steps else None
    if separate is not None:  # SPEC §23: a task of [[steps]] has each step's (multistep.TaskSteps)
        ctx.verifier_memory_mb = limits["verifier_memory_mb"] = separate_memory(operator, separate)
    ctx.stage(task_format=task.format, limits_applied=limits, task_metadata=task.metadata)


def separate_memory(config: Config, separate: SeparateVerifier | None) -> int | None:
    """A separate verifier's memory limit (SPEC §23): its environment's own ([verifier.environment], else
    [environment]'s) capped by ``config``'s (the operator's); None for a verifier on the agent's root."""
    return None if separate is None else _capped(separate.memory_mb, config.memory_limit_mb)


def capped_config(config: Config, request: TaskRequest, asked_timeout: int | None) -> Config:
    """``config`` (the operator's) with ``request``'s timeouts, memory and storage, each capped by it;
    ``asked_timeout``: the evaluation's own timeout_secs, if it set one. A multi-step task's steps each
    apply theirs to the same operator's config (pipeline/multistep.py)."""
    timeout = asked_timeout or config.agent_timeout_secs
    return dataclasses.replace(
        config,
        agent_timeout_secs=_capped(request.agent_timeout_secs, min(timeout, config.agent_timeout_secs)),
        test_timeout_secs=_capped(request.verifier_timeout_secs, config.test_timeout_secs),
        build_timeout_secs=_capped(request.build_timeout_secs, config.build_timeout_secs),
        memory_limit_mb=_capped(request.memory_mb, config.memory_limit_mb),
        disk_quota_mb=_capped(request.storage_mb, config.disk_quota_mb),
    )


def _capped(asked, limit):
    """What the task asked, within the operator's ``limit`` (the smaller wins); ``limit`` if it asked nothing."""
    return limit if asked is None else max(1, min(limit, math.ceil(asked)))


def _network_limits(prefix: str, network: NetworkRequest) -> dict:
    """What the task asked of one phase's network: ``<prefix>network_mode`` (``network`` for
    [environment]'s) and ``<prefix>allowed_hosts`` (null unless an allowlist)."""
    hosts = list(network.allowed_hosts) if network.mode == ALLOWLIST else None
    return {f"{prefix}network_mode" if prefix else "network": network.mode, f"{prefix}allowed_hosts": hosts}


def agent_network(ctx: Context) -> bool:
    """Whether the agent's commands have the network (the proxy): AGENT_NETWORK and the task's agent phase."""
    return ctx.config.agent_network and ctx.task.request.phase_network(AGENT).mode != NO_NETWORK


def verifier_network(ctx: Context) -> bool:
    """Whether the tests' commands have the network (the proxy): TEST_NETWORK and the task's verifier phase."""
    return ctx.config.test_network and ctx.task.request.phase_network(VERIFIER).mode != NO_NETWORK


def phase_egress(ctx: Context, phase: str) -> None:
    """The evaluation's proxy as ``phase`` (AGENT, VERIFIER) begins: the operator's rules (EGRESS_*),
    narrowed to the phase's ``allowed_hosts`` when its network is an allowlist (a destination the list
    does not name is refused; one it names is still the operator's to allow), to nothing when it is
    ``no-network``. One proxy serves the evaluation, its policy switched between phases: a connection
    is decided by the policy of the phase that made it. The build is not a phase of the task's (its
    RUN steps fetch as BUILD_NETWORK says), nor is the clone (steps.cloning_repo)."""
    if ctx.egress is None:
        return
    network = ctx.task.request.phase_network(phase)
    policy = ctx.egress.policy
    if network.mode == ALLOWLIST:
        rules = parse_rules(",".join(network.allowed_hosts), "allowed_hosts")  # checked by the reader
        ctx.egress.policy = policy.only(rules, f"the task's allowed_hosts ({phase})")
    elif network.mode == NO_NETWORK:
        ctx.egress.policy = policy.only((), f"the task's network_mode ({phase}): no-network")
    else:
        ctx.egress.policy = policy.widened()


# -- 2. /logs/agent, and after the agent --------------------------------------------------------


def agent_mounts(ctx: Context) -> list[Mount]:
    """In an image: /logs/agent and /logs/artifacts, writable (the session's agent-logs/ and
    agent-artifacts/, or their <step>/ folders, counted by its disk quota: collect.agent_logs), and
    /logs/verifier, empty and writable (verifier/logs, made fresh: removed with what the agent left in
    it when ``run_verifier`` makes the verifier's)."""
    if not ctx.env.agent_logs:
        return []
    folder, artifacts_folder = collect.agent_folders(ctx)
    _tests, logs = _verifier_folders(ctx, [], owner=(ctx.session.uid, ctx.session.uid))  # the agent's, here
    for target in (AGENT_LOGS, ARTIFACTS_DIR, VERIFIER_LOGS):
        _mount_point(ctx, target)
    return [
        Mount(folder, AGENT_LOGS, writable=True),
        Mount(artifacts_folder, ARTIFACTS_DIR, writable=True),
        Mount(logs, VERIFIER_LOGS, writable=True),
    ]


def after_agent(ctx: Context) -> None:
    """With no process of the agent alive: what it changed outside its folder, and its artifacts:
    /logs/agent's files, and /logs/artifacts' and the task's ``artifacts`` (collect.sources)."""
    if not ctx.env.agent_logs:
        return
    kept = artifacts.keep_sources(ctx.eval_id, collect.sources(ctx), ctx.config)
    ctx.placed = kept.placed  # what a separate verifier finds, at the same paths (collect.place)
    if kept.artifacts or kept.omitted or kept.error:
        livelog.append_text(ctx.session.log, livelog.executor_line(kept.summary()))
    ctx.stage(system_changes=imageenv.system_changes(ctx), artifacts=kept.artifacts)


def _mount_point(ctx: Context, target: str) -> None:
    """A real folder at ``target`` where the environment's root needs one (kinds.make_mount_point)."""
    try:
        ctx.env.mount_point(target)
    except (OSError, SafeFSError) as exc:
        raise StepFailed(f"could not make {target} in the image: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None


# -- 3. the verifier ------------------------------------------------------------------------------


def run_verifier(ctx: Context, env: dict[str, str]) -> VerifierRun:
    """Harbor / Terminal-Bench: the task's verifier after the agent, once; its processes swept after."""
    verifier = ctx.task.verifier
    config = ctx.config
    if verifier.isolated:
        _isolate(ctx)
    tests, logs = _verifier_folders(ctx, verifier.files)
    mounts = [Mount(logs, VERIFIER_LOGS, writable=True)]
    if verifier.separate is None or not verifier.separate.bundled:  # a bundled image's /tests is its own
        mounts.insert(0, Mount(tests, TESTS))
    if verifier.separate is None and ctx.env.agent_logs and collect.agent_logs(ctx).exists():
        mounts.append(Mount(collect.agent_logs(ctx), AGENT_LOGS))  # what the agent left, read-only
        # Harbor mounts the trial's artifacts folder in every phase: a shared verifier finds there what
        # the agent (or a service) left, and may add to it; what it adds is not collected (read before it).
        mounts.append(Mount(collect.agent_artifacts(ctx), ARTIFACTS_DIR, writable=True))
    for mount in mounts:
        _mount_point(ctx, mount.target)
    network = verifier_network(ctx)
    policy = ctx.task_policy(network=network, mounts=mounts, user=kinds.VERIFIER_USER)
    env = {**env, **verifier.env}
    shell = "bash"
    if verifier.isolated:  # the image's own bash, PATH without the working directory (SPEC §21)
        shell, env = imageenv.verifier_commands(ctx, env, shell)
    script = f"{TESTS}/{verifier.script}"
    livelog.append_text(ctx.session.log, livelog.test_marker(verifier.script))
    started = time.monotonic()
    result = ctx.run([shell, script], env=env, timeout_secs=config.test_timeout_secs, policy=policy)
    duration = int((time.monotonic() - started) * 1000)
    ctx.spawner.sweep()
    output = result.output
    if result.timed_out:
        output += f"\n[executor: killed, the verifier's timeout ({config.test_timeout_secs} s) ran out]"
    elif result.limit_detail:
        output += f"\n[executor: {result.limit_detail}]"
    return VerifierRun(verifier.script, result, output, duration, logs)


def reward_folder(ctx: Context):
    """A workspace.yaml task graded by ``reward_file``: its scripts' /logs/verifier, empty."""
    if not ctx.runtime.isolated:
        raise StepFailed(
            "grader reward_file needs the sandbox (/logs/verifier is a mount); this executor runs without one",
            kind=ErrorKind.INFRASTRUCTURE,
        )
    _tests, logs = _verifier_folders(ctx, [])
    _mount_point(ctx, VERIFIER_LOGS)
    return logs


def _verifier_folders(ctx: Context, files: list[SupportFile], owner: tuple[int, int] | None = None):
    """verifier/tests (root's, the task's files) and verifier/logs (empty, ``owner``'s, else the
    verifier's user's: the sandbox uid unless an image's verifier runs as another), made fresh."""
    folder = ctx.session.verifier
    try:
        if os.path.lexists(folder):
            remove_tree_nofollow(folder)
        ctx.session.make_folder(folder, 0o755)
        tests = folder / "tests"
        ctx.session.make_folder(tests, 0o755)
        for support in files:
            write_file_nofollow(tests, support.relpath, support.data, support.mode)
        _open_folders(tests)
        logs = folder / "logs"
        # the verifier's user (SPEC §23), the agent's unless told
        ctx.session.make_folder(logs, 0o755, owner=owner or ctx.env.verifier_owner())
    except (OSError, SafeFSError) as exc:
        raise StepFailed(f"could not write the verifier's files: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None
    return tests, logs


def _open_folders(tests) -> None:
    for folder, subdirs, _files in os.walk(tests):
        for name in subdirs:
            os.chmod(os.path.join(folder, name), 0o755)


def _isolate(ctx: Context) -> None:
    """``[verifier] isolated``: the image plus only the working directory as the agent left it."""
    try:
        imageenv.isolate(ctx)
    except OSError as exc:
        raise StepFailed(f"could not isolate the working directory: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None
