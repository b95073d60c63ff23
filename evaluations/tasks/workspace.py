"""Our own task folders (SPEC §4): ``workspace.yaml``, ``prompt.md``, ``tests/*.sh``, ``checks.txt``,
``original_pr.md``, read into a ``TaskSpec`` with readers.py's guards; SWE-Forge's keys of
workspace.yaml (SPEC §19) are sweforge.py's, its ``swebench:`` mapping swebench.py's.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from evaluations.environments import BadEnvironment, check_name
from evaluations.network.urlguard import URLRefused, check_git_url
from evaluations.tasks import sweforge
from evaluations.tasks.readers import (
    CONTROL_CHARS,
    ENV_NAME,
    TaskLimits,
    folder_files,
    image_environment,
    inside_task,
    is_folder,
    is_number,
    load_yaml_mapping,
    prompt_cap,
    raw_scalar,
    read_text,
    regular_file,
    type_name,
    value_node,
)
from evaluations.tasks.spec import GRADERS, ImageEnvironment, SupportFile, TaskError, TaskSpec, TestSpec
from evaluations.tasks.swebench import read_swebench

FILE = "workspace.yaml"  # what makes a folder one of ours

MAX_BASE_COMMIT_LENGTH = 256

_KINDS = (("fail_to_pass_", "fail_to_pass"), ("pass_to_pass_", "pass_to_pass"))


def detect(root: Path) -> bool:
    return os.path.lexists(root / FILE)


def load(root: Path, limits: TaskLimits) -> TaskSpec:
    """The folder's TaskSpec; TaskError naming the file or key at fault.

    ``repo`` is checked for its form only (scheme, no leading ``-``, no
    ``<transport>::``); its host address is checked at clone time.
    """
    max_prompt_bytes, max_tests = limits.max_prompt_bytes, limits.max_tests
    data, node = load_yaml_mapping(root / "workspace.yaml", "workspace.yaml")
    scripts = _scripts(root / "tests", max_tests)
    checks = _checks(root / "checks.txt", max_tests, len(scripts))
    taken = {t.name for t in scripts}
    for check in checks:
        if check.name in taken:
            raise TaskError(f"tests/{check.name}.sh has the same test name as the command at {check.source}")
    forge = sweforge.read(data, node, prompt_cap(max_prompt_bytes, instruction=True))
    if not scripts and not checks:
        checks = forge.tests(max_tests)  # SPEC §19: SWE-Forge's test commands
    environment = _environment(data, root)
    repo = _repo(data, limits.allow_file_urls, image=isinstance(environment, ImageEnvironment))
    grader = _grader(data)
    swebench = read_swebench(data, grader, scripts=len(scripts), checks=len(checks))
    return TaskSpec(
        root=root,
        repo=repo,
        base_commit=_base_commit(data, node) if repo is not None else _no_base_commit(data),
        version=_version(data, node),
        language=_optional_str(data, "language"),
        install=_install(data) if data.get("install") is not None else forge.install or [],
        static_assets=_static_assets(data),
        env=_env(data, node),
        prompt=_prompt(root, forge.prompt, max_prompt_bytes),
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
        grader=grader,
        swebench=swebench,
        metadata=forge.metadata(),
        patch=forge.patch,
    )


def _prompt(root: Path, from_yaml: str | None, max_prompt_bytes: int) -> str:
    """prompt.md, else workspace.yaml's ``prompt`` (SWE-Forge's, SPEC §19)."""
    cap = prompt_cap(max_prompt_bytes, instruction=True)
    text = read_text(root / "prompt.md", "prompt.md", required=False, cap=cap)
    if text is not None:
        return text
    if from_yaml is None:
        raise TaskError("task has no prompt.md (required unless workspace.yaml has 'prompt')")
    return from_yaml


# -- workspace.yaml ---------------------------------------------------------


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
    if is_number(value):  # an all-digit short sha parsed as a number
        value = raw_scalar(node, "base_commit") or str(value)
    if not isinstance(value, str):
        raise TaskError("workspace.yaml: 'base_commit' must be a string (a commit id or ref)")
    if not value:
        raise TaskError("workspace.yaml: 'base_commit' must not be empty")
    if value.startswith("-"):
        raise TaskError("workspace.yaml: 'base_commit' must not start with '-'")
    if CONTROL_CHARS.search(value):
        raise TaskError("workspace.yaml: 'base_commit' must not contain whitespace or control characters")
    if len(value) > MAX_BASE_COMMIT_LENGTH:
        raise TaskError(f"workspace.yaml: 'base_commit' is longer than {MAX_BASE_COMMIT_LENGTH} characters")
    return value


def _version(data: dict, node: yaml.Node) -> str | None:
    value = data.get("version")
    if value is None or isinstance(value, str):
        return value
    if is_number(value):
        return raw_scalar(node, "version") or str(value)
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


def _cache(data: dict) -> bool:
    value = data.get("cache", True)
    if not isinstance(value, bool):
        raise TaskError(f"workspace.yaml: 'cache' must be true or false, got {type_name(value)}")
    return value


def _grader(data: dict) -> str:
    value = data.get("grader", "exit_code")
    if value in GRADERS:
        return value
    shown = repr(value) if isinstance(value, str) else type_name(value)
    raise TaskError(f"workspace.yaml: 'grader' must be one of {', '.join(GRADERS)}, got {shown}")


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
    env_node = value_node(node, "env")
    env: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise TaskError(f"workspace.yaml: 'env' name {name!r} is not a valid variable name ([A-Z_][A-Z0-9_]*)")
        if isinstance(item, bool | int | float):  # FOO: 1 or CI: true, kept as written
            item = raw_scalar(env_node, name) or str(item).lower()
        if not isinstance(item, str):
            raise TaskError(f"workspace.yaml: 'env' value of {name} must be a string")
        if "\0" in item:
            raise TaskError(f"workspace.yaml: 'env' value of {name} contains a NUL byte")
        env[name] = item
    return env


# -- the other files ---------------------------------------------------------


def _too_many_tests(where: str, max_tests: int) -> TaskError:
    return TaskError(
        f"{where} is test {max_tests + 1}, over the cap of {max_tests} tests "
        "(MAX_TESTS: tests/*.sh scripts and checks.txt commands together)"
    )


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
