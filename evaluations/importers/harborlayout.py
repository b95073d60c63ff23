"""A Terminal-Bench 1.x task (as load_task read it) written in Harbor's layout (SPEC §17).

1. ``instruction.md`` is task.yaml's ``instruction``; ``solution/solve.sh``
   its ``solution.sh`` (or solution.yaml as tasks/terminal_bench.py converts it).
2. ``environment/`` is the build context Terminal-Bench used (the task root,
   or the compose service's ``build.context``), without the files only the
   harness reads (task.yaml, the compose file, solution.sh, solution.yaml):
   the solution never reaches the image. Its Dockerfile is
   ``environment/Dockerfile`` as Harbor expects. A compose service naming a
   ready image becomes ``[environment] docker_image``.
3. ``tests/`` is Terminal-Bench's ``tests/`` plus ``run-tests.sh``, where its
   harness copied them (/tests), and a ``test.sh`` that runs ``bash
   /tests/run-tests.sh`` as the harness did, writes ``reward.txt`` from its
   exit status (for Harbor itself, which reads only that file, as Harbor's
   own mapper does) and exits with that status.
4. A compose volume binding the task's folder at its ``working_dir`` becomes
   ``[environment] workdir`` and ``environment/docker-compose.yaml`` binding
   ``./`` (environment/, the same folder less the harness's files) there.
5. ``task.toml`` says ``[verifier] grader = "pytest"`` (or ``"swebench"``
   for ``parser_name: swebench``, its ids in ``tests/config.json``): this executor grades
   the converted task as it grades the Terminal-Bench one, from the ``-rA``
   summary it captured and the exit status, never from a file written in
   the sandbox. Harbor ignores the key. ``[verifier.env]`` holds TEST_DIR
   and T_BENCH_TEST_DIR; the compose service's environment goes to
   ``[environment.env]``; task.yaml's other keys to ``[metadata]``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import yaml

from evaluations.tasks.spec import SupportFile, TaskSpec

# Files of a Terminal-Bench task root only its harness reads: not part of the image's build context.
_HARNESS_FILES = {"task.yaml", "docker-compose.yaml", "docker-compose.yml", "solution.sh", "solution.yaml"}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")

TEST_SH = """#!/bin/bash
# Made by manage.py import_tasks from a Terminal-Bench 1.x task: its harness ran
# `bash /tests/run-tests.sh` from the image's working directory and graded the pytest -rA
# summary. term-executor grades that summary and this script's exit status
# ([verifier] grader = "pytest"); reward.txt is for Harbor, which reads only that file.
bash /tests/run-tests.sh
status=$?
mkdir -p /logs/verifier
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
exit "$status"
"""


_COMPOSE_NOTE = (
    "# Made by manage.py import_tasks: the Terminal-Bench task's compose service bound its folder at its\n"
    "# working_dir; term-executor reads this volume back (the folder without its tests and solution).\n"
)


class CannotConvert(Exception):
    """The task is valid but has no faithful Harbor form; the message says why."""


def write_harbor_layout(task: TaskSpec, dest: Path) -> None:
    """Write ``task`` (format terminal-bench) as a Harbor task folder ``dest`` (created)."""
    environment = task.environment
    if environment.build_args or environment.target:
        raise CannotConvert("its compose build has args or a target, which Harbor's task.toml cannot say")
    names = {f.relpath for f in task.verifier.files}
    if "test.sh" in names:
        raise CannotConvert("tests/test.sh would be replaced by the converted task's test.sh")
    dest.mkdir(parents=True)
    (dest / "instruction.md").write_text(task.prompt if task.prompt.endswith("\n") else task.prompt + "\n")
    env_dir = dest / "environment"
    if environment.image is not None:
        env_dir.mkdir()
    else:
        _copy_context(task.root, environment.context, environment.dockerfile, env_dir)
    if task.workdir_files is not None:
        _bind_environment(environment, env_dir)
    _write_files(dest / "tests", [*task.verifier.files, SupportFile("test.sh", TEST_SH.encode(), 0o755)])
    if task.solution is not None:
        _write_files(dest / "solution", [SupportFile("solve.sh", task.solution.encode(), 0o755)])
    (dest / "task.toml").write_text(task_toml(task), encoding="utf-8")


def _bind_environment(environment, env_dir: Path) -> None:
    """The compose volume binding the task's folder at its working_dir, as environment/docker-compose.yaml
    (environment/ is that folder, less the harness's files): the Harbor reader reads it back so."""
    if environment.image is not None or environment.context != ".":
        raise CannotConvert("its compose service binds the task's folder, which is not its build context here")
    if os.path.lexists(env_dir / "docker-compose.yaml"):
        raise CannotConvert("its build context already holds a docker-compose.yaml")
    service = {"build": {"context": ".", "dockerfile": "Dockerfile"}, "volumes": [f"./:{environment.workdir}"]}
    compose = yaml.safe_dump({"services": {"main": service}}, sort_keys=False)  # Harbor's agent service
    (env_dir / "docker-compose.yaml").write_text(_COMPOSE_NOTE + compose, encoding="utf-8")


def _copy_context(root: Path, context: str, dockerfile: str, env_dir: Path) -> None:
    source = root / context

    def harness_files(folder: str, names: list[str]) -> list[str]:
        return [name for name in names if name in _HARNESS_FILES] if context == "." and folder == str(source) else []

    shutil.copytree(source, env_dir, symlinks=True, ignore=harness_files)
    relative = os.path.relpath(root / dockerfile, source)
    if relative == "Dockerfile":
        return
    target = env_dir / "Dockerfile"
    data = (root / dockerfile).read_bytes()
    if os.path.lexists(target) and target.read_bytes() != data:
        raise CannotConvert(f"its build context already holds a Dockerfile other than {dockerfile}")
    target.write_bytes(data)


def _write_files(folder: Path, files: list[SupportFile]) -> None:
    for file in files:
        path = folder / file.relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(file.data)
        path.chmod(file.mode)


def task_toml(task: TaskSpec) -> str:
    request = task.request
    metadata = {key: value for key, value in (task.metadata or {}).items() if value is not None}
    tables: list[tuple[str | None, dict]] = [(None, {"version": "1.0"}), ("metadata", metadata)]
    tables.append(("agent", _present(timeout_sec=request.agent_timeout_secs)))
    tables.append(("verifier", _present(timeout_sec=request.verifier_timeout_secs, grader=task.grader)))
    tables.append(("verifier.env", dict(task.verifier.env)))
    tables.append(("environment", _present(docker_image=task.environment.image, workdir=task.environment.workdir)))
    tables.append(("environment.env", dict(task.env)))
    return toml_document(tables)


def _present(**values) -> dict:
    return {key: value for key, value in values.items() if value is not None}


# -- a TOML writer for what task.toml holds (tomllib only reads) -------------------------------


def toml_document(tables: list[tuple[str | None, dict]]) -> str:
    """``[name]`` tables of ``key = value`` lines (None: the top); an empty table is left out."""
    parts = []
    for name, values in tables:
        if not values:
            continue
        lines = [f"[{'.'.join(_key(part) for part in name.split('.'))}]"] if name else []
        lines += [f"{_key(key)} = {toml_value(value)}" for key, value in values.items()]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def toml_value(value: object) -> str:
    """A string, number, boolean, list or mapping (an inline table) as TOML; a None inside a list or
    a mapping is dropped (TOML has no null)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else _string(str(value))
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value if item is not None) + "]"
    if isinstance(value, dict):
        items = [f"{_key(str(k))} = {toml_value(v)}" for k, v in value.items() if v is not None]
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # JSON's escapes are TOML's basic-string escapes; TOML also wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
