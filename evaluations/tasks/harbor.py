"""Harbor task folders (``task.toml``, ``instruction.md``, ``environment/``, ``tests/test.sh``,
``solution/``) -> TaskSpec (SPEC §17). Read against Harbor's own model
(``harbor/models/task/config.py``, ``paths.py``, ``verifier/verifier.py``)."""

from __future__ import annotations

import dataclasses
import math
import os
import posixpath
import re
import tomllib
from pathlib import Path
from typing import NoReturn

from evaluations.artifacts import UnsafeName
from evaluations.artifacts import check_path as check_artifact_path
from evaluations.grading.tbparsers import swebench_from_config
from evaluations.network.egress.policy import parse_rule
from evaluations.tasks import harbor_steps
from evaluations.tasks.compose import MAIN, SERVICE_NAME, bound_folder, harbor_services, service_argv, service_workdir
from evaluations.tasks.readers import (
    CONTROL_CHARS,
    ENV_NAME,
    MAX_YAML_BYTES,
    Cap,
    TaskLimits,
    folder_files,
    image_environment,
    is_folder,
    is_number,
    jsonable,
    prompt_cap,
    read_bytes,
    read_text,
    regular_file,
    type_name,
)
from evaluations.tasks.spec import (
    ALLOWLIST,
    ARTIFACTS_DIR,
    NETWORK_MODES,
    NO_NETWORK,
    PUBLIC,
    VERIFIER_LOGS,
    ArtifactEntry,
    Collect,
    FirstProcess,
    Healthcheck,
    ImageEnvironment,
    NetworkRequest,
    SeparateVerifier,
    SupportFile,
    TaskError,
    TaskRequest,
    TaskSpec,
    Verifier,
    image_task,
)

FILE = "task.toml"  # what makes a folder a Harbor task

HARBOR_GRADERS = ("reward_file", "pytest", "swebench")
# Harbor's docker backend runs the main service with this command (docker-compose-build.yaml,
# docker-compose-prebuilt.yaml): the image's CMD never runs, its ENTRYPOINT does, with these words.
HARBOR_MAIN_COMMAND = ("sh", "-c", "sleep infinity")
MAX_EXCLUDE = 64  # an artifact's exclude patterns
MAX_EXCLUDE_CHARS = 256  # one pattern's length
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([GMK])\s*", re.IGNORECASE)
_PACKAGE_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*")  # Harbor's ORG_NAME_PATTERN
_USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")  # a passwd name or a number
_HOST_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")  # Harbor's, for allowed_hosts names


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
        if not is_number(value) or (whole and not isinstance(value, int)):
            got = value if is_number(value) else type_name(value)
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


def detect(root: Path) -> bool:
    return os.path.lexists(root / FILE)


def load(root: Path, limits: TaskLimits) -> TaskSpec:
    config = _Table(_read_toml(root / "task.toml"))
    config.string("version")
    config.string("schema_version")
    config.taken -= {"version", "schema_version"}  # checked, and kept in the metadata
    _package(config)
    entries = config.take("steps")  # [[steps]] (SPEC §23): read by harbor_steps.py once the tables are
    strategy = config.take("multi_step_reward_strategy") if entries else None
    config.table("metadata")
    agent = config.table("agent")
    verifier_table = config.table("verifier")
    environment_table = config.table("environment")
    environment, env, request = _harbor_environment(root, environment_table)
    verifier, verifier_baseline = _harbor_verifier(
        root, verifier_table, environment, env, request["memory_mb"], required=not entries
    )
    verifier_phase = _phase_network(verifier_table)
    memory_mb = request["memory_mb"]
    request = TaskRequest(
        agent_timeout_secs=agent.number("timeout_sec"),
        verifier_timeout_secs=verifier_table.number("timeout_sec"),
        agent_network=_phase_network(agent),  # SPEC §23: each phase may override [environment]'s
        # Harbor's verifier phase: [verifier]'s own, else a separate verifier's environment's
        verifier_network=verifier_phase or verifier_baseline,
        agent_user=_user(agent),  # SPEC §23: the image's User when absent, for both
        verifier_user=_user(verifier_table),
        **request,
    )
    grader = verifier_table.take("grader", "reward_file")
    if grader not in HARBOR_GRADERS:
        shown = repr(grader) if isinstance(grader, str) else type_name(grader)
        raise TaskError(f"task.toml: [verifier] grader must be one of {', '.join(HARBOR_GRADERS)}, got {shown}")
    compose = harbor_services(root)  # SPEC §23: main, and the services started beside it
    collect = _collect(verifier_table, compose.services)
    collected = _artifacts(config, compose.services)
    solution, solution_files = _harbor_solution(root)
    solution_env = _literal_env(config.table("solution").table("env"))
    steps = None
    if entries:
        task_verifier = verifier_table.data  # read again for each step, its reading kept out of the metadata's
        steps = harbor_steps.read(
            # a step's verifier network: its own, else [verifier]'s, else its separate environment's
            root, entries, strategy, request=dataclasses.replace(request, verifier_network=verifier_phase),
            verifier=verifier, grader=grader, solution=(solution, solution_files), limits=limits,
            readers=harbor_steps.Readers(
                _Table, _phase_network, _literal_env, _user, _healthcheck,
                lambda table: _artifacts(table, compose.services, "[steps] artifacts"),
                lambda table: _collect(table, compose.services, "[[steps.verifier.collect]]"),
                lambda table, tests: _separate_verifier(
                    root, [(table, tests), (_Table(task_verifier, "verifier"), "tests")], environment, env, memory_mb
                ),
            ),
        )  # fmt: skip
        prompt, verifier = steps.prompt, steps.verifier
    else:
        prompt = read_text(
            root / "instruction.md",
            "instruction.md",
            required=True,
            cap=prompt_cap(limits.max_prompt_bytes, instruction=True),
        )
    first_process = main_first_process(compose.main)
    healthcheck = _healthcheck(environment_table)
    metadata = jsonable(config.rest())
    if steps is not None and any(steps.kept):
        metadata["steps"] = steps.kept  # each step's keys not read, in order
    bound = _bound_folder(root, environment, compose.main)
    swebench = swebench_from_config(verifier.files) if grader == "swebench" else None
    return image_task(
        root,
        format="harbor",
        grader=grader,
        prompt=prompt,
        environment=environment,
        first_process=first_process,
        healthcheck=healthcheck,
        env=env,
        verifier=verifier,
        request=request,
        metadata=metadata,
        solution=solution,
        solution_files=solution_files,
        solution_env=solution_env,
        swebench=swebench,
        workdir_files=bound.agent_files if bound else None,
        support_files=bound.test_files if bound else [],
        artifacts=collected,
        **({"steps": steps.steps, "reward_strategy": steps.strategy} if steps is not None else {}),
        services=compose.services,
        collect=collect,
        volumes=compose.volumes,
    )


def _package(config: _Table) -> None:
    """[task] (schema 1.3-1.4, Harbor's ``PackageInfo``): ``name`` (``org/name``, required in the
    table), ``version`` (a non-empty string), ``description``, ``authors`` and ``keywords``, checked
    as Harbor checks them; the table stays in the metadata as written."""
    if "task" not in config.data:
        return
    table = config.table("task")
    name = table.take("name")
    if name is None:
        raise TaskError("task.toml: [task] name is required in [task] (the package's name, as in 'org/name')")
    if not isinstance(name, str):
        raise TaskError(f"{table.where('name')} must be a string such as 'org/name', got {type_name(name)}")
    if not _PACKAGE_NAME.fullmatch(name) or ".." in name:
        raise TaskError(
            f"{table.where('name')} must be 'org/name' (letters, digits, '.', '_' and '-', each part starting "
            f"with a letter or digit, no '..'), got {name[:100]!r}"
        )
    if table.string("version") == "":
        raise TaskError(f"{table.where('version')} must not be empty")
    table.string("description")
    keywords = table.take("keywords", [])
    if not isinstance(keywords, list):
        raise TaskError(f"{table.where('keywords')} must be a list of strings, got {type_name(keywords)}")
    for index, word in enumerate(keywords):
        if not isinstance(word, str):
            raise TaskError(f"{table.where('keywords')}[{index}] must be a string, got {type_name(word)}")
    authors = table.take("authors", [])
    if not isinstance(authors, list):
        raise TaskError(f"{table.where('authors')} must be a list of {{name, email}} tables, got {type_name(authors)}")
    for index, author in enumerate(authors):
        where = f"{table.where('authors')}[{index}]"
        if not isinstance(author, dict) or not isinstance(author.get("name"), str):
            raise TaskError(f"{where} must be a table with a name (a string) and an optional email")
        if not isinstance(author.get("email", ""), str):
            raise TaskError(f"{where} email must be a string, got {type_name(author['email'])}")
    del config.tables["task"]  # checked; kept in the metadata as written


def main_first_process(compose: dict | None) -> FirstProcess:
    """SPEC §23: the environment starts as Harbor's docker backend starts its main container: the
    image's ENTRYPOINT (or the compose service's ``entrypoint``) with ``command`` (the compose
    service's, else Harbor's ``sh -c "sleep infinity"``) as its arguments."""
    entrypoint = command = None
    if compose is not None:
        where = f"{compose['file']}: service {compose['name']!r}"
        entrypoint = service_argv(compose["service"], "entrypoint", where)
        command = service_argv(compose["service"], "command", where)
    return FirstProcess(entrypoint=entrypoint, command=HARBOR_MAIN_COMMAND if command is None else command)


def _healthcheck(environment: _Table) -> Healthcheck | None:
    """[environment.healthcheck] as Harbor's ``HealthcheckConfig`` reads it, with its defaults; a value
    Harbor would misread (a negative period, no retries, an empty command) is refused, naming the key."""
    if environment.data.get("healthcheck") is None:
        environment.take("healthcheck")
        return None
    table = environment.table("healthcheck")
    command = table.string("command")
    if command is None or not command.strip():
        raise TaskError(f"{table.where('command')} must be a non-empty command (a string run with bash -c)")
    if "\0" in command:
        raise TaskError(f"{table.where('command')} must not contain a NUL character")
    start_period = table.take("start_period_sec")
    if start_period is not None and (
        not is_number(start_period) or not math.isfinite(start_period) or start_period < 0
    ):
        shown = start_period if is_number(start_period) else type_name(start_period)
        raise TaskError(f"{table.where('start_period_sec')} must be a number of seconds, 0 or more, got {shown}")
    retries = table.number("retries", whole=True)
    values = {
        "interval_sec": table.number("interval_sec"),
        "timeout_sec": table.number("timeout_sec"),
        "start_period_sec": float(start_period) if start_period is not None else None,
        "start_interval_sec": table.number("start_interval_sec"),
        "retries": retries,
    }
    return Healthcheck(command=command, **{key: value for key, value in values.items() if value is not None})


def _bound_folder(root: Path, environment: ImageEnvironment, compose: dict | None):
    """environment/docker-compose.yaml's main service: a volume binding a folder of environment/ at the
    working directory ([environment] workdir, else the service's working_dir), as import_tasks writes
    for a Terminal-Bench task that had one; its other keys are Harbor's business, not read here."""
    if compose is None or not compose["service"].get("volumes"):
        return None
    where = f"{compose['file']}: service {compose['name']!r}"
    workdir = environment.workdir or service_workdir(compose["service"], where)
    return bound_folder(root / "environment", compose["service"], where, workdir)


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


def _harbor_environment(root: Path, table: _Table) -> tuple[ImageEnvironment, dict, dict]:
    """The image, the task's environment variables and the [environment] part of the request."""
    _linux_only(table)
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
    environment = dataclasses.replace(environment, workdir=_workdir(table))
    request = {
        "build_timeout_secs": table.number("build_timeout_sec"),
        "cpus": table.number("cpus"),
        "memory_mb": _megabytes(table, "memory"),
        "storage_mb": _megabytes(table, "storage"),
    }
    env = _literal_env(table.table("env"))
    return environment, env, {**request, "network": _environment_network(table)}


def _linux_only(table: _Table) -> None:
    """An environment table's ``os``, ``gpus`` and ``tpu``: Linux without accelerators, or a refusal."""
    task_os = table.take("os", "linux")
    if not isinstance(task_os, str) or task_os.lower() not in ("linux", "windows"):
        raise TaskError(f"{table.where('os')} must be linux or windows, got {task_os!r}")
    if task_os.lower() == "windows":
        raise TaskError(f"{table.where('os')} = 'windows': Windows tasks cannot run here (Linux only)")
    gpus = table.take("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise TaskError(f"{table.where('gpus')} must be a whole number, got {type_name(gpus)}")
    if gpus:
        raise TaskError(f"{table.where('gpus')} = {gpus}: this executor has no GPUs")
    if table.take("tpu") is not None:
        raise TaskError(f"{table.where('tpu')}: this executor has no TPUs")


def _workdir(table: _Table) -> str | None:
    value = table.string("workdir")
    if value is None:
        return None
    where = table.where("workdir")
    if not value.startswith("/") or ".." in value.split("/") or CONTROL_CHARS.search(value.replace(" ", "")):
        raise TaskError(f"{where} must be an absolute path without '..' or control characters, got {value[:80]!r}")
    return posixpath.normpath(value)


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


def _environment_network(table: _Table) -> NetworkRequest | None:
    """[environment]'s network, as Harbor 0.25 reads it (``BaselineNetworkPolicyConfig``):
    ``network_mode`` (``public`` when absent), or the older ``allow_internet`` when the table has
    neither ``network_mode`` nor ``allowed_hosts``. None when it says nothing."""
    mode = _network_mode(table)
    hosts = _allowed_hosts(table)
    allow_internet = table.boolean("allow_internet")
    if hosts and mode != ALLOWLIST:
        _needs_allowlist(table, mode, "public by default")
    if mode is None and hosts is None:
        if allow_internet is None:
            return None
        mode = PUBLIC if allow_internet else NO_NETWORK
    return NetworkRequest(mode or PUBLIC, hosts or ())


def _phase_network(table: _Table) -> NetworkRequest | None:
    """[agent]'s or [verifier]'s network for its phase (Harbor's ``PhaseNetworkPolicyConfig``): a
    ``network_mode`` replaces [environment]'s whole policy for the phase; ``allowed_hosts`` goes with
    ``network_mode = 'allowlist'``, even an empty list. None: the phase has [environment]'s."""
    mode = _network_mode(table)
    hosts = _allowed_hosts(table)
    if hosts is not None and mode is None or hosts and mode != ALLOWLIST:
        _needs_allowlist(table, mode, "without one the phase has [environment]'s network")
    return NetworkRequest(mode, hosts or ()) if mode is not None else None


def _network_mode(table: _Table) -> str | None:
    mode = table.take("network_mode")
    if mode is not None and mode not in NETWORK_MODES:
        shown = repr(mode) if isinstance(mode, str) else type_name(mode)
        raise TaskError(f"{table.where('network_mode')} must be one of {', '.join(NETWORK_MODES)}, got {shown}")
    return mode


def _needs_allowlist(table: _Table, mode: str | None, without: str) -> NoReturn:
    where = table.where("allowed_hosts")
    if mode is None:
        raise TaskError(
            f"{where} goes with network_mode = 'allowlist', and [{table.path}] sets no network_mode ({without})"
        )
    raise TaskError(f"{where} goes with network_mode = 'allowlist', not {mode!r}")


def _allowed_hosts(table: _Table) -> tuple[str, ...] | None:
    """The table's ``allowed_hosts``, each entry checked as Harbor checks it and as the egress proxy
    reads it (a name, ``*.suffix``, an IPv4 or IPv6 address, a CIDR; no URL, port, brackets or zone),
    lower case, without a trailing dot, duplicates dropped. None when the key is absent."""
    value = table.take("allowed_hosts")
    if value is None:
        return None
    where = table.where("allowed_hosts")
    if not isinstance(value, list):
        raise TaskError(f"{where} must be a list of host names, addresses or CIDRs, got {type_name(value)}")
    hosts = []
    for index, entry in enumerate(value):
        if not isinstance(entry, str):
            raise TaskError(f"{where}[{index}] must be a string, got {type_name(entry)}")
        host = _allowed_host(where, entry)
        if host not in hosts:
            hosts.append(host)
    return tuple(hosts)


def _allowed_host(where: str, entry: str) -> str:
    host = entry.strip().lower().rstrip(".")
    shown = f"{where}: {entry[:100]!r}"
    if not host:
        raise TaskError(f"{where}: an entry is empty; give a host name, an address or a CIDR")
    if "://" in host:
        raise TaskError(f"{shown} is a URL; give a host name, an address or a CIDR")
    if "[" in host or "]" in host:
        raise TaskError(f"{shown} has brackets; give the address alone (as in ::1), without a port")
    if "*" in host and not (host.startswith("*.") and "*" not in host[2:]):
        raise TaskError(f"{shown} has a wildcard other than a leading '*.' (as in *.example.com)")
    try:
        rule = parse_rule(host)  # the egress proxy's own syntax: a name, *.domain, an address, a CIDR
    except ValueError as exc:
        raise TaskError(f"{shown} {exc}") from None
    if rule.port is not None:
        raise TaskError(f"{shown} names a port; give a host name, an address or a CIDR (every port is allowed)")
    name = host.removeprefix("*.")  # as written: parse_rule has made a non-ASCII name IDNA
    if rule.network is None and not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        raise TaskError(f"{shown} is not a host name (letters, digits and hyphens between dots), an address or a CIDR")
    return host


def _user(table: _Table) -> str | None:
    """A phase's ``user`` (Harbor's ``str | int``): a name or uid of the image, with ``:group`` as
    Docker's ``--user`` takes it; looked up in the image's /etc/passwd when its root is mounted."""
    value = table.take("user")
    where = table.where("user")
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 65536:
            raise TaskError(f"{where} must be a uid from 0 to 65535, got {value}")
        return str(value)
    if not isinstance(value, str):
        raise TaskError(f"{where} must be a user name or a uid, got {type_name(value)}")
    name, colon, group = value.partition(":")
    if not _USER_NAME.fullmatch(name) or colon and not _USER_NAME.fullmatch(group):
        raise TaskError(
            f"{where} must be a user name or uid, optionally ':group' (as Docker's --user), got {value[:80]!r}"
        )
    return value


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


def _harbor_verifier(
    root: Path,
    table: _Table,
    environment: ImageEnvironment,
    env: dict[str, str],
    memory_mb: int | None,
    *,
    required: bool = True,
) -> tuple[Verifier, NetworkRequest | None]:
    """[verifier]: its tests, variables, and where it runs (Harbor's ``VerifierConfig``); with a
    separate verifier, also its environment's network (the verifier phase's unless [verifier] says).
    ``required``: tests/test.sh must be there (a multi-step task's steps may each bring their own,
    harbor_steps.py)."""
    if not is_folder(root / "tests", "tests"):
        if required:
            raise TaskError("task has no tests/test.sh (required)")
    else:
        regular_file(root / "tests" / "test.sh", "tests/test.sh", required=required)
    isolated = bool(table.boolean("isolated"))
    separate, network = _separate_verifier(root, [(table, "tests")], environment, env, memory_mb)
    if separate is not None and isolated:
        raise TaskError(
            "task.toml: [verifier] isolated = true goes with a verifier on the agent's file system, not with "
            "environment_mode = 'separate' (which sees only the artifacts already)"
        )
    verifier = Verifier(
        script="test.sh",
        files=folder_files(root / "tests", "tests") if is_folder(root / "tests", "tests") else [],
        env=_literal_env(table.table("env")),
        isolated=isolated,
        separate=separate,
    )
    return verifier, network


def _separate_verifier(
    root: Path,
    sites: list[tuple[_Table, str]],
    environment: ImageEnvironment,
    env: dict[str, str],
    memory_mb: int | None,
) -> tuple[SeparateVerifier | None, NetworkRequest | None]:
    """``environment_mode`` and the verifier's environment table, as Harbor resolves them
    (``verifier_mode.py``). ``sites``: each verifier table with its tests folder, the nearest first (a
    step's ``[steps.verifier]`` with ``steps/<name>/tests``, then [verifier] with ``tests``). The mode:
    the first table's that names one (``separate`` too when its ``environment`` table is there and no
    mode is named), else ``shared``. When separate, its image: by site, the table's ``environment``
    docker_image, else a Dockerfile in its tests folder (its context); else the task's own environment
    afresh. Its environment: the first ``environment`` table's (its workdir, env, memory, network:
    ``public`` unless it says, as Harbor's default), else a copy of [environment]."""
    modes = [_verifier_mode(table) for table, _tests in sites]  # each table checked
    mode = next((mode for mode in modes if mode is not None), None)
    if mode != "separate":
        return None, None
    candidates = [
        (table.table("environment") if "environment" in table.data else None, tests) for table, tests in sites
    ]
    config = next((table for table, _tests in candidates if table is not None), None)
    image, bundled = _verifier_image(root, candidates, environment)
    if config is None:
        return SeparateVerifier(environment=image, bundled=bundled, env=env, memory_mb=memory_mb), None
    _linux_only(config)
    separate = SeparateVerifier(
        environment=dataclasses.replace(image, workdir=_workdir(config)),
        bundled=bundled,
        env=_literal_env(config.table("env")),
        memory_mb=_megabytes(config, "memory"),
        build_timeout_secs=config.number("build_timeout_sec"),
    )
    config.number("cpus")  # checked, and recorded as [environment]'s is: no CPU quota here
    _megabytes(config, "storage")  # checked: the evaluation's disk quota covers both roots (docs/harbor.md)
    return separate, _environment_network(config) or NetworkRequest()


def _verifier_mode(table: _Table) -> str | None:
    """One verifier table's own mode (Harbor's ``_resolve_mode``): its ``environment_mode``, else
    ``separate`` when its ``environment`` table is there, else None (said nowhere here)."""
    mode = table.take("environment_mode")
    if mode is not None and mode not in ("shared", "separate"):
        shown = repr(mode) if isinstance(mode, str) else type_name(mode)
        raise TaskError(f"{table.where('environment_mode')} must be 'shared' or 'separate', got {shown}")
    own = "environment" in table.data
    if mode == "shared" and own:
        raise TaskError(
            f"task.toml: [{table.path}] environment_mode = 'shared' goes with no [{table.path}.environment] (the "
            "verifier runs in the agent's environment); remove the table or set environment_mode = 'separate'"
        )
    return mode or ("separate" if own else None)


def _verifier_image(
    root: Path, candidates: list[tuple[_Table | None, str]], environment: ImageEnvironment
) -> tuple[ImageEnvironment, bool]:
    """The separate verifier's image and whether it brings its own /tests (Harbor's ``bundled_tests``):
    by candidate (an ``environment`` table, or None, with its tests folder), its docker_image, else
    ``<tests>/Dockerfile``; else the task's environment."""
    for config, tests in candidates:
        compose = f"{tests}/docker-compose.yaml"
        if regular_file(root / compose, compose, required=False):
            raise TaskError(f"{compose}: a verifier of several compose services is not supported here")
        image = config.take("docker_image") if config is not None else None
        if image is not None:
            where = config.where("docker_image")
            return image_environment(image, where, where), True
        dockerfile = f"{tests}/Dockerfile"
        if regular_file(root / dockerfile, dockerfile, required=False):
            return ImageEnvironment(dockerfile=dockerfile, context=tests), True
    return environment, False  # [environment]'s workdir with it, unless the environment table has its own


def _artifacts(config: _Table, services=(), key: str = "artifacts") -> tuple[ArtifactEntry, ...]:
    """The top-level ``artifacts`` (Harbor's ``list[str | ArtifactConfig]``): paths, or tables of
    ``source``, ``destination`` and ``service`` (main, or one of ``services``, the compose file's others,
    read from its root); each checked as Harbor checks it, and as the listed name of what it collects must be (artifacts.check_path). /logs/artifacts is collected whatever it says.
    ``key``: how a refusal names the list (a step's: ``[steps] artifacts``, harbor_steps.py)."""
    value = config.take("artifacts", [])
    if not isinstance(value, list):
        raise TaskError(f"task.toml: {key} must be a list of paths or {{source, destination}} tables, "
                        f"got {type_name(value)}")  # fmt: skip
    entries: list[ArtifactEntry] = []
    for index, item in enumerate(value):
        where = f"task.toml: {key}[{index}]"
        if isinstance(item, str):
            item = {"source": item}
        if not isinstance(item, dict):
            raise TaskError(f"{where} must be a path or a table with a source, got {type_name(item)}")
        entry = _artifact(where, item, {MAIN, *(service.name for service in services)})
        agents = entry.service == MAIN  # a service's own root has no folder of the agent's or the verifier's
        if agents and (_within(entry.source, VERIFIER_LOGS) or _within(entry.source, "/tests")):
            raise TaskError(f"{where} source {entry.source!r} is the verifier's own folder, not the agent's")
        if agents and _within(entry.source, ARTIFACTS_DIR) and entry.destination is None:
            continue  # collected at its own place with /logs/artifacts already (Harbor's "covered")
        if all(entry.listed != other.listed for other in entries):
            entries.append(entry)
    return tuple(entries)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def _artifact(where: str, item: dict, names: set[str]) -> ArtifactEntry:
    source = item.get("source")
    if source is None:
        raise TaskError(f"{where} needs a source: a path in the agent's environment (as /app/out.txt)")
    if not isinstance(source, str) or not source.strip("/ "):
        shown = repr(source) if isinstance(source, str) else type_name(source)
        raise TaskError(f"{where} source must be a path in the agent's environment (as /app/out.txt), got {shown}")
    if CONTROL_CHARS.search(source.replace(" ", "")) or "\\" in source:
        raise TaskError(f"{where} source {source[:100]!r} has a control character or a backslash")
    if ".." in source.split("/"):
        raise TaskError(f"{where} source must not contain '..' components, got {source[:100]!r}")
    service = item.get("service")
    if service is not None and not isinstance(service, str):
        raise TaskError(f"{where} service must be a compose service's name, got {type_name(service)}")
    service = MAIN if service is None else service
    if service not in names:
        raise TaskError(
            f"{where} service = {service[:60]!r} is not a service of environment/docker-compose.yaml "
            f"({', '.join(sorted(names))})"
        )
    if service != MAIN and not source.startswith("/"):
        raise TaskError(f"{where} source must be an absolute path in service {service!r}, got {source[:100]!r}")
    exclude = _artifact_exclude(where, item.get("exclude", []))
    destination = _artifact_destination(where, item.get("destination"))
    entry = ArtifactEntry(source=posixpath.normpath("/" + source.lstrip("/")), destination=destination,
                          service=service, exclude=exclude)  # fmt: skip
    try:
        check_artifact_path(entry.listed)
    except UnsafeName as exc:
        raise TaskError(f"{where} cannot be listed as {entry.listed[:100]!r}: {exc}") from None
    return entry


def _artifact_exclude(where: str, value: object) -> tuple[str, ...]:
    """Harbor's ``exclude``: tar ``--exclude`` patterns for a folder artifact (ignored for a file, as in
    Harbor); each a non-empty string without control characters, at most MAX_EXCLUDE of them. A
    trailing ``/`` is dropped (tar matches names, and a folder's has none)."""
    if not isinstance(value, list) or not all(isinstance(pattern, str) for pattern in value):
        raise TaskError(f"{where} exclude must be a list of patterns, got {type_name(value)}")
    if len(value) > MAX_EXCLUDE:
        raise TaskError(f"{where} exclude has {len(value)} patterns, over the {MAX_EXCLUDE} this executor takes")
    patterns = []
    for pattern in value:
        if (
            not pattern.strip("/ ")
            or len(pattern) > MAX_EXCLUDE_CHARS
            or CONTROL_CHARS.search(pattern.replace(" ", ""))
        ):
            raise TaskError(
                f"{where} exclude: {pattern[:100]!r} must be a pattern of 1 to {MAX_EXCLUDE_CHARS} characters, "
                "no control characters (spaces are fine)"
            )
        patterns.append(pattern.rstrip("/"))
    return tuple(dict.fromkeys(patterns))


def _artifact_destination(where: str, value: object) -> str | None:
    """Harbor's checks of ``destination``: a relative path, forward slashes, no ``..``, not ``manifest.json``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TaskError(f"{where} destination must be a relative path, got {type_name(value)}")
    if "\\" in value:
        raise TaskError(f"{where} destination must use forward slashes, got {value[:100]!r}")
    if value.startswith("/"):
        raise TaskError(f"{where} destination must be a relative path, got {value[:100]!r}")
    if ".." in value.split("/"):
        raise TaskError(f"{where} destination must not contain '..' components, got {value[:100]!r}")
    normal = posixpath.normpath(value)
    if normal in (".", "manifest.json"):
        raise TaskError(f"{where} destination {value[:100]!r} names no file, or the reserved manifest.json")
    return normal


def _collect(table: _Table, services, key: str = "[[verifier.collect]]") -> tuple[Collect, ...]:
    """[[verifier.collect]] (Harbor's ``VerifierCollectConfig``): ``command`` (required), ``service``
    (default main; a service of environment/docker-compose.yaml), ``timeout_sec`` (default 60),
    ``user`` (a name or a uid; default the service's user: main's the image's User, as Harbor's exec)."""
    value = table.take("collect", [])
    where = table.where("collect")
    if not isinstance(value, list):
        raise TaskError(f"{where} must be [[verifier.collect]] tables, got {type_name(value)}")
    names = {MAIN, *(service.name for service in services)}
    hooks = []
    for index, hook in enumerate(value):
        shown = f"task.toml: {key} {index + 1}"
        if not isinstance(hook, dict):
            raise TaskError(f"{shown} must be a table, got {type_name(hook)}")
        unknown = sorted(set(hook) - {"command", "service", "timeout_sec", "user"})
        if unknown:
            raise TaskError(f"{shown}: key {unknown[0]!r} is not one of command, service, timeout_sec, user")
        command = hook.get("command")
        if not isinstance(command, str) or not command.strip() or "\0" in command:
            raise TaskError(f"{shown}: 'command' must be a shell command (a non-empty string)")
        service = hook.get("service", MAIN)
        if not isinstance(service, str) or not SERVICE_NAME.fullmatch(service.strip()):
            raise TaskError(f"{shown}: 'service' must be a compose service name, got {service!r}")
        service = service.strip()
        if service not in names:
            raise TaskError(
                f"{shown}: 'service' {service!r} is not a service of environment/docker-compose.yaml "
                f"({', '.join(sorted(names))})"
            )
        timeout = hook.get("timeout_sec", 60.0)
        if not is_number(timeout) or not math.isfinite(timeout) or timeout <= 0:
            raise TaskError(f"{shown}: 'timeout_sec' must be a positive number, got {timeout!r}")
        user = hook.get("user")
        if isinstance(user, int) and not isinstance(user, bool) and user >= 0:
            user = str(user)
        if user is not None and (not isinstance(user, str) or not user or CONTROL_CHARS.search(user)):
            raise TaskError(f"{shown}: 'user' must be a user name or a uid, got {user!r}")
        hooks.append(Collect(command=command, service=service, timeout_secs=float(timeout), user=user))
    return tuple(hooks)


def _harbor_solution(root: Path) -> tuple[str | None, list[SupportFile]]:
    """solution/solve.sh, and every file of solution/ (Harbor's OracleAgent uploads them to /solution)."""
    if not is_folder(root / "solution", "solution"):
        return None, []
    script = read_text(root / "solution" / "solve.sh", "solution/solve.sh", required=False)
    if script is None:
        return None, []
    return script, folder_files(root / "solution", "solution")
