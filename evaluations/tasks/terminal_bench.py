"""Terminal-Bench 1.x task folders (``task.yaml``, ``Dockerfile``, ``docker-compose.yaml``,
``run-tests.sh``, ``tests/``, ``solution.sh`` or ``solution.yaml``) -> TaskSpec (SPEC §17).
Read against Terminal-Bench's harness (``harness/harness.py``: run-tests.sh and tests/ copied to
/tests, ``bash /tests/run-tests.sh``; ``terminal/docker_compose_manager.py``) and Harbor's
``mappers/terminal_bench.py``."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

from evaluations.grading.tbparsers import grader_for
from evaluations.tasks.compose import (
    IGNORED_SERVICE_KEYS,
    BoundFolder,
    bound_folder,
    check_command,
    service_workdir,
    single_service,
)
from evaluations.tasks.readers import (
    ENV_NAME,
    TaskLimits,
    folder_files,
    image_environment,
    inside_task,
    is_folder,
    is_number,
    jsonable,
    load_yaml,
    load_yaml_mapping,
    prompt_cap,
    read_bytes,
    read_text,
    regular_file,
    type_name,
)
from evaluations.tasks.spec import (
    ImageEnvironment,
    SupportFile,
    TaskError,
    TaskRequest,
    TaskSpec,
    Verifier,
    image_task,
)

FILE = "task.yaml"  # what makes a folder a Terminal-Bench 1.x task (when it has no task.toml)

# The keys of a compose service read here; IGNORED_SERVICE_KEYS change nothing; any other is refused.
SERVICE_KEYS = ("build", "environment", "working_dir", "command", "volumes")

# What Terminal-Bench's harness sets where its tests run (DockerComposeManager.CONTAINER_TEST_DIR;
# its compose files pass TEST_DIR=${T_BENCH_TEST_DIR} into the container).
TEST_DIR = "/tests"
TERMINAL_BENCH_TEST_ENV = {"TEST_DIR": TEST_DIR, "T_BENCH_TEST_DIR": TEST_DIR}
_VARIABLE = re.compile(r"\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def detect(root: Path) -> bool:
    return os.path.lexists(root / FILE)


def load(root: Path, limits: TaskLimits) -> TaskSpec:
    data, _node = load_yaml_mapping(root / "task.yaml", "task.yaml")
    rest = dict(data)
    prompt = rest.pop("instruction", None)
    if prompt is None:
        raise TaskError("task.yaml: missing required key 'instruction'")
    if not isinstance(prompt, str):
        raise TaskError(f"task.yaml: 'instruction' must be a string, got {type_name(prompt)}")
    cap = prompt_cap(limits.max_prompt_bytes, instruction=True)
    if len(prompt.encode()) > cap.limit:
        raise TaskError(f"task.yaml: 'instruction' is larger than {cap.limit} bytes ({cap.setting})")
    parser = rest.pop("parser_name", "pytest")
    request = TaskRequest(
        agent_timeout_secs=_positive(rest.pop("max_agent_timeout_sec", None), "max_agent_timeout_sec"),
        verifier_timeout_secs=_positive(rest.pop("max_test_timeout_sec", None), "max_test_timeout_sec"),
    )
    environment, env, bound = _terminal_bench_environment(root)
    run_tests = regular_file(root / "run-tests.sh", "run-tests.sh", required=True)
    data = read_bytes(root / "run-tests.sh", "run-tests.sh", required=True)
    files = [SupportFile("run-tests.sh", data, 0o755 if run_tests.st_mode & 0o111 else 0o644)]
    if is_folder(root / "tests", "tests"):
        tests = folder_files(root / "tests", "tests")
        if any(f.relpath == "run-tests.sh" for f in tests):
            files = []  # Terminal-Bench copies run-tests.sh, then tests/ over it: tests/run-tests.sh runs
        files += tests
    grader, swebench = grader_for(parser, files, "task.yaml: 'parser_name'")
    solution, why_not = _terminal_bench_solution(root)
    if why_not:
        rest["solution_not_converted"] = why_not
    return image_task(
        root,
        format="terminal-bench",
        grader=grader,
        swebench=swebench,
        workdir_files=bound.agent_files if bound else None,
        support_files=bound.test_files if bound else [],
        prompt=prompt,
        environment=environment,
        env=env,
        verifier=Verifier(script="run-tests.sh", files=files, env=dict(TERMINAL_BENCH_TEST_ENV)),
        request=request,
        metadata=jsonable(rest),
        solution=solution,
        solution_files=[],
    )


def _positive(value: object, key: str) -> float | None:
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        got = value if is_number(value) else type_name(value)
        raise TaskError(f"task.yaml: '{key}' must be a positive number, got {got}")
    return float(value)


def _terminal_bench_environment(root: Path) -> tuple[ImageEnvironment, dict[str, str], BoundFolder | None]:
    """The one service of docker-compose.yaml read as Compose would run it (its build or image,
    working_dir, environment, a keep-alive command, a volume binding the task's folder at its
    working_dir), else the Dockerfile at the root with the root as its context, as Terminal-Bench
    builds it. Any other key of the service is refused, named."""
    compose = single_service(root, "")
    if compose is None:
        regular_file(root / "Dockerfile", "Dockerfile", required=True)
        return ImageEnvironment(dockerfile="Dockerfile", context="."), {}, None
    where = f"{compose['file']}: service {compose['name']!r}"
    service = compose["service"]
    unknown = [str(key) for key in service if key not in SERVICE_KEYS + IGNORED_SERVICE_KEYS]
    if unknown:
        raise TaskError(
            f"{where}: {unknown[0]!r} is not supported here (a task runs in one container, as its image says)"
        )
    env = _compose_env(service.get("environment"), where)
    workdir = service_workdir(service, where)
    check_command(service, where)
    bound = bound_folder(root, service, where, workdir)
    environment, env = _compose_image(root, service, where, env)
    return dataclasses.replace(environment, workdir=workdir), env, bound


def _compose_image(root: Path, service: dict, where: str, env: dict) -> tuple[ImageEnvironment, dict]:
    build = service.get("build")
    if build is None:
        image = service.get("image")
        if isinstance(image, str) and not _VARIABLE.search(image):
            return image_environment(image, f"{where}: 'image'", where), env
        regular_file(root / "Dockerfile", "Dockerfile", required=True)
        return ImageEnvironment(dockerfile="Dockerfile", context="."), env
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        raise TaskError(f"{where}: 'build' must be a folder or a mapping (context, dockerfile)")
    context = inside_task(build.get("context", "."), root, f"{where}: 'build.context'", want_dir=True)
    dockerfile = build.get("dockerfile", "Dockerfile")
    if not isinstance(dockerfile, str):
        raise TaskError(f"{where}: 'build.dockerfile' must be a path, got {type_name(dockerfile)}")
    dockerfile = inside_task(
        f"{context}/{dockerfile}" if context != "." else dockerfile,
        root,
        f"{where}: 'build.dockerfile'",
        want_dir=False,
    )
    args = build.get("args") or {}
    if isinstance(args, list):
        args = dict(item.split("=", 1) if "=" in str(item) else (item, "") for item in args)
    if not isinstance(args, dict) or not all(isinstance(v, str | int | float) for v in args.values()):
        raise TaskError(f"{where}: 'build.args' must be a mapping of names to values")
    target = build.get("target")
    if target is not None and not isinstance(target, str):
        raise TaskError(f"{where}: 'build.target' must be a stage name")
    build_args = {str(k): _interpolate(str(v), f"{where}: build arg {k!r}") for k, v in args.items()}
    return ImageEnvironment(dockerfile=dockerfile, context=context, build_args=build_args, target=target), env


def _compose_env(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            raise TaskError(f"{where}: 'environment' must be a list of NAME=VALUE strings or a mapping")
        value = dict(item.split("=", 1) if "=" in item else (item, "") for item in value)
    if not isinstance(value, dict):
        raise TaskError(f"{where}: 'environment' must be a list of NAME=VALUE strings or a mapping")
    env = {}
    for name, item in value.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise TaskError(f"{where}: 'environment' name {name!r} is not a valid variable name ([A-Z_][A-Z0-9_]*)")
        if item is None or isinstance(item, bool) or not isinstance(item, str | int | float):
            raise TaskError(f"{where}: 'environment' value of {name} must be a string")
        env[name] = _interpolate(str(item), f"{where}: 'environment' value of {name}")
    return env


def _interpolate(text: str, where: str) -> str:
    """``${T_BENCH_TEST_DIR}`` as Terminal-Bench sets it; any other variable would come from the
    host running the harness: refused."""

    def value(match: re.Match) -> str:
        name = match[1] if match[1] is not None else match[2]
        if name == "T_BENCH_TEST_DIR":
            return TEST_DIR
        raise TaskError(
            f"{where} takes ${{{name}}} from the host's environment; only ${{T_BENCH_TEST_DIR}} is set here"
        )

    return _VARIABLE.sub(value, text.replace("$$", "\0")).replace("\0", "$")


def _terminal_bench_solution(root: Path) -> tuple[str | None, str | None]:
    """(solution.sh, or solution.yaml's commands as one script as Harbor's mapper writes it; why
    solution.yaml could not be converted). The solution is only the oracle's: a solution.yaml
    that cannot be a bash script leaves the task without one, not invalid."""
    script = read_text(root / "solution.sh", "solution.sh", required=False)
    if script is not None or not os.path.lexists(root / "solution.yaml"):
        return script, None
    try:
        return _solution_yaml(root / "solution.yaml"), None
    except TaskError as exc:
        return None, str(exc)


def _solution_yaml(path: Path) -> str:
    data, node = load_yaml(path, "solution.yaml")
    if node is None or not isinstance(data, list) or not data:
        raise TaskError("solution.yaml must be a list of {command: ...} entries")
    lines = ["#!/bin/bash", "# solution.yaml's commands, one a line (Terminal-Bench typed each and pressed Enter)"]
    for number, entry in enumerate(data, 1):
        command = entry.get("command") if isinstance(entry, dict) else None
        if not isinstance(command, str):
            raise TaskError(f"solution.yaml entry {number} has no 'command' string")
        if entry.get("append_enter", True) is not True:
            raise TaskError(f"solution.yaml entry {number} types keys without Enter, which no bash script can do")
        lines.append(command.rstrip("\n"))
    return "\n".join(lines) + "\n"
