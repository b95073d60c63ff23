"""Reading and validating an extracted task folder (SPEC section 4).

``load_task`` turns the folder into a ``TaskSpec`` or raises ``TaskError``
with one sentence naming the file or key at fault. A folder holding
``task.toml`` (Harbor) or ``task.yaml`` (Terminal-Bench 1.x) is read by
taskformats.py (SPEC §17) with this module's readers. YAML (``workspace.yaml``,
``task.yaml``, ``docker-compose.yaml``) is parsed with PyYAML's safe loader
(``load_yaml_mapping``), after three guards:

1. the file is at most ``MAX_YAML_BYTES``;
2. every tag is a plain YAML one (``!!python/...`` is named and refused,
   not just failed on by the constructor);
3. the document, with every alias expanded, has at most ``MAX_YAML_NODES``
   nodes, so a "billion laughs" alias bomb (or a merge-key one) is refused
   before anything walks it; a recursive alias is refused too.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import yaml

from evaluations.environments import BadEnvironment, check_name
from evaluations.images import reference
from evaluations.images.errors import ImageError
from evaluations.network.urlguard import URLRefused, check_git_url
from executor_project.config import Config

MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_NODES = 100_000
MAX_BASE_COMMIT_LENGTH = 256
# prompt.md is the agent's --instruction argument: Linux refuses one argv string over 128 KiB
# (MAX_ARG_STRLEN), so that file is held to this whatever MAX_PROMPT_BYTES says.
MAX_INSTRUCTION_BYTES = 128 * 1024 - 1

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_YAML_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {
    _YAML_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "timestamp", "binary", "merge")
}
_KINDS = (("fail_to_pass_", "fail_to_pass"), ("pass_to_pass_", "pass_to_pass"))


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

    @property
    def kind(self) -> str:
        return "image" if self.image is not None else "dockerfile"

    @property
    def ref(self) -> str:
        return self.image if self.image is not None else self.dockerfile


@dataclass(frozen=True)
class Verifier:
    """How a Harbor or Terminal-Bench task's tests run (SPEC §17): after the agent, in a fresh sandbox on
    the file system it left, ``files`` at /tests, /logs/verifier empty, ``bash /tests/<script>`` from the
    working directory, with ``env`` on top of the task's."""

    script: str  # relative to /tests: "test.sh" (Harbor) or "run-tests.sh" (Terminal-Bench 1.x)
    files: list[SupportFile] = field(default_factory=list)  # every file of /tests, the script included
    env: dict[str, str] = field(default_factory=dict)
    isolated: bool = False  # [verifier] isolated: the image plus only the working directory the agent left


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
    network: str | None = None  # no-network | public | allowlist
    allowed_hosts: tuple[str, ...] = ()


GRADERS = ("exit_code", "reward_file", "pytest", "swebench")


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


def load_task(
    task_root: Path | str,
    *,
    allow_file_urls: bool = False,
    max_prompt_bytes: int = Config.max_prompt_bytes,
    max_tests: int = Config.max_tests,
) -> TaskSpec:
    """Read and validate the task folder; raise TaskError.

    ``repo`` is checked for its form only (scheme, no leading ``-``, no
    ``<transport>::``); its host address is checked at clone time.

    The caps (MAX_PROMPT_BYTES, MAX_TESTS) are checked before the text they bound is read: a
    file's size from its inode (what the archive member declared, as extraction wrote and
    counted it), the tests as they are counted; nothing over a cap reaches memory or the row.
    """
    root = Path(task_root)
    if os.path.lexists(root / "task.toml") or os.path.lexists(root / "task.yaml"):
        # taskformats reads with this module's helpers, so it is imported here, not at the top.
        from evaluations.pipeline import taskformats

        return taskformats.load_other_format(root, max_prompt_bytes=max_prompt_bytes)
    data, node = load_yaml_mapping(root / "workspace.yaml", "workspace.yaml")
    scripts = _scripts(root / "tests", max_tests)
    checks = _checks(root / "checks.txt", max_tests, len(scripts))
    taken = {t.name for t in scripts}
    for check in checks:
        if check.name in taken:
            raise TaskError(f"tests/{check.name}.sh has the same test name as the command at {check.source}")
    environment = _environment(data, root)
    repo = _repo(data, allow_file_urls, image=isinstance(environment, ImageEnvironment))
    return TaskSpec(
        root=root,
        repo=repo,
        base_commit=_base_commit(data, node) if repo is not None else _no_base_commit(data),
        version=_version(data, node),
        language=_optional_str(data, "language"),
        install=_install(data),
        static_assets=_static_assets(data),
        env=_env(data, node),
        prompt=read_text(
            root / "prompt.md", "prompt.md", required=True, cap=prompt_cap(max_prompt_bytes, instruction=True)
        ),
        original_pr=read_text(
            root / "original_pr.md",
            "original_pr.md",
            required=False,
            lenient=True,
            cap=prompt_cap(max_prompt_bytes, instruction=False),
        ),
        tests=scripts + checks,
        support_files=_support_files(root / "tests"),
        environment=environment,
        cache=_cache(data),
        grader=_grader(data),
    )


# -- workspace.yaml ---------------------------------------------------------


def load_yaml_mapping(path: Path, shown: str) -> tuple[dict, yaml.MappingNode]:
    """The YAML file ``shown`` (required) as a mapping, and its node, after the three guards."""
    data, node = load_yaml(path, shown)
    if node is None:
        raise TaskError(f"{shown} is empty; it must be a mapping of keys to values")
    if not isinstance(data, dict):
        raise TaskError(f"{shown} must be a mapping of keys to values, not {type_name(data)}")
    return data, node


def load_yaml(path: Path, shown: str) -> tuple[object, yaml.Node | None]:
    """The YAML file ``shown`` (required), and its node (None: the file holds no document), after
    the three guards."""
    raw = read_bytes(path, shown, required=True, cap=Cap(MAX_YAML_BYTES))
    loader = None
    try:
        loader = yaml.SafeLoader(raw)  # checks the encoding already
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_nodes(node, shown)
        data = loader.construct_document(node)
    except yaml.reader.ReaderError:
        raise TaskError(f"{shown} is not valid UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        where = f"line {exc.problem_mark.line + 1}: " if exc.problem_mark else ""
        raise TaskError(f"{shown} is not valid YAML ({where}{exc.problem})") from None
    except yaml.YAMLError as exc:
        raise TaskError(f"{shown} is not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise TaskError(f"{shown} is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def _check_nodes(root: yaml.Node, shown: str) -> None:
    """Refuse non-plain tags, recursive aliases and too big an expanded document.

    Aliases make the node graph a DAG (or a cycle); the expanded size is
    computed once per distinct node (memoised), so the check itself is
    linear in the file, whatever the bomb would expand to.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            sizes[key] = min(total, MAX_YAML_NODES + 1)
            open_nodes.discard(key)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise TaskError(f"{shown} has a recursive alias (line {node.start_mark.line + 1})")
        if node.tag not in _PLAIN_TAGS:
            tag = node.tag.replace(_YAML_TAG, "!!")
            raise TaskError(
                f"{shown} uses the YAML tag {tag} (line {node.start_mark.line + 1}); only plain values are allowed"
            )
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise TaskError(f"{shown} has a recursive alias (line {child.start_mark.line + 1})")
            if id(child) not in sizes:
                stack.append((child, False))
    if sizes[id(root)] > MAX_YAML_NODES:
        raise TaskError(f"{shown} expands to more than {MAX_YAML_NODES} values (alias bomb?)")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _raw_scalar(mapping: yaml.Node | None, key: str) -> str | None:
    """The text of a scalar as written (``0123`` stays ``0123``, ``3.10`` stays ``3.10``)."""
    if not isinstance(mapping, yaml.MappingNode):
        return None
    for key_node, value_node in mapping.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value_node.value if isinstance(value_node, yaml.ScalarNode) else None
    return None


def _value_node(mapping: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(mapping, yaml.MappingNode):
        for key_node, value_node in mapping.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value_node
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _repo(data: dict, allow_file_urls: bool, *, image: bool = False) -> str | None:
    if "repo" not in data or data["repo"] is None:
        if image:
            return None  # the image is the workspace: its WorkingDir
        raise TaskError(
            "workspace.yaml: missing required key 'repo' (only a task with an image environment may omit it)"
        )
    repo = data["repo"]
    if not isinstance(repo, str):
        raise TaskError("workspace.yaml: 'repo' must be a string (a git URL)")
    try:
        check_git_url(repo, allow_file=allow_file_urls, resolve=False, label="workspace.yaml: 'repo'")
    except URLRefused as exc:
        raise TaskError(str(exc)) from None
    return repo


def _no_base_commit(data: dict) -> None:
    if data.get("base_commit") is not None:
        raise TaskError("workspace.yaml: 'base_commit' without 'repo': a base commit needs a repository")
    return None


def _base_commit(data: dict, node: yaml.Node) -> str:
    if "base_commit" not in data or data["base_commit"] is None:
        raise TaskError("workspace.yaml: missing required key 'base_commit'")
    value = data["base_commit"]
    if _is_number(value):  # an all-digit short sha parsed as a number
        value = _raw_scalar(node, "base_commit") or str(value)
    if not isinstance(value, str):
        raise TaskError("workspace.yaml: 'base_commit' must be a string (a commit id or ref)")
    if not value:
        raise TaskError("workspace.yaml: 'base_commit' must not be empty")
    if value.startswith("-"):
        raise TaskError("workspace.yaml: 'base_commit' must not start with '-'")
    if _CONTROL.search(value):
        raise TaskError("workspace.yaml: 'base_commit' must not contain whitespace or control characters")
    if len(value) > MAX_BASE_COMMIT_LENGTH:
        raise TaskError(f"workspace.yaml: 'base_commit' is longer than {MAX_BASE_COMMIT_LENGTH} characters")
    return value


def _version(data: dict, node: yaml.Node) -> str | None:
    value = data.get("version")
    if value is None or isinstance(value, str):
        return value
    if _is_number(value):
        return _raw_scalar(node, "version") or str(value)
    raise TaskError("workspace.yaml: 'version' must be a string or a number")


def _optional_str(data: dict, key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise TaskError(f"workspace.yaml: '{key}' must be a string")
    return value


def _environment(data: dict, root: Path) -> str | ImageEnvironment | None:
    value = data.get("environment")
    if value is None:
        return None
    if isinstance(value, dict):
        return _image_environment(value, root)
    if not isinstance(value, str):
        raise TaskError(
            "workspace.yaml: 'environment' must be an environment name, {image: REF} "
            "or {dockerfile: PATH, context: DIR, build_args: {...}, target: STAGE}"
        )
    try:
        return check_name(value)
    except BadEnvironment as exc:
        raise TaskError(f"workspace.yaml: 'environment': {exc}") from None


_IMAGE_KEYS = {"image", "dockerfile", "context", "build_args", "target"}
MAX_IMAGE_REF_CHARS = 512  # Docker's own limit on a reference is 255 per name; a digest adds 72


def _image_environment(value: dict, root: Path) -> ImageEnvironment:
    where = "workspace.yaml: 'environment'"
    unknown = sorted(str(key) for key in value if key not in _IMAGE_KEYS)
    if unknown:
        raise TaskError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_IMAGE_KEYS))})")
    if ("image" in value) == ("dockerfile" in value):
        raise TaskError(f"{where}: give exactly one of 'image' (a reference) and 'dockerfile' (a path)")
    if "image" in value:
        for key in ("context", "build_args", "target"):
            if key in value:
                raise TaskError(f"{where}: {key!r} goes with 'dockerfile', not with 'image'")
        return image_environment(value["image"], f"{where}: 'image'", where)
    dockerfile = inside_task(value["dockerfile"], root, f"{where}: 'dockerfile'", want_dir=False)
    context = inside_task(
        value.get("context", str(Path(dockerfile).parent)), root, f"{where}: 'context'", want_dir=True
    )
    build_args = value.get("build_args") or {}
    if not isinstance(build_args, dict):
        raise TaskError(f"{where}: 'build_args' must be a mapping of names to values")
    args = {}
    for key, arg in build_args.items():
        if not isinstance(key, str) or not key:
            raise TaskError(f"{where}: 'build_args' names must be non-empty strings")
        if isinstance(arg, bool) or not isinstance(arg, str | int | float):
            raise TaskError(f"{where}: build arg {key!r} must be a string or a number, got {type_name(arg)}")
        args[key] = str(arg)
    target = value.get("target")
    if target is not None and (not isinstance(target, str) or not target):
        raise TaskError(f"{where}: 'target' must be a stage name")
    return ImageEnvironment(dockerfile=dockerfile, context=context, build_args=args, target=target)


def image_environment(image: object, key: str, where: str) -> ImageEnvironment:
    """``ImageEnvironment(image=...)`` for a reference of the right form; ``key`` names the key,
    ``where`` prefixes the reference parser's own sentence (which names the reference)."""
    if not isinstance(image, str) or not image.strip():
        raise TaskError(f"{key} must be an image reference such as python:3.12-slim")
    if len(image) > MAX_IMAGE_REF_CHARS or _CONTROL.search(image) or any(c.isspace() for c in image):
        raise TaskError(f"{key} {image[:80]!r} is not an image reference")
    try:
        reference.parse(image)  # its form; the registry it names is IMAGE_DEFAULT_REGISTRY's business
    except ImageError as exc:
        raise TaskError(f"{where}: {exc}") from None
    return ImageEnvironment(image=image)


def inside_task(path: object, root: Path, where: str, *, want_dir: bool) -> str:
    """``path`` relative to the task root, normalised; it must name a file (or folder) inside it.

    ``where`` names the key that gave it ("workspace.yaml: 'environment': 'dockerfile'")."""
    if not isinstance(path, str) or not path:
        raise TaskError(f"{where} must be a path inside the task")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if path.startswith("/") or ".." in parts:
        raise TaskError(f"{where} {path!r} must be a relative path inside the task, without '..'")
    relative = "/".join(parts) or "."
    real_root = os.path.realpath(root)
    real = os.path.realpath(root / relative)
    if real != real_root and not real.startswith(real_root + "/"):
        raise TaskError(f"{where} {path!r} leads outside the task (a symbolic link)")
    if want_dir and not os.path.isdir(real):
        raise TaskError(f"{where} {path!r} is not a folder of the task")
    if not want_dir and not os.path.isfile(real):
        raise TaskError(f"{where} {path!r} is not a file of the task")
    return relative


def _cache(data: dict) -> bool:
    value = data.get("cache", True)
    if not isinstance(value, bool):
        raise TaskError(f"workspace.yaml: 'cache' must be true or false, got {type_name(value)}")
    return value


# SPEC §19's swebench grader is named by the contract but not built yet.
WORKSPACE_GRADERS = ("exit_code", "reward_file", "pytest")


def _grader(data: dict) -> str:
    value = data.get("grader", "exit_code")
    if value in WORKSPACE_GRADERS:
        return value
    if value == "swebench":
        raise TaskError(
            "workspace.yaml: 'grader' swebench is not available in this executor yet; "
            f"it grades with {', '.join(WORKSPACE_GRADERS)}"
        )
    shown = repr(value) if isinstance(value, str) else type_name(value)
    raise TaskError(f"workspace.yaml: 'grader' must be one of {', '.join(WORKSPACE_GRADERS)}, got {shown}")


def _install(data: dict) -> list[str]:
    value = data.get("install")
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TaskError("workspace.yaml: 'install' must be a list of strings")
    for number, command in enumerate(value, 1):
        if "\0" in command:
            raise TaskError(f"workspace.yaml: 'install' command {number} contains a NUL byte")
    return list(value)


def _static_assets(data: dict) -> dict:
    value = data.get("static_assets")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TaskError("workspace.yaml: 'static_assets' must be a mapping of names to assets")
    return value


def _env(data: dict, node: yaml.Node) -> dict[str, str]:
    value = data.get("env")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TaskError("workspace.yaml: 'env' must be a mapping of variable names to strings")
    env_node = _value_node(node, "env")
    env: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise TaskError(f"workspace.yaml: 'env' name {name!r} is not a valid variable name ([A-Z_][A-Z0-9_]*)")
        if isinstance(item, bool | int | float):  # FOO: 1 or CI: true, kept as written
            item = _raw_scalar(env_node, name) or str(item).lower()
        if not isinstance(item, str):
            raise TaskError(f"workspace.yaml: 'env' value of {name} must be a string")
        if "\0" in item:
            raise TaskError(f"workspace.yaml: 'env' value of {name} contains a NUL byte")
        env[name] = item
    return env


def type_name(value: object) -> str:
    if value is None:
        return "empty"
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


# -- the other files ---------------------------------------------------------


class Cap(NamedTuple):
    """The most bytes a file may hold, and the setting that says so (named in the refusal)."""

    limit: int
    setting: str = ""


def prompt_cap(max_prompt_bytes: int, *, instruction: bool) -> Cap:
    """MAX_PROMPT_BYTES; for the agent's instruction (prompt.md, instruction.md, task.yaml's
    ``instruction``) at most MAX_INSTRUCTION_BYTES too."""
    if instruction and max_prompt_bytes > MAX_INSTRUCTION_BYTES:
        why = f"the most an agent's --instruction argument holds; MAX_PROMPT_BYTES is {max_prompt_bytes}"
        return Cap(MAX_INSTRUCTION_BYTES, why)
    return Cap(max_prompt_bytes, "MAX_PROMPT_BYTES")


def _too_many_tests(where: str, max_tests: int) -> TaskError:
    return TaskError(
        f"{where} is test {max_tests + 1}, over the cap of {max_tests} tests "
        "(MAX_TESTS: tests/*.sh scripts and checks.txt commands together)"
    )


def regular_file(path: Path, shown: str, *, required: bool) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if required:
            raise TaskError(f"task has no {shown} (required)") from None
        return None
    if not stat.S_ISREG(st.st_mode):
        raise TaskError(f"{shown} is not a regular file")
    return st


def read_bytes(path: Path, shown: str, *, required: bool, cap: Cap | None = None) -> bytes | None:
    """The file's bytes; over ``cap`` it is refused from its size, before a byte is read."""
    st = regular_file(path, shown, required=required)
    if st is None:
        return None
    if cap is not None and st.st_size > cap.limit:
        raise TaskError(f"{shown} is larger than {cap.limit} bytes" + (f" ({cap.setting})" if cap.setting else ""))
    with open(path, "rb") as f:
        return f.read()


def read_text(path: Path, shown: str, *, required: bool, lenient: bool = False, cap: Cap | None = None) -> str | None:
    raw = read_bytes(path, shown, required=required, cap=cap)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8-sig", errors="replace" if lenient else "strict")
    except UnicodeDecodeError:
        raise TaskError(f"{shown} is not valid UTF-8 text") from None
    # A replaced byte is 3 (U+FFFD): what is stored is held to the cap too.
    if lenient and cap is not None and len(text.encode()) > cap.limit:
        raise TaskError(f"{shown} is larger than {cap.limit} bytes once its invalid UTF-8 is replaced ({cap.setting})")
    return text


def _checks(path: Path, max_tests: int, scripts: int) -> list[TestSpec]:
    """The commands of checks.txt, read a line at a time: the one past MAX_TESTS (counting the
    ``scripts`` before them) is refused before the lines after it are read."""
    if regular_file(path, "checks.txt", required=False) is None:
        return []
    tests = []
    line_number = 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                text = raw.decode("utf-8-sig" if line_number == 0 else "utf-8")
            except UnicodeDecodeError:
                raise TaskError("checks.txt is not valid UTF-8 text") from None
            for line in text.splitlines():  # as str.splitlines counts lines (\r, \f... included)
                line_number += 1
                command = line.strip()
                if not command or command.startswith("#"):
                    continue
                if "\0" in command:
                    raise TaskError(f"checks.txt line {line_number} contains a NUL byte")
                if scripts + len(tests) == max_tests:
                    raise _too_many_tests(f"checks.txt line {line_number}", max_tests)
                name = f"check_{len(tests) + 1}"
                tests.append(TestSpec(name, "check", None, command, f"checks.txt:{line_number}"))
    return tests


def _tests_dir(tests_dir: Path) -> bool:
    return is_folder(tests_dir, "tests")


def is_folder(path: Path, shown: str) -> bool:
    """False if nothing is there; True for a folder; anything else (a link too) is refused, named."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise TaskError(f"{shown} is not a folder")
    return True


def _scripts(tests_dir: Path, max_tests: int) -> list[TestSpec]:
    if not _tests_dir(tests_dir):
        return []
    entries = sorted(
        (e for e in os.scandir(tests_dir) if e.name.endswith(".sh") and e.is_file(follow_symlinks=False)),
        key=lambda e: e.name,
    )
    if len(entries) > max_tests:  # counted before any is read
        raise _too_many_tests(f"tests/{entries[max_tests].name}", max_tests)
    scripts = []
    for entry in entries:
        name = entry.name[: -len(".sh")]
        if not name:
            raise TaskError("tests/.sh has no name")
        shown = f"tests/{entry.name}"
        text = read_text(Path(entry.path), shown, required=True)
        kind = next((k for prefix, k in _KINDS if name.startswith(prefix)), "test")
        scripts.append(TestSpec(name, kind, text, None, shown))
    return scripts


def _support_files(tests_dir: Path) -> list[SupportFile]:
    """Every file under tests/ but the top-level *.sh scripts, by relative path."""
    if not _tests_dir(tests_dir):
        return []
    return [f for f in folder_files(tests_dir, "tests") if "/" in f.relpath or not f.relpath.endswith(".sh")]


def folder_files(folder: Path, shown: str) -> list[SupportFile]:
    """Every file under ``folder`` (shown as ``shown``), by path relative to it, sorted; a link or
    anything but a plain file or folder is refused, named."""
    files = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        for name in dirnames + filenames:
            st = os.lstat(here / name)
            rel = (here / name).relative_to(folder).as_posix()
            if stat.S_ISLNK(st.st_mode):
                raise TaskError(f"{shown}/{rel} is a symbolic link")
            if name in dirnames:
                continue
            if not stat.S_ISREG(st.st_mode):
                raise TaskError(f"{shown}/{rel} is not a regular file")
            data = (here / name).read_bytes()
            files.append(SupportFile(rel, data, 0o755 if st.st_mode & 0o111 else 0o644))
    files.sort(key=lambda f: f.relpath)
    return files
