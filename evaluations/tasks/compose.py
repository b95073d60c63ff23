"""A task's docker-compose file, as the Harbor and Terminal-Bench readers share it (SPEC §17, §22,
§23): its single service, or (Harbor) its ``main`` service and every other one as a ``Service``, and a
service's working_dir, command and volumes read as Compose would run them."""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from evaluations.tasks.readers import (
    CONTROL_CHARS,
    folder_files,
    image_environment,
    inside_task,
    load_yaml_mapping,
    type_name,
)
from evaluations.tasks.spec import (
    AGENT_LOGS,
    ARTIFACTS_DIR,
    VERIFIER_LOGS,
    Healthcheck,
    ImageEnvironment,
    Service,
    ServiceVolume,
    SupportFile,
    TaskError,
)

COMPOSE_NAMES = ("docker-compose.yaml", "docker-compose.yml")
# Keys that change nothing for a task run in one container here: its name, a terminal, Compose's
# own resource hints (the operator's limits apply), the image name a build is tagged with.
IGNORED_SERVICE_KEYS = ("container_name", "tty", "stdin_open", "deploy", "labels", "restart", "init", "image")
MAIN = "main"  # Harbor's name for the agent's service (MAIN_SERVICE_NAME)
SERVICE_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")  # Harbor's _COMPOSE_SERVICE_NAME_PATTERN


def _compose_file(folder: Path, prefix: str) -> tuple[str, dict, dict] | None:
    """(shown name, services mapping, whole file) of ``folder``'s docker-compose file, or None without one."""
    for name in COMPOSE_NAMES:
        if not os.path.lexists(folder / name):
            continue
        shown = prefix + name
        data, _node = load_yaml_mapping(folder / name, shown)
        services = data.get("services")
        if not isinstance(services, dict) or not services:
            raise TaskError(f"{shown}: 'services' must be a mapping of service names to services")
        return shown, services, data
    return None


def single_service(folder: Path, prefix: str) -> dict | None:
    """The single service of ``folder``'s docker-compose file as {file, name, service}, or None
    without one; several services are refused (a task runs in one container here)."""
    found = _compose_file(folder, prefix)
    if found is not None:
        shown, services, _data = found
        if len(services) > 1:
            names = ", ".join(sorted(str(service) for service in services))
            raise TaskError(f"{shown} has {len(services)} services ({names}); a task runs in one container here")
        ((service_name, service),) = services.items()
        if not isinstance(service, dict):
            raise TaskError(f"{shown}: service {service_name!r} must be a mapping")
        return {"file": shown, "name": str(service_name), "service": service}
    return None


# -- a Harbor task's services (SPEC §23) ---------------------------------------------------------

# What a service other than main may say. ``ports`` and ``expose`` change nothing: its ports are on
# the loopback it shares with the agent, reached at name:port, and nothing is published on the host.
SIDECAR_KEYS = (
    "image",
    "build",
    "command",
    "entrypoint",
    "environment",
    "healthcheck",
    "depends_on",
    "working_dir",
    "user",
    "ports",
    "expose",
    "volumes",
)
_SIDECAR_IGNORED = tuple(key for key in IGNORED_SERVICE_KEYS if key != "image")
_BUILD_KEYS = ("context", "dockerfile", "args", "target")
_HEALTH_KEYS = ("test", "interval", "timeout", "retries", "start_period", "start_interval", "disable")
_CONDITIONS = ("service_started", "service_healthy")
_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?(?:ns|us|µs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # Compose's names: lower case too
_HOST_VARIABLE = re.compile(r"\$(?:\{|[A-Za-z_])")


@dataclass(frozen=True)
class ComposeServices:
    """environment/docker-compose.yaml as Harbor reads it: ``main`` (the agent's service, as
    {file, name, service}) and the others, in the order they start."""

    main: dict | None
    services: tuple[Service, ...]
    volumes: tuple[ServiceVolume, ...] = ()  # main's named volumes (its other volumes stay in its service)


def harbor_services(root: Path) -> ComposeServices:
    """The task's environment/docker-compose.yaml: its ``main`` service (None without one: main is then
    the task's environment alone, as Harbor's own compose file makes it), and every other one read as a
    ``Service`` in ``depends_on`` order; each refusal names the file, the service and the key."""
    found = _compose_file(root / "environment", "environment/")
    if found is None:
        return ComposeServices(None, ())
    shown, raw, data = found
    declared = _declared_volumes(shown, data.get("volumes"))
    for name, service in raw.items():
        if not isinstance(name, str) or not SERVICE_NAME.fullmatch(name):
            raise TaskError(
                f"{shown}: service name {name!r} must start with a letter or digit and hold only letters, "
                "digits, '_', '.' and '-'"
            )
        if not isinstance(service, dict):
            raise TaskError(f"{shown}: service {name!r} must be a mapping")
    if MAIN not in raw:
        # Harbor lays the task's file over its own, whose main is the task's environment (its Dockerfile or
        # docker_image): a file without main has only services beside it, whatever their number or names.
        services = {name: _service(root, shown, name, service, declared) for name, service in raw.items()}
        return ComposeServices(None, tuple(_start_order(shown, services)))
    main_volumes, main_binds = _service_volumes(shown, MAIN, raw[MAIN], declared, main=True)
    main_service = {**raw[MAIN], "volumes": main_binds} if "volumes" in raw[MAIN] else raw[MAIN]
    main = {"file": shown, "name": MAIN, "service": main_service}
    services = {name: _service(root, shown, name, service, declared) for name, service in raw.items() if name != MAIN}
    _depends_on(shown, MAIN, raw[MAIN], services)  # checked: main starts after what it names, as every service does
    return ComposeServices(main, tuple(_start_order(shown, services)), main_volumes)


def _service(root: Path, shown: str, name: str, service: dict, declared: frozenset[str]) -> Service:
    where = f"{shown}: service {name!r}"
    for key in service:
        if isinstance(key, str) and key.startswith("x-"):
            continue  # Compose's own extension keys: ignored, as Compose ignores them
        if key not in SIDECAR_KEYS + _SIDECAR_IGNORED:
            raise TaskError(f"{where}: key {key!r} is not supported here (a service may say {', '.join(SIDECAR_KEYS)})")
    if service.get("build") is not None:
        environment = _build(root, where, service["build"])
    elif service.get("image") is not None:
        _literal(service["image"], f"{where}: 'image'")
        environment = image_environment(service["image"], f"{where}: 'image'", where)
    else:
        raise TaskError(f"{where} has neither 'image' nor 'build': it has nothing to run")
    user = service.get("user")
    if user is not None:
        if isinstance(user, int) and not isinstance(user, bool):
            user = str(user)
        if not isinstance(user, str) or not user or CONTROL_CHARS.search(user) or " " in user:
            raise TaskError(f"{where}: 'user' must be a user name or uid (as in 1000 or app:app), got {user!r}")
    return Service(
        name=name,
        environment=environment,
        command=service_argv(service, "command", where),
        entrypoint=service_argv(service, "entrypoint", where),
        env=_environment(service.get("environment"), where),
        workdir=service_workdir(service, where),
        user=user,
        healthcheck=_healthcheck(service.get("healthcheck"), where),
        depends_on=_depends_on(shown, name, service, None),
        volumes=_service_volumes(shown, name, service, declared)[0],
    )


def _build(root: Path, where: str, build: object) -> ImageEnvironment:
    """``build: DIR`` or ``build: {context, dockerfile, args, target}``: the context a folder of
    environment/ (the compose file's), the Dockerfile inside it; built as main's is."""
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        raise TaskError(f"{where}: 'build' must be a folder or a mapping of {', '.join(_BUILD_KEYS)}")
    for key in build:
        if key not in _BUILD_KEYS:
            raise TaskError(f"{where}: 'build' key {key!r} is not supported here (only {', '.join(_BUILD_KEYS)})")
    context = build.get("context", ".")
    if not isinstance(context, str):
        raise TaskError(f"{where}: 'build' 'context' must be a folder of environment/, got {type_name(context)}")
    context = inside_task(context, root / "environment", f"{where}: 'build' 'context'", want_dir=True)
    context = posixpath.normpath(posixpath.join("environment", context))
    dockerfile = build.get("dockerfile", "Dockerfile")
    if not isinstance(dockerfile, str):
        raise TaskError(f"{where}: 'build' 'dockerfile' must be a path in its context, got {type_name(dockerfile)}")
    dockerfile = inside_task(dockerfile, root / context, f"{where}: 'build' 'dockerfile'", want_dir=False)
    target = build.get("target")
    if target is not None and (not isinstance(target, str) or not target):
        raise TaskError(f"{where}: 'build' 'target' must be a stage name, got {target!r}")
    args = _environment(build.get("args"), f"{where}: 'build' 'args'", key="args")
    return ImageEnvironment(
        dockerfile=posixpath.join(context, dockerfile), context=context, build_args=args, target=target
    )


def _literal(value: str, where: str) -> str:
    """A value as written, ``$$`` an escaped ``$``; a value Compose would take from the host's
    environment (``$VAR``, ``${VAR}``) is refused as [environment.env] refuses it."""
    if _HOST_VARIABLE.search(value.replace("$$", "")):
        raise TaskError(
            f"{where} takes a value from the host's environment ({value[:100]}); "
            "this executor passes nothing of its own environment to a task"
        )
    if "\0" in value:
        raise TaskError(f"{where} contains a NUL byte")
    return value.replace("$$", "$")


def _environment(value: object, where: str, *, key: str = "environment") -> dict[str, str]:
    """``environment`` (or ``build.args``): a mapping of names to literal values, or a list of
    NAME=value; a name alone (the host's value) is refused."""
    if value is None:
        return {}
    shown = where if key == "args" else f"{where}: {key!r}"
    if isinstance(value, list):
        pairs = []
        for item in value:
            if not isinstance(item, str):
                raise TaskError(f"{shown} entries must be NAME=value strings, got {type_name(item)}")
            name, equals, text = item.partition("=")
            if not equals:
                raise TaskError(
                    f"{shown} {name!r} takes its value from the host's environment; "
                    "this executor passes nothing of its own environment to a task"
                )
            pairs.append((name, text))
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise TaskError(f"{shown} must be a mapping of names to values or a list of NAME=value")
    env = {}
    for name, text in pairs:
        if not isinstance(name, str) or not _VARIABLE.fullmatch(name):
            raise TaskError(f"{shown}: {name!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if text is None:
            raise TaskError(
                f"{shown}: {name} takes its value from the host's environment; "
                "this executor passes nothing of its own environment to a task"
            )
        if isinstance(text, bool):
            text = "true" if text else "false"
        elif isinstance(text, int | float):
            text = str(text)
        if not isinstance(text, str):
            raise TaskError(f"{shown}: {name} must be a string, a number or a boolean, got {type_name(text)}")
        env[name] = _literal(text, f"{shown}: {name}")
    return env


def _healthcheck(value: object, where: str) -> Healthcheck | None:
    if value is None:
        return None
    shown = f"{where}: 'healthcheck'"
    if not isinstance(value, dict):
        raise TaskError(f"{shown} must be a mapping of {', '.join(_HEALTH_KEYS)}")
    for key in value:
        if key not in _HEALTH_KEYS:
            raise TaskError(f"{shown} key {key!r} is not supported (only {', '.join(_HEALTH_KEYS)})")
    disable = value.get("disable", False)
    if not isinstance(disable, bool):
        raise TaskError(f"{shown} 'disable' must be true or false, got {type_name(disable)}")
    test = value.get("test")
    if disable or test == ["NONE"]:
        return None
    if isinstance(test, str):
        argv = ("/bin/sh", "-c", _literal(test, f"{shown} 'test'"))
    elif isinstance(test, list) and len(test) >= 2 and all(isinstance(item, str) for item in test):
        words = [_literal(item, f"{shown} 'test'") for item in test]
        if words[0] == "CMD":
            argv = tuple(words[1:])
        elif words[0] == "CMD-SHELL" and len(words) == 2:
            argv = ("/bin/sh", "-c", words[1])
        else:
            raise TaskError(f"{shown} 'test' must start with CMD (an argv) or CMD-SHELL (one command), got {test!r}")
    else:
        raise TaskError(f"{shown} 'test' must be a command (a string, or a list starting with CMD or CMD-SHELL)")
    retries = value.get("retries", 3)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
        raise TaskError(f"{shown} 'retries' must be a whole number of at least 1, got {retries!r}")
    return Healthcheck(  # Docker's defaults: every 30 s, within 30 s
        command=shlex.join(argv),
        argv=argv,
        interval_sec=_duration(value, "interval", shown, 30.0),
        timeout_sec=_duration(value, "timeout", shown, 30.0),
        retries=retries,
        start_period_sec=_duration(value, "start_period", shown, 0.0, zero=True),
        start_interval_sec=_duration(value, "start_interval", shown, 5.0),
    )


def _duration(value: dict, key: str, where: str, default: float, *, zero: bool = False) -> float:
    """A Compose duration (``1m30s``, ``500ms``, ``10s``) in seconds."""
    text = value.get(key)
    if text is None:
        return default
    if not isinstance(text, str) or not _DURATION.fullmatch(text.strip()):
        raise TaskError(f"{where} {key!r} must be a duration such as 10s, 500ms or 1m30s, got {text!r}")
    secs = sum(float(amount) * _UNIT_SECS[unit] for amount, unit in _DURATION_PART.findall(text))
    if secs <= 0 and not (zero and secs == 0):
        raise TaskError(f"{where} {key!r} must be longer than 0, got {text!r}")
    return secs


def _depends_on(shown: str, name: str, service: dict, services: dict[str, Service] | None) -> dict[str, str]:
    """``depends_on``: a list of names, or a mapping of names to {condition}; ``services`` (main's
    check) the other services as read, for their names and health checks."""
    value = service.get("depends_on")
    where = f"{shown}: service {name!r}: 'depends_on'"
    if value is None:
        return {}
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        wanted = dict.fromkeys(value, "service_started")
    elif isinstance(value, dict):
        wanted = {}
        for other, spec in value.items():
            spec = spec if spec is not None else {}
            if not isinstance(spec, dict) or not set(spec) <= {"condition", "required", "restart"}:
                raise TaskError(f"{where}: {other!r} must be a mapping with a 'condition'")
            condition = spec.get("condition", "service_started")
            if condition not in _CONDITIONS:
                raise TaskError(
                    f"{where}: {other!r} condition {condition!r} is not supported here (only {', '.join(_CONDITIONS)})"
                )
            wanted[other] = condition
    else:
        raise TaskError(f"{where} must be a list of service names or a mapping of names to {{condition}}")
    for other in wanted:
        if other == name:
            raise TaskError(f"{where} names the service itself")
        if services is not None and other not in services:
            raise TaskError(f"{where} names {other!r}, which is not a service of {shown}")
        if services is not None and wanted[other] == "service_healthy" and services[other].healthcheck is None:
            raise TaskError(f"{where}: {other!r} condition service_healthy, and {other!r} has no healthcheck")
    return wanted


def _start_order(shown: str, services: dict[str, Service]) -> list[Service]:
    """The services in an order where each comes after what it depends on; a cycle is refused."""
    for service in services.values():
        for other, condition in service.depends_on.items():
            where = f"{shown}: service {service.name!r}: 'depends_on'"
            if other == MAIN:
                if condition != "service_started":
                    raise TaskError(f"{where}: 'main' can only be waited for as service_started (it is the agent's)")
                continue
            if other not in services:
                raise TaskError(f"{where} names {other!r}, which is not a service of {shown}")
            if condition == "service_healthy" and services[other].healthcheck is None:
                raise TaskError(f"{where}: {other!r} condition service_healthy, and {other!r} has no healthcheck")
    order: list[Service] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise TaskError(f"{shown}: 'depends_on' makes a cycle ({cycle})")
        state[name] = "visiting"
        for other in services[name].depends_on:
            if other != MAIN:
                visit(other, [*path, name])
        state[name] = "done"
        order.append(services[name])

    for name in services:
        visit(name, [])
    return order


# -- a Harbor task's volumes (SPEC §23) -----------------------------------------------------------

_VOLUME_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")  # Compose's volume names
_VOLUME_KEYS = ("driver", "driver_opts", "external", "name", "labels")
# Harbor's log folders (compose_env.py legacy_log_mount_env_vars): HOST_<X>_PATH, the trial's folder, at ENV_<X>_PATH
LOG_FOLDERS = {"AGENT_LOGS": AGENT_LOGS, "ARTIFACTS": ARTIFACTS_DIR, "VERIFIER_LOGS": VERIFIER_LOGS}
_HOST_LOG = re.compile(
    r"\$(?:\{HOST_(AGENT_LOGS|ARTIFACTS|VERIFIER_LOGS)_PATH\}|HOST_(AGENT_LOGS|ARTIFACTS|VERIFIER_LOGS)_PATH)"
)
_ENV_LOG = re.compile(
    r"\$(?:\{ENV_(AGENT_LOGS|ARTIFACTS|VERIFIER_LOGS)_PATH\}|ENV_(AGENT_LOGS|ARTIFACTS|VERIFIER_LOGS)_PATH)"
)
# Where the executor binds its own (main's /logs, /tests, /solution, /tmp), the sandbox its own (/proc, /dev,
# /sys, /run/term-executor) and the services' names (/etc/hosts): no volume there, above or below.
RESERVED_TARGETS = (
    "/proc", "/dev", "/sys", "/tmp", "/var/tmp", "/logs", "/tests", "/solution", "/etc/hosts", "/run/term-executor",
)  # fmt: skip
_MODES = ("ro", "rw")


def _declared_volumes(shown: str, value: object) -> frozenset[str]:
    """The file's top-level ``volumes``: each a folder of the session here, so only Compose's default
    (local) driver, without options, not external."""
    if value is None:
        return frozenset()
    if not isinstance(value, dict):
        raise TaskError(f"{shown}: top-level 'volumes' must be a mapping of volume names")
    for name, spec in value.items():
        where = f"{shown}: volume {name!r}"
        if not isinstance(name, str) or not _VOLUME_NAME.fullmatch(name):
            raise TaskError(f"{where}: a volume name must start with a letter or digit and hold only letters, "
                            "digits, '_', '.' and '-'")  # fmt: skip
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise TaskError(f"{where} must be empty or a mapping")
        for key in spec:
            if key not in _VOLUME_KEYS:
                raise TaskError(f"{where}: key {key!r} is not supported here (a volume is a folder of the evaluation)")
        if spec.get("driver") not in (None, "local"):
            raise TaskError(f"{where}: driver {spec['driver']!r} is not supported here (only the default, local)")
        if spec.get("driver_opts"):
            raise TaskError(f"{where}: 'driver_opts' is not supported here (a volume is a folder of the evaluation)")
        if spec.get("external") not in (None, False):
            raise TaskError(f"{where}: 'external' is not supported here (no volume outlives the evaluation)")
    return frozenset(value)


def _service_volumes(
    shown: str, name: str, service: dict, declared: frozenset[str], *, main: bool = False
) -> tuple[tuple[ServiceVolume, ...], list]:
    """A service's ``volumes``: its named volumes and Harbor's log folders, and (``main``: the agent's
    service) the entries left for ``bound_folder`` (a bind of the task's folder, Terminal-Bench's log
    folders); main's log folders are its own already. Anything else naming a host path is refused,
    naming the service and the entry."""
    volumes = service.get("volumes")
    if volumes is None:
        return (), []
    where = f"{shown}: service {name!r}"
    if not isinstance(volumes, list):
        raise TaskError(f"{where}: 'volumes' must be a list")
    found: list[ServiceVolume] = []
    binds = []
    for entry in volumes:
        shown_entry = f"{where}: volume {entry!r}"
        source, target, read_only, kind = _entry(entry, shown_entry)
        if source is None:
            raise TaskError(f"{shown_entry} is an anonymous volume (a target alone), which is not supported here")
        host_log = _HOST_LOG.fullmatch(source)
        if host_log is not None:
            which = host_log.group(1) or host_log.group(2)
            folder = LOG_FOLDERS[which]
            env_log = _ENV_LOG.fullmatch(target)
            if (env_log is None and posixpath.normpath(target) != folder) or (
                env_log is not None and (env_log.group(1) or env_log.group(2)) != which
            ):
                raise TaskError(
                    f"{shown_entry} binds Harbor's {folder} elsewhere than at {folder}, which is not supported here"
                )
            if main:
                continue  # the executor binds main's own
            if folder == VERIFIER_LOGS:
                raise TaskError(
                    f"{shown_entry}: a service cannot share {VERIFIER_LOGS} here (it is made fresh for the "
                    "verifier, after the services started)"
                )
            found.append(ServiceVolume(target=folder, log_folder=folder, read_only=read_only))
            continue
        harness = HARNESS_VOLUME.fullmatch(entry) if isinstance(entry, str) else None
        if harness is not None or kind == "bind" or source.startswith((".", "/", "~")):
            if main:
                binds.append(entry)  # Terminal-Bench's log folders, a bind of the task's folder: bound_folder's
                continue
            raise TaskError(
                f"{shown_entry} binds a host path, which is not supported here (only a named volume "
                "of the file's top-level 'volumes', or Harbor's log folders)"
            )
        if _HOST_VARIABLE.search(source.replace("$$", "")) or not _VOLUME_NAME.fullmatch(source):
            raise TaskError(f"{shown_entry} takes its source from the host's environment or is no volume name; "
                            "this executor passes nothing of its own environment to a task")  # fmt: skip
        if source not in declared:
            raise TaskError(f"{shown_entry} names volume {source!r}, which the file's top-level 'volumes' "
                            "does not declare")  # fmt: skip
        target = _volume_target(target, shown_entry)
        if any(other.target == target for other in found):
            raise TaskError(f"{shown_entry}: a second volume at {target}")
        found.append(ServiceVolume(target=target, volume=source, read_only=read_only))
    return tuple(found), binds


def _entry(entry: object, where: str) -> tuple[str | None, str, bool, str]:
    """(source, target, read only, type) of a volume entry, short (``SOURCE:TARGET[:MODE]``) or long
    (``{type, source, target, read_only}``); a source of None: an anonymous volume (a target alone)."""
    if isinstance(entry, str):
        parts = entry.split(":")
        if len(parts) == 1:
            return None, parts[0], False, "volume"
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise TaskError(f"{where} is not SOURCE:TARGET[:MODE]")
        mode = parts[2] if len(parts) == 3 else "rw"
        if mode not in _MODES:
            raise TaskError(f"{where}: mode {mode!r} is not supported here (only ro or rw)")
        return parts[0], parts[1], mode == "ro", "volume"
    if isinstance(entry, dict):
        kind = entry.get("type", "volume")
        source, target, read_only = entry.get("source"), entry.get("target"), entry.get("read_only", False)
        if kind not in ("volume", "bind") or not set(entry) <= {
            "type",
            "source",
            "target",
            "read_only",
            "volume",
            "bind",
        }:
            raise TaskError(f"{where} is not supported here (only type volume or bind, with source, target and "
                            "read_only)")  # fmt: skip
        if not isinstance(source, str) or not source or not isinstance(target, str) or not isinstance(read_only, bool):
            raise TaskError(f"{where} needs a source and a target (strings) and read_only true or false")
        return source, target, read_only, kind
    raise TaskError(f"{where} must be SOURCE:TARGET[:MODE] or a mapping of type, source, target and read_only")


def _volume_target(target: str, where: str) -> str:
    """A named volume's target: absolute, normalised, over nothing the executor or the sandbox binds."""
    if not target.startswith("/") or any(c in target for c in "\0\n$") or ".." in target.split("/"):
        raise TaskError(f"{where}: target {target!r} must be an absolute path (without '..' or '$')")
    normal = "/" + posixpath.normpath(target).lstrip("/")
    for reserved in RESERVED_TARGETS:
        if (
            normal == "/"
            or normal == reserved
            or normal.startswith(reserved + "/")
            or reserved.startswith(normal + "/")
        ):
            raise TaskError(f"{where}: target {normal} is over {reserved}, which the executor binds itself")
    return normal


# -- a compose service as Docker Compose would run it (SPEC §22) ----------------------------------

# Terminal-Bench's harness mounts its log folders; the executor mounts /logs/agent and /logs/verifier itself.
HARNESS_VOLUME = re.compile(
    r"\$\{T_BENCH_TASK_(?:AGENT_)?LOGS_PATH\}:\$\{T_BENCH_CONTAINER_(?:AGENT_)?LOGS_PATH\}(?::\w+)?"
)
# A bound folder's files the agent never sees: the tests (put back for the verifier, where the bind would
# show them) and the reference solution (never).
TEST_NAMES = ("tests", "run-tests.sh")
SOLUTION_NAMES = ("solution.sh", "solution.yaml", "solution")
_KEEP_ALIVE = (["sleep", "infinity"], ["tail", "-f", "/dev/null"], ["cat"], ["bash"], ["sh"])


@dataclass(frozen=True)
class BoundFolder:
    """A volume binding a folder of the task at the working directory: what the agent finds there, and
    what is put back there before the verifier runs."""

    agent_files: list[SupportFile]
    test_files: list[SupportFile]


def service_workdir(service: dict, where: str) -> str | None:
    """The service's ``working_dir`` (absolute, normalised), or None."""
    value = service.get("working_dir")
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\0\n$"):
        raise TaskError(f"{where}: 'working_dir' must be an absolute path, got {value!r}")
    normal = posixpath.normpath(value)
    return "/" + normal.lstrip("/")


def service_argv(service: dict, key: str, where: str) -> tuple[str, ...] | None:
    """The service's ``command`` or ``entrypoint`` as Compose reads it: a list of strings as it is,
    a string split as a shell would split it (not run by one), ``$$`` a ``$`` and no interpolation
    (``_literal``); None when absent."""
    value = service.get(key)
    if value is None:
        return None
    shown = f"{where}: {key!r}"
    if isinstance(value, str):
        try:
            words = shlex.split(_literal(value, shown))
        except ValueError as exc:
            raise TaskError(f"{shown} {value!r} cannot be split into words ({exc})") from None
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        words = [_literal(item, shown) for item in value]
    else:
        raise TaskError(f"{shown} must be a string or a list of strings, got {type_name(value)}")
    if not words and key == "command":
        raise TaskError(f"{shown} is empty")
    return tuple(words)


def keeps_alive(argv: tuple[str, ...] | list[str]) -> bool:
    """Whether ``argv`` only keeps a container alive (``sleep infinity``, ``sh -c "sleep infinity"``,
    ``tail -f /dev/null``, a shell with no terminal...): here there is no container to keep."""
    words = list(argv)
    if words[:2] in (["sh", "-c"], ["bash", "-c"]) and len(words) == 3:
        words = words[2].split()
    return words in _KEEP_ALIVE or (len(words) == 2 and words[0] == "sleep" and words[1].isdigit())


def check_command(service: dict, where: str) -> None:
    """``command`` is the container's main process; the agent and the tests run beside it here as in
    Terminal-Bench (``docker exec``). One that only keeps the container alive is accepted; one that
    would start a program the task may depend on is refused."""
    value = service.get("command")
    if value is None:
        return
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError:
            words = None
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        words = list(value)
    else:
        words = None
    if words is None:
        raise TaskError(f"{where}: 'command' must be a string or a list of strings")
    if words[:2] in (["sh", "-c"], ["bash", "-c"]) and len(words) == 3:
        words = words[2].split()
    if words in _KEEP_ALIVE or (len(words) == 2 and words[0] == "sleep" and words[1].isdigit()):
        return
    shown = " ".join(words)
    raise TaskError(
        f"{where}: 'command' {shown!r} would run beside the task, which is not supported here "
        "(only a command that keeps the container alive, such as sleep infinity)"
    )


def bound_folder(root: Path, service: dict, where: str, workdir: str | None) -> BoundFolder | None:
    """The service's ``volumes``: Terminal-Bench's log folders (the executor's own), and at most one
    bind of the task's own folder (``./``) at ``workdir``, read as a copy without its tests and solution; anything
    else (a host path, a named volume, a folder bound elsewhere) is refused naming it."""
    volumes = service.get("volumes") or []
    if not isinstance(volumes, list):
        raise TaskError(f"{where}: 'volumes' must be a list")
    found = None
    for volume in volumes:
        source, target = _volume(volume, where)
        if source is None:
            continue
        shown = f"{where}: volume {source}:{target}"
        if not source.startswith(".") or source.startswith(".."):
            raise TaskError(f"{shown} binds a host path or a named volume, which is not supported here")
        if workdir is None or posixpath.normpath(target) != workdir:
            raise TaskError(
                f"{shown} binds a folder of the task elsewhere than the service's working_dir "
                f"({workdir or 'none given'}), which is not supported here"
            )
        if found is not None:
            raise TaskError(f"{shown}: a second folder of the task bound at {workdir}")
        if inside_task(source, root, shown, want_dir=True) != ".":
            raise TaskError(f"{shown} binds a sub-folder of the task; only the task's own folder (./) is supported")
        files = folder_files(root, "the task's folder")
        top = [f.relpath.split("/", 1)[0] for f in files]
        found = BoundFolder(
            agent_files=[f for f, name in zip(files, top, strict=True) if name not in TEST_NAMES + SOLUTION_NAMES],
            test_files=[f for f, name in zip(files, top, strict=True) if name in TEST_NAMES],
        )
    return found


def _volume(volume: object, where: str) -> tuple[str | None, str]:
    """(source, target) of a volume entry; (None, "") for the harness's log folders."""
    if isinstance(volume, str):
        if HARNESS_VOLUME.fullmatch(volume):
            return None, ""
        parts = volume.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/"):
            raise TaskError(f"{where}: volume {volume!r} is not SOURCE:TARGET[:MODE] with an absolute TARGET")
        return parts[0], parts[1]
    if isinstance(volume, dict) and volume.get("type", "bind") == "bind":
        source, target = volume.get("source"), volume.get("target")
        if isinstance(source, str) and isinstance(target, str) and target.startswith("/"):
            if HARNESS_VOLUME.fullmatch(f"{source}:{target}"):
                return None, ""
            return source, target
    raise TaskError(f"{where}: volume {volume!r} is not a bind of a folder (SOURCE:TARGET)")
