"""The environment's own processes (SPEC §23): its first process, started before the agent as a
container's main process starts, and its healthcheck, which must pass before the agent runs.

1. ``start_service`` is the one way the pipeline starts a process of the environment beside its
   commands: in a sandbox of its own (``Spawner.background``), with the task's policy (its root,
   the image's user, the session's folders) and no egress, in the environment's network namespace
   (``ctx.netns``, runtime/netns.py) that the agent's and the verifier's sandboxes join too, so
   they reach it on 127.0.0.1. It keeps running through the agent and the verifier (a sweep spares
   it) and is stopped at cleanup, its output then written to the evaluation's log.
2. ``starting_environment`` runs, before the task's install commands and the agent: the image's
   ENTRYPOINT with the command Harbor's docker backend gives its main container (``first_process``),
   then ``[environment.healthcheck]`` with Harbor's semantics (``await_healthy``).
3. A first process that ends is no error by itself (its exit status and output go to the log); the
   healthcheck is what a task uses to say its environment must be up.
"""

from __future__ import annotations

import shlex
import threading
import time
from pathlib import Path

from evaluations import livelog
from evaluations.environments import kinds
from evaluations.models import ErrorKind
from evaluations.pipeline import static
from evaluations.pipeline.context import Context, StepFailed, last_line
from evaluations.runtime import Limit, SandboxPolicy
from evaluations.runtime.background import Background
from evaluations.runtime.netns import NetworkUnavailable, SharedNetwork
from evaluations.tasks.compose import keeps_alive
from evaluations.tasks.spec import FirstProcess, Healthcheck, ImageEnvironment

ENTRYPOINT = "entrypoint"
_CANCEL_POLL_SECS = 0.1  # how soon a wait between two checks sees a cancel


def start_service(
    ctx: Context, name: str, argv: list[str], *, env: dict[str, str], policy: SandboxPolicy
) -> Background:
    """Start ``argv`` as a process of the evaluation's environment, beside its commands, from the
    working directory; stopped (and its output logged) when the evaluation's ``closing`` closes."""
    limits = ctx.limits(ctx.config.agent_timeout_secs)  # its rlimits and output cap; it has no timeout
    livelog.append_text(ctx.session.log, livelog.executor_line(f"{name}: starting {shlex.join(argv)}"))
    started = ctx.spawner.background(name, argv, cwd=Path(ctx.workdir), env=env, limits=limits, policy=policy)
    ctx.closing.callback(_stop, ctx, started)
    return started


def _stop(ctx: Context, started: Background) -> None:
    code = started.exit_code
    started.stop()
    how = "running until the end" if code is None else f"exit {code}"
    log = ctx.session.log
    livelog.append_text(log, livelog.executor_line(f"=== {started.name} ({how}) ==="))
    output = started.output()
    if output:
        livelog.append_text(log, livelog.unmarked(output if output.endswith("\n") else output + "\n"))


def environment_network(ctx: Context) -> None:
    """The environment's network namespace, made once and joined by every later task command."""
    if ctx.netns is not None:
        return
    try:
        ctx.netns = SharedNetwork.create()
    except NetworkUnavailable as exc:
        raise StepFailed(str(exc), kind=ErrorKind.INFRASTRUCTURE) from None
    ctx.closing.callback(ctx.netns.close)


def first_process(config: dict, spec: FirstProcess) -> list[str] | None:
    """The argv a container of the image (``config``) starts with, as Docker joins them: the
    entrypoint (the compose service's, else the image's ``Entrypoint``) then the command (the compose
    service's, else the image's ``Cmd``, which a compose ``entrypoint`` drops). None when nothing
    would run but a command that only keeps a container alive (Harbor's ``sleep infinity``)."""
    entrypoint = list(spec.entrypoint) if spec.entrypoint is not None else _words(config, "Entrypoint")
    if spec.command is not None:
        command = list(spec.command)
    else:
        command = [] if spec.entrypoint is not None else _words(config, "Cmd")
    argv = entrypoint + command
    if not argv or (not entrypoint and keeps_alive(command)):
        return None
    return argv


def _words(config: dict, key: str) -> list[str]:
    value = config.get(key) or []
    if not isinstance(value, list) or not all(isinstance(word, str) for word in value):
        raise StepFailed(
            f"the image's {key} must be a list of strings, got {value!r}"[:300], kind=ErrorKind.TASK_INVALID
        )
    return value


def starting_environment(ctx: Context) -> None:
    """SPEC §23: the image's first process in the background, then the healthcheck, before the agent."""
    start, healthcheck = ctx.task.first_process, ctx.task.healthcheck
    if not isinstance(ctx.task.environment, ImageEnvironment) or (start is None and healthcheck is None):
        return
    argv = first_process(ctx.env.config, start) if start is not None else None
    if argv is None and healthcheck is None:
        return  # nothing runs: the sandboxes keep a network of their own each, as before
    environment_network(ctx)
    env = {**ctx.base_env(), **static.task_env(ctx)}  # [environment.env]: every process of it, this one too
    if argv is not None:
        policy = ctx.task_policy(network=False, user=kinds.IMAGE_USER)  # a container's first process: its User
        start_service(ctx, ENTRYPOINT, argv, env=env, policy=policy)
    if healthcheck is not None:
        await_healthy(ctx, healthcheck, env)


def await_healthy(ctx: Context, healthcheck: Healthcheck, env: dict[str, str]) -> None:
    """Harbor's ``run_healthcheck`` (Docker's HEALTHCHECK): ``bash -c command`` until it exits 0.
    A failure during the start period does not count, and the next check follows after
    ``start_interval_sec``; after it, ``retries`` consecutive failures (``interval_sec`` apart) and
    the environment never became healthy: the task's fault (``task_invalid``), with the last
    check's output. A check over ``timeout_sec`` is a failure (Docker's rule)."""
    policy = ctx.task_policy(network=False, user=kinds.IMAGE_USER)  # Harbor's exec with no user: the image's
    start_period_end = time.monotonic() + healthcheck.start_period_sec
    failures = 0
    log = ctx.session.log
    livelog.append_text(log, livelog.executor_line(f"healthcheck: {healthcheck.command}"))
    with ctx.phase("healthcheck"):  # every check an exec in one sandbox (SPEC §25)
        while True:
            in_start_period = time.monotonic() < start_period_end
            result = ctx.run(
                ["bash", "-c", healthcheck.command], env=env, timeout_secs=healthcheck.timeout_sec, policy=policy
            )
            if result.limit not in (None, Limit.TIMEOUT):
                raise StepFailed(f"{result.limit_detail} in the healthcheck", kind=ErrorKind.LIMIT_EXCEEDED)
            if result.limit is None and result.exit_code == 0:
                livelog.append_text(log, livelog.executor_line("healthcheck: healthy"))
                return
            if in_start_period:
                _wait(ctx, healthcheck.start_interval_sec)
                continue
            failures += 1
            if failures >= healthcheck.retries:
                raise StepFailed(_never_healthy(healthcheck, result), kind=ErrorKind.TASK_INVALID)
            _wait(ctx, healthcheck.interval_sec)


def _never_healthy(healthcheck: Healthcheck, result) -> str:
    how = (
        f"timed out after {healthcheck.timeout_sec:g} s"
        if result.limit is Limit.TIMEOUT
        else f"exited {result.exit_code}"
    )
    return (
        f"environment never became healthy: {healthcheck.command!r} {how} "
        f"{healthcheck.retries} time(s) in a row: {last_line(result.output)}"
    )


def _wait(ctx: Context, seconds: float) -> None:
    """Wait ``seconds`` between two checks; a cancel ends the wait (and the evaluation) at once."""
    deadline = time.monotonic() + seconds
    pause = threading.Event()
    while (left := deadline - time.monotonic()) > 0:
        ctx.check_cancelled()
        pause.wait(min(left, _CANCEL_POLL_SECS))
    ctx.check_cancelled()
