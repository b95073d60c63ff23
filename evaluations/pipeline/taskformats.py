"""Harbor and Terminal-Bench 1.x task folders -> TaskSpec (SPEC §17).

``load_task`` (taskspec.py) sends a folder holding ``task.toml`` here as a
Harbor task, one holding ``task.yaml`` (and no ``task.toml``) as a
Terminal-Bench 1.x task. Both are read with taskspec's readers (the YAML
guards, the size caps, no links), and every refusal is one sentence naming
the file and the key.

1. What a format asks of the run goes into ``TaskSpec.request`` as written;
   capping it by the operator's limits is the pipeline's job.
2. What is not understood is kept, not dropped: ``metadata`` is the file
   minus the keys read here (Harbor: ``task.toml`` in its own shape, so
   ``[metadata]`` sits under ``"metadata"`` and an unknown ``[agent] user``
   under ``"agent"``; Terminal-Bench: ``task.yaml``'s other keys).
3. What would run differently here than where the task was written is
   refused, not approximated: a Windows task, GPUs, several services, a
   working directory other than the image's, a verifier container of its
   own, multi-step tasks, environment values taken from the host.
4. Harbor tasks are graded by their reward file; ``[verifier] grader =
   "pytest"`` (written by ``manage.py import_tasks`` for a converted
   Terminal-Bench task, ignored by Harbor itself) keeps Terminal-Bench's
   grading. Terminal-Bench tasks are graded by ``pytest``.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import tomllib
from pathlib import Path

from evaluations.network.egress.policy import parse_rule
from evaluations.pipeline.taskspec import (
    ENV_NAME,
    MAX_YAML_BYTES,
    Cap,
    ImageEnvironment,
    SupportFile,
    TaskError,
    TaskRequest,
    TaskSpec,
    Verifier,
    folder_files,
    image_environment,
    inside_task,
    is_folder,
    load_yaml,
    load_yaml_mapping,
    prompt_cap,
    read_bytes,
    read_text,
    regular_file,
    type_name,
)

NETWORK_MODES = ("no-network", "public", "allowlist")
HARBOR_GRADERS = ("reward_file", "pytest")
# What Terminal-Bench's harness sets where its tests run (DockerComposeManager.CONTAINER_TEST_DIR;
# its compose files pass TEST_DIR=${T_BENCH_TEST_DIR} into the container).
TEST_DIR = "/tests"
TERMINAL_BENCH_TEST_ENV = {"TEST_DIR": TEST_DIR, "T_BENCH_TEST_DIR": TEST_DIR}
_COMPOSE_NAMES = ("docker-compose.yaml", "docker-compose.yml")
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([GMK])\s*", re.IGNORECASE)
_VARIABLE = re.compile(r"\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def load_other_format(root: Path, *, max_prompt_bytes: int) -> TaskSpec:
    if os.path.lexists(root / "task.toml"):
        return load_harbor(root, max_prompt_bytes=max_prompt_bytes)
    return load_terminal_bench(root, max_prompt_bytes=max_prompt_bytes)


# -- Harbor -------------------------------------------------------------------------------


class _Table:
    """One table of task.toml: its values read by name, each refusal naming ``[path] key``; what
    was not read is ``rest()``."""

    def __init__(self, data: dict, path: str = ""):
        self.data = data
        self.path = path
        self.taken: set[str] = set()
        self.tables: dict[str, _Table] = {}

    def where(self, key: str) -> str:
        return f"task.toml: [{self.path}] {key}" if self.path else f"task.toml: {key}"

    def take(self, key: str, default: object = None) -> object:
        self.taken.add(key)
        return self.data.get(key, default)

    def table(self, key: str) -> _Table:
        value = self.data.get(key, {})
        name = f"{self.path}.{key}" if self.path else key
        if not isinstance(value, dict):
            raise TaskError(f"task.toml: [{name}] must be a table, got {type_name(value)}")
        self.tables[key] = _Table(value, name)
        return self.tables[key]

    def rest(self) -> dict:
        kept = {key: value for key, value in self.data.items() if key not in self.taken and key not in self.tables}
        for key, table in self.tables.items():
            if rest := table.rest():
                kept[key] = rest
        return kept

    def number(self, key: str, *, whole: bool = False) -> float | int | None:
        value = self.take(key)
        if value is None:
            return None
        kind = "a positive whole number" if whole else "a positive number"
        if not _is_number(value) or (whole and not isinstance(value, int)):
            got = value if _is_number(value) else type_name(value)
            raise TaskError(f"{self.where(key)} must be {kind}, got {got}")
        if not math.isfinite(value) or value <= 0:
            raise TaskError(f"{self.where(key)} must be {kind}, got {value}")
        return value if whole else float(value)

    def string(self, key: str) -> str | None:
        value = self.take(key)
        if value is not None and not isinstance(value, str):
            raise TaskError(f"{self.where(key)} must be a string, got {type_name(value)}")
        return value

    def boolean(self, key: str) -> bool | None:
        value = self.take(key)
        if value is not None and not isinstance(value, bool):
            raise TaskError(f"{self.where(key)} must be true or false, got {type_name(value)}")
        return value


def load_harbor(root: Path, *, max_prompt_bytes: int) -> TaskSpec:
    config = _Table(_read_toml(root / "task.toml"))
    config.string("version")
    config.string("schema_version")
    config.taken -= {"version", "schema_version"}  # checked, and kept in the metadata
    if config.take("steps"):
        raise TaskError("task.toml: [[steps]] (a multi-step task) is not supported here")
    config.table("metadata")
    agent = config.table("agent")
    verifier_table = config.table("verifier")
    environment_table = config.table("environment")
    environment, env, request = _harbor_environment(root, environment_table, agent)
    request = TaskRequest(
        agent_timeout_secs=agent.number("timeout_sec"),
        verifier_timeout_secs=verifier_table.number("timeout_sec"),
        **request,
    )
    grader = verifier_table.take("grader", "reward_file")
    if grader not in HARBOR_GRADERS:
        shown = repr(grader) if isinstance(grader, str) else type_name(grader)
        raise TaskError(f"task.toml: [verifier] grader must be one of {', '.join(HARBOR_GRADERS)}, got {shown}")
    verifier = _harbor_verifier(root, verifier_table)
    solution, solution_files = _harbor_solution(root)
    prompt = read_text(
        root / "instruction.md", "instruction.md", required=True, cap=prompt_cap(max_prompt_bytes, instruction=True)
    )
    _single_service(root / "environment", "environment/")
    return _spec(
        root,
        format="harbor",
        grader=grader,
        prompt=prompt,
        environment=environment,
        env=env,
        verifier=verifier,
        request=request,
        metadata=_jsonable(config.rest()),
        solution=solution,
        solution_files=solution_files,
    )


def _read_toml(path: Path) -> dict:
    raw = read_bytes(path, "task.toml", required=True, cap=Cap(MAX_YAML_BYTES))
    try:
        return tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise TaskError("task.toml is not valid UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"task.toml is not valid TOML ({exc})") from None
    except RecursionError:
        raise TaskError("task.toml is nested too deeply") from None


def _harbor_environment(root: Path, table: _Table, agent: _Table) -> tuple[ImageEnvironment, dict, dict]:
    """The image, the task's environment variables and the [environment] part of the request."""
    task_os = table.take("os", "linux")
    if not isinstance(task_os, str) or task_os.lower() not in ("linux", "windows"):
        raise TaskError(f"{table.where('os')} must be linux or windows, got {task_os!r}")
    if task_os.lower() == "windows":
        raise TaskError("task.toml: [environment] os = 'windows': Windows tasks cannot run here (Linux only)")
    gpus = table.take("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise TaskError(f"{table.where('gpus')} must be a whole number, got {type_name(gpus)}")
    if gpus:
        raise TaskError(f"task.toml: [environment] gpus = {gpus}: this executor has no GPUs")
    if table.take("tpu") is not None:
        raise TaskError("task.toml: [environment] tpu: this executor has no TPUs")
    if table.take("workdir") is not None:
        raise TaskError(
            "task.toml: [environment] workdir is not supported here: the agent and the tests run in the "
            "image's working directory (set it with WORKDIR in environment/Dockerfile)"
        )
    image = table.take("docker_image")
    if image is not None:
        where = table.where("docker_image")
        environment = image_environment(image, where, where)
    elif regular_file(root / "environment" / "Dockerfile", "environment/Dockerfile", required=False):
        is_folder(root / "environment", "environment")
        environment = ImageEnvironment(dockerfile="environment/Dockerfile", context="environment")
    else:
        raise TaskError(
            "task has neither environment/Dockerfile nor task.toml [environment] docker_image: it has no environment"
        )
    request = {
        "build_timeout_secs": table.number("build_timeout_sec"),
        "cpus": table.number("cpus"),
        "memory_mb": _megabytes(table, "memory"),
        "storage_mb": _megabytes(table, "storage"),
    }
    network, hosts = _network(table)
    agent_network, agent_hosts = _network(agent, baseline=False)  # [agent] may override for its phase
    if agent_network is not None:
        network, hosts = agent_network, agent_hosts
    env = _literal_env(table.table("env"))
    return environment, env, {**request, "network": network, "allowed_hosts": hosts}


def _megabytes(table: _Table, name: str) -> int | None:
    """``memory_mb`` (``storage_mb``), or Harbor's older ``memory = "2G"`` (``storage``); both must agree."""
    megabytes = table.number(f"{name}_mb", whole=True)
    text = table.take(name)
    if text is None:
        return megabytes
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        shown = repr(text) if isinstance(text, str) else type_name(text)
        raise TaskError(f"{table.where(name)} must be a size such as '2G', '512M' or '1024K', got {shown}")
    amount, unit = float(match[1]), match[2].upper()
    parsed = int(amount * 1024) if unit == "G" else int(amount) if unit == "M" else int(amount / 1024)
    if parsed <= 0:
        raise TaskError(f"{table.where(name)} must be at least 1M, got {text!r}")
    if megabytes is not None and megabytes != parsed:
        raise TaskError(f"{table.where(name)} = {text!r} ({parsed} MB) disagrees with {name}_mb = {megabytes}")
    return parsed


def _network(table: _Table, *, baseline: bool = True) -> tuple[str | None, tuple[str, ...]]:
    """(mode, hosts): ``network_mode`` wins over the older ``allow_internet``; hosts with no mode
    make an allowlist (as Harbor reads them). (None, ()) when the table says nothing."""
    mode = table.take("network_mode")
    if mode is not None and mode not in NETWORK_MODES:
        shown = repr(mode) if isinstance(mode, str) else type_name(mode)
        raise TaskError(f"{table.where('network_mode')} must be one of {', '.join(NETWORK_MODES)}, got {shown}")
    hosts = _allowed_hosts(table)
    if hosts and mode not in (None, "allowlist"):
        raise TaskError(f"{table.where('allowed_hosts')} goes with network_mode = 'allowlist', not {mode!r}")
    allow_internet = table.boolean("allow_internet") if baseline else None
    if mode is None and hosts:
        mode = "allowlist"
    if mode is None and allow_internet is not None:
        mode = "public" if allow_internet else "no-network"
    return mode, hosts


def _allowed_hosts(table: _Table) -> tuple[str, ...]:
    value = table.take("allowed_hosts")
    if value is None:
        return ()
    where = table.where("allowed_hosts")
    if not isinstance(value, list) or not all(isinstance(host, str) for host in value):
        raise TaskError(f"{where} must be a list of host names")
    hosts = []
    for host in value:
        host = host.strip().lower().rstrip(".")
        if "://" in host:
            raise TaskError(f"{where}: {host!r} is a URL; give a host name, an address or a CIDR")
        try:
            rule = parse_rule(host)  # the egress proxy's own syntax: a name, *.domain, an address, a CIDR
        except ValueError as exc:
            raise TaskError(f"{where}: {host!r} {exc}") from None
        if rule.port is not None:
            raise TaskError(f"{where}: {host!r} names a port; give a host name, an address or a CIDR")
        if host not in hosts:
            hosts.append(host)
    return tuple(hosts)


def _literal_env(table: _Table) -> dict[str, str]:
    """A [*.env] table: names as workspace.yaml's, literal string values; a value Harbor would take
    from the host's environment (``${VAR}``) is refused: nothing of the executor's reaches a task."""
    env = {}
    for name, value in table.data.items():
        table.taken.add(name)
        where = f"task.toml: [{table.path}] {name}"
        if not ENV_NAME.fullmatch(name):
            raise TaskError(f"{where} is not a valid variable name ([A-Z_][A-Z0-9_]*)")
        if not isinstance(value, str):
            raise TaskError(f"{where} must be a string, got {type_name(value)}")
        if "\0" in value:
            raise TaskError(f"{where} contains a NUL byte")
        if "${" in value:
            raise TaskError(
                f"{where} takes its value from the host's environment ({value}); "
                "this executor passes nothing of its own environment to a task"
            )
        env[name] = value
    return env


def _harbor_verifier(root: Path, table: _Table) -> Verifier:
    mode = table.take("environment_mode")
    if mode not in (None, "shared"):
        raise TaskError(
            f"task.toml: [verifier] environment_mode = {mode!r} is not supported here: the tests run on the "
            "file system the agent left ([verifier] isolated = true: on the image and the working directory only)"
        )
    if table.take("environment") is not None:
        raise TaskError("task.toml: [verifier.environment] (a verifier container of its own) is not supported here")
    if not is_folder(root / "tests", "tests"):
        raise TaskError("task has no tests/test.sh (required)")
    regular_file(root / "tests" / "test.sh", "tests/test.sh", required=True)
    return Verifier(
        script="test.sh",
        files=folder_files(root / "tests", "tests"),
        env=_literal_env(table.table("env")),
        isolated=bool(table.boolean("isolated")),
    )


def _harbor_solution(root: Path) -> tuple[str | None, list[SupportFile]]:
    """solution/solve.sh, and every file of solution/ (Harbor's OracleAgent uploads them to /solution)."""
    if not is_folder(root / "solution", "solution"):
        return None, []
    script = read_text(root / "solution" / "solve.sh", "solution/solve.sh", required=False)
    if script is None:
        return None, []
    return script, folder_files(root / "solution", "solution")


def _single_service(folder: Path, prefix: str) -> dict | None:
    """The single service of ``folder``'s docker-compose file as (name, mapping), or None without
    one; several services are refused (a task runs in one container here)."""
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


# -- Terminal-Bench 1.x ---------------------------------------------------------------------------


def load_terminal_bench(root: Path, *, max_prompt_bytes: int) -> TaskSpec:
    data, _node = load_yaml_mapping(root / "task.yaml", "task.yaml")
    rest = dict(data)
    prompt = rest.pop("instruction", None)
    if prompt is None:
        raise TaskError("task.yaml: missing required key 'instruction'")
    if not isinstance(prompt, str):
        raise TaskError(f"task.yaml: 'instruction' must be a string, got {type_name(prompt)}")
    cap = prompt_cap(max_prompt_bytes, instruction=True)
    if len(prompt.encode()) > cap.limit:
        raise TaskError(f"task.yaml: 'instruction' is larger than {cap.limit} bytes ({cap.setting})")
    parser = rest.pop("parser_name", "pytest")
    if parser != "pytest":
        shown = repr(parser) if isinstance(parser, str) else type_name(parser)
        raise TaskError(f"task.yaml: 'parser_name' {shown} is not supported here; only pytest is")
    request = TaskRequest(
        agent_timeout_secs=_positive(rest.pop("max_agent_timeout_sec", None), "max_agent_timeout_sec"),
        verifier_timeout_secs=_positive(rest.pop("max_test_timeout_sec", None), "max_test_timeout_sec"),
    )
    environment, env = _terminal_bench_environment(root)
    run_tests = regular_file(root / "run-tests.sh", "run-tests.sh", required=True)
    data = read_bytes(root / "run-tests.sh", "run-tests.sh", required=True)
    files = [SupportFile("run-tests.sh", data, 0o755 if run_tests.st_mode & 0o111 else 0o644)]
    if is_folder(root / "tests", "tests"):
        tests = folder_files(root / "tests", "tests")
        if any(f.relpath == "run-tests.sh" for f in tests):
            raise TaskError(
                "tests/run-tests.sh would replace run-tests.sh at /tests (Terminal-Bench copies both there)"
            )
        files += tests
    solution, why_not = _terminal_bench_solution(root)
    if why_not:
        rest["solution_not_converted"] = why_not
    return _spec(
        root,
        format="terminal-bench",
        grader="pytest",
        prompt=prompt,
        environment=environment,
        env=env,
        verifier=Verifier(script="run-tests.sh", files=files, env=dict(TERMINAL_BENCH_TEST_ENV)),
        request=request,
        metadata=_jsonable(rest),
        solution=solution,
        solution_files=[],
    )


def _positive(value: object, key: str) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        got = value if _is_number(value) else type_name(value)
        raise TaskError(f"task.yaml: '{key}' must be a positive number, got {got}")
    return float(value)


def _terminal_bench_environment(root: Path) -> tuple[ImageEnvironment, dict[str, str]]:
    """The one service of docker-compose.yaml (its build or image, its environment), else the
    Dockerfile at the root with the root as its context, as Terminal-Bench builds it."""
    compose = _single_service(root, "")
    if compose is None:
        regular_file(root / "Dockerfile", "Dockerfile", required=True)
        return ImageEnvironment(dockerfile="Dockerfile", context="."), {}
    where = f"{compose['file']}: service {compose['name']!r}"
    service = compose["service"]
    for key in ("working_dir", "entrypoint", "user"):
        if key in service:
            raise TaskError(f"{where}: {key!r} is not supported here (the task runs as its image says)")
    env = _compose_env(service.get("environment"), where)
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


# -- both ------------------------------------------------------------------------------------------


def _spec(root: Path, **fields) -> TaskSpec:
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


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _jsonable(value: object) -> object:
    """TOML and YAML values as JSON holds them: dates as ISO text, non-finite floats as text."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
