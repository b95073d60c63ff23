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
4. A Harbor task's compose services other than ``main`` (``ctx.services``, their roots prepared by
   preparing_environment in ``<session>/services/<name>``, imageenv.py) start first, in
   ``depends_on`` order (tasks/compose.py), each with ``start_service`` in its own root as its
   image's User or its ``user``, with Docker's environment; every one named in ``/etc/hosts`` of
   every root at 127.0.0.1 (the shared loopback). Each ``service_healthy`` dependency is awaited
   before what depends on it, then every health check (as ``docker compose up --wait``, Harbor's)
   before main's first process and the agent, with Docker's timing (``await_healthy``,
   ``wait_first``): one that never passes, or a service that ends first, is ``task_invalid``.
5. After the agent, [[verifier.collect]] commands run in their service (``collect``), best effort.
6. The compose file's named volumes are folders of the session (``volumes/<name>``, made by
   volumes.make_volumes), bound in main's sandboxes and each service's naming them, as a service's
   Harbor log folders (the session's own folder main has there) are: each root's ``volumes``, bound
   by its ``sandbox_policy`` on mount points made again before every sandbox (kinds.Image.bind_volumes).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import threading
import time
from pathlib import Path

from evaluations import livelog
from evaluations.environments import kinds
from evaluations.environments.kinds import BaseEnvironment
from evaluations.images import rootfs
from evaluations.images.errors import ImageError
from evaluations.models import ErrorKind
from evaluations.pipeline import static
from evaluations.pipeline.context import Context, StepFailed, environment_failure, last_line
from evaluations.runtime import Limit, SandboxPolicy
from evaluations.runtime.background import Background
from evaluations.runtime.netns import NetworkUnavailable, SharedNetwork
from evaluations.runtime.sandbox import SYSTEM_PATH
from evaluations.runtime.types import ImageRoot
from evaluations.safefs import SafeFSError, write_file_nofollow
from evaluations.tasks.compose import MAIN, keeps_alive
from evaluations.tasks.spec import FirstProcess, Healthcheck, ImageEnvironment, Service

ENTRYPOINT = "entrypoint"
SERVICES_DIR = "services"  # <session>/services/<name>/rootfs: each compose service's root
COLLECT_LOG_BYTES = 4096  # what the log keeps of a [[verifier.collect]] command's output
_CANCEL_POLL_SECS = 0.1  # how soon a wait between two checks sees a cancel


@dataclasses.dataclass
class Running:
    """A compose service of the evaluation: its root (prepared), then its process (started)."""

    service: Service
    environment: kinds.ServiceImage
    policy: SandboxPolicy | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    process: Background | None = None  # None: nothing to run but what keeps a container alive
    healthy: bool = False


def start_service(
    ctx: Context,
    name: str,
    argv: list[str],
    *,
    env: dict[str, str],
    policy: SandboxPolicy,
    cwd: str | None = None,
) -> Background:
    """Start ``argv`` as a process of the evaluation's environment, beside its commands, from the
    working directory (``cwd``: another, a compose service's); stopped (and its output logged) when
    the evaluation's ``closing`` closes."""
    limits = ctx.limits(ctx.config.agent_timeout_secs)  # its rlimits and output cap; it has no timeout
    livelog.append_text(ctx.session.log, livelog.executor_line(f"{name}: starting {shlex.join(argv)}"))
    where = Path(cwd or ctx.workdir)
    started = ctx.spawner.background(
        name, argv, cwd=where, env=env, limits=limits, policy=policy, init_base=ctx.config.workspace_base
    )
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
    """SPEC §23: the compose services, then the image's first process in the background, then the
    healthcheck, before the agent."""
    start_services(ctx)
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


def await_healthy(
    ctx: Context,
    healthcheck: Healthcheck,
    env: dict[str, str],
    *,
    policy: SandboxPolicy | None = None,
    environment: BaseEnvironment | None = None,
    who: str = "environment",
    wait_first: bool = False,
    ended=None,
) -> None:
    """Harbor's ``run_healthcheck`` (Docker's HEALTHCHECK): its command (``bash -c``, or a compose
    test's argv) until it exits 0. A failure during the start period does not count, and the next
    check follows after ``start_interval_sec``; after it, ``retries`` consecutive failures
    (``interval_sec`` apart) and ``who`` never became healthy: the task's fault (``task_invalid``),
    with the last check's output. A check over ``timeout_sec`` is a failure (Docker's rule).
    ``wait_first``: Docker's own timing (a compose service's), the first check after an interval
    too, where Harbor checks at once; ``ended()``: how the checked process ended, or None while it
    runs (an end is never healthy); ``policy`` and ``environment``: what it runs in (default the
    task's, as the image's User: Harbor's exec with no user)."""
    if policy is None:
        policy = ctx.task_policy(network=False, user=kinds.IMAGE_USER)
    livelog.append_text(ctx.session.log, livelog.executor_line(f"{_label(who)}: {healthcheck.command}"))

    def check():
        return ctx.run(
            healthcheck.run_argv, env=env, timeout_secs=healthcheck.timeout_sec, policy=policy, environment=environment
        )

    with ctx.phase(_label(who)):  # every check an exec in one sandbox (SPEC §25)
        check_until_healthy(
            healthcheck, check, lambda seconds: _wait(ctx, seconds), who, wait_first=wait_first, ended=ended
        )
    livelog.append_text(ctx.session.log, livelog.executor_line(f"{_label(who)}: healthy"))


def check_until_healthy(
    healthcheck: Healthcheck, check, wait, who: str, *, wait_first: bool = False, ended=None
) -> None:
    """Docker's HEALTHCHECK loop, the one both evaluations (``await_healthy``) and live sandboxes
    (sandboxes/host.py) run: ``check()`` runs the command once (a CommandResult), ``wait(seconds)``
    pauses between two (and raises to stop), ``ended()`` says how the checked process ended (None
    while it runs). Returns once a check exits 0; StepFailed (``task_invalid``, ``limit_exceeded``)
    when ``who`` never becomes healthy."""
    start_period_end = time.monotonic() + healthcheck.start_period_sec
    failures = 0

    def pause() -> None:
        in_start_period = time.monotonic() < start_period_end
        wait(healthcheck.start_interval_sec if in_start_period else healthcheck.interval_sec)

    if wait_first:
        pause()
    while True:
        gone = ended() if ended is not None else None
        if gone is not None:
            raise StepFailed(f"{who} never became healthy: {gone}", kind=ErrorKind.TASK_INVALID)
        in_start_period = time.monotonic() < start_period_end
        result = check()
        if result.limit not in (None, Limit.TIMEOUT):
            raise StepFailed(f"{result.limit_detail} in {_label(who)}", kind=ErrorKind.LIMIT_EXCEEDED)
        if result.limit is None and result.exit_code == 0:
            return
        if not in_start_period:
            failures += 1
            if failures >= healthcheck.retries:
                raise StepFailed(_never_healthy(who, healthcheck, result), kind=ErrorKind.TASK_INVALID)
        pause()


def _label(who: str) -> str:
    return "healthcheck" if who == "environment" else f"healthcheck of {who}"


def _never_healthy(who: str, healthcheck: Healthcheck, result) -> str:
    how = (
        f"timed out after {healthcheck.timeout_sec:g} s"
        if result.limit is Limit.TIMEOUT
        else f"exited {result.exit_code}"
    )
    return (
        f"{who} never became healthy: {healthcheck.command!r} {how} "
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


# -- a Harbor task's compose services (SPEC §23) ------------------------------------------------------


def start_services(ctx: Context) -> None:
    """Each compose service in ``depends_on`` order, after what it waits for (``service_healthy``:
    its check passed); then every check, as ``docker compose up --wait``."""
    if not ctx.services:
        return
    environment_network(ctx)
    for running in ctx.services.values():  # in start order (tasks/compose.py)
        for other, condition in running.service.depends_on.items():
            if condition == "service_healthy":
                _await(ctx, ctx.services[other])
        _start_one(ctx, running)
    for running in ctx.services.values():
        _await(ctx, running)


def _start_one(ctx: Context, running: Running) -> None:
    service, environment = running.service, running.environment
    shown = f"service {service.name!r}"
    config = environment.config  # the image's, its User and WorkingDir the service's when it names them
    argv = service_argv(service, config)
    ca = ctx.trusted_ca
    with environment_failure():  # its compose volumes bound too (kinds.Image.bind_volumes)
        running.policy = environment.sandbox_policy(
            network=False,  # no relay: its loopback is the environment's, nothing more
            ca_bundle=ca.host if ca is not None else None,
            user=kinds.IMAGE_USER,  # its image's User, or its compose ``user``
            netns=ctx.netns.path,
        )
    running.env = service_env(service, config, user_home(running.policy.image.rootfs, running.policy.image.ids[0]))
    if argv is None:  # only what keeps a container alive: its root serves its checks and hooks
        livelog.append_text(ctx.session.log, livelog.executor_line(f"{shown}: nothing to start"))
        return
    running.process = start_service(ctx, shown, argv, env=running.env, policy=running.policy, cwd=environment.workdir)


def service_argv(service: Service, config: dict) -> list[str] | None:
    """What a compose service's container starts with (``first_process``; None: only what keeps a
    container alive); StepFailed when it has nothing at all to run. ``config``: its image's."""
    argv = first_process(config, FirstProcess(entrypoint=service.entrypoint, command=service.command))
    if argv is None and not (service.entrypoint or service.command or config.get("Entrypoint") or config.get("Cmd")):
        raise StepFailed(
            f"environment/docker-compose.yaml: service {service.name!r} has nothing to run (no command or "
            "entrypoint, and its image has no Cmd or Entrypoint)"
        )
    return argv


def service_env(service: Service, config: dict, home: str) -> dict[str, str]:
    """As Docker's: PATH, HOME (its user's, ``user_home``) and HOSTNAME, then the image's Env, then
    the service's ``environment``."""
    items = config.get("Env") or []
    image_env = dict(item.split("=", 1) for item in items if isinstance(item, str) and "=" in item)
    return {"PATH": SYSTEM_PATH, "HOME": home or "/", "HOSTNAME": service.name, **image_env, **service.env}


def user_home(root: Path, uid: int, default: str = "/") -> str:
    """The home of ``uid`` (inside) in the image's /etc/passwd under ``root``; ``default`` without one."""
    return next((row[5] for row in rootfs.table(root, "/etc/passwd") if row[2] == str(uid) and len(row) > 5), default)


def _await(ctx: Context, running: Running) -> None:
    """The service's health check passed (once; nothing without one); else task_invalid."""
    service = running.service
    if service.healthcheck is None or running.healthy:
        return

    def ended() -> str | None:
        process = running.process
        if process is None or process.exit_code is None:
            return None
        output = last_line(process.output())
        return f"it exited with code {process.exit_code}" + (f": {output}" if output else "")

    _bind_volumes(running)
    await_healthy(
        ctx,
        service.healthcheck,
        running.env,
        policy=running.policy,
        environment=running.environment,
        who=f"service {service.name!r}",
        wait_first=True,
        ended=ended,
    )
    running.healthy = True


def _bind_volumes(running: Running) -> None:
    """A service's volumes' mount points made again before a sandbox of its policy (made once, at its
    start): its process may have changed its root since (kinds.Image.bind_volumes)."""
    with environment_failure():
        running.environment.bind_volumes()


def host_names(ctx: Context) -> list[str]:
    """The names at 127.0.0.1 in every root: main, and each service."""
    return [MAIN, *ctx.services]


def write_all_hosts(ctx: Context) -> None:
    """/etc/hosts in every root of the evaluation: main's, each separate verifier's, each service's."""
    names = host_names(ctx)
    roots = [ctx.env, *ctx.separate_envs(), *(running.environment for running in ctx.services.values())]
    for environment in roots:
        if environment is not None:
            write_hosts(environment.mounted, names)


def write_hosts(root: ImageRoot, names: list[str]) -> None:
    """/etc/hosts in ``root``: localhost, and every service's name, at 127.0.0.1 (the shared
    loopback), written as the image's root owns it, nothing on the way followed."""
    text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
        f"127.0.0.1\t{name}\n" for name in names
    )
    try:
        kinds.make_mount_point(root, "/etc")  # a real folder, made if missing, nothing followed
        write_file_nofollow(root.rootfs, "etc/hosts", text.encode(), 0o644)
        fd = os.open(root.rootfs / "etc", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.chown("hosts", root.idmap.host_uid(0), root.idmap.host_gid(0), dir_fd=fd, follow_symlinks=False)
        finally:
            os.close(fd)
    except (OSError, SafeFSError) as exc:
        raise StepFailed(f"could not write /etc/hosts for the services: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None


def collect(ctx: Context) -> None:
    """Each [[verifier.collect]] command in its service, in order, after the agent (Harbor's hooks),
    as ``sh -c``: main's in the task's root, a service's in its own, as its user (the image's User,
    as Harbor's exec with no user) or the hook's. Best effort, as Harbor's: its exit and output go
    to the log, a failure never ends the evaluation."""
    if not ctx.task.collect:
        return
    with ctx.phase("collect"):  # a phase's init switches to each hook's user (SPEC §25)
        for index, hook in enumerate(ctx.task.collect):
            _collect_one(ctx, index, hook)


def _collect_one(ctx: Context, index: int, hook) -> None:
    shown = f"collect {index + 1} in service {hook.service!r}"
    if hook.service == MAIN:
        environment, env = ctx.env, {**ctx.base_env(), **static.task_env(ctx)}
        policy = ctx.task_policy(network=False, user=kinds.IMAGE_USER)
    else:
        running = ctx.services[hook.service]
        environment, env, policy = running.environment, running.env, running.policy
        _bind_volumes(running)
    try:
        if hook.user is not None:
            ids = kinds.user_ids(policy.image, hook.user)
            policy = dataclasses.replace(policy, image=dataclasses.replace(policy.image, run_as=ids))
    except ImageError as exc:
        livelog.append_text(ctx.session.log, livelog.executor_line(f"{shown}: user {hook.user!r}: {exc}"))
        return
    result = ctx.run(
        ["/bin/sh", "-c", hook.command],
        env=env,
        timeout_secs=hook.timeout_secs,
        policy=policy,
        environment=environment,
    )
    how = f"exit code {result.exit_code}" if result.limit is None else (result.limit_detail or "stopped")
    text = livelog.executor_line(f"{shown}: {how}")
    if result.output.strip():
        text += livelog.unmarked(result.output[-COLLECT_LOG_BYTES:].rstrip("\n") + "\n")
    livelog.append_text(ctx.session.log, text)
