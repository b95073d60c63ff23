"""A task's docker-compose file, as the Harbor and Terminal-Bench readers share it (SPEC §17, §22):
its single service, and that service's working_dir, command and volumes read as Compose would run
them."""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from evaluations.tasks.readers import folder_files, inside_task, load_yaml_mapping
from evaluations.tasks.spec import SupportFile, TaskError

_COMPOSE_NAMES = ("docker-compose.yaml", "docker-compose.yml")


def single_service(folder: Path, prefix: str) -> dict | None:
    """The single service of ``folder``'s docker-compose file as {file, name, service}, or None
    without one; several services are refused (a task runs in one container here)."""
    for name in _COMPOSE_NAMES:
        if not os.path.lexists(folder / name):
            continue
        shown = prefix + name
        data, _node = load_yaml_mapping(folder / name, shown)
        services = data.get("services")
        if not isinstance(services, dict) or not services:
            raise TaskError(f"{shown}: 'services' must be a mapping of service names to services")
        if len(services) > 1:
            names = ", ".join(sorted(str(service) for service in services))
            raise TaskError(f"{shown} has {len(services)} services ({names}); a task runs in one container here")
        ((service_name, service),) = services.items()
        if not isinstance(service, dict):
            raise TaskError(f"{shown}: service {service_name!r} must be a mapping")
        return {"file": shown, "name": str(service_name), "service": service}
    return None


# -- a compose service as Docker Compose would run it (SPEC §22) ----------------------------------

# Keys that change nothing for a task run in one container here: its name, a terminal, Compose's
# own resource hints (the operator's limits apply), the image name a build is tagged with.
IGNORED_SERVICE_KEYS = ("container_name", "tty", "stdin_open", "deploy", "labels", "restart", "init", "image")
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
    a string split as a shell would split it (not run by one); None when absent."""
    value = service.get(key)
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise TaskError(f"{where}: '{key}' {value!r} cannot be split into words ({exc})") from None
    raise TaskError(f"{where}: '{key}' must be a string or a list of strings")


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
