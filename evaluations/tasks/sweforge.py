"""SWE-Forge's keys of ``workspace.yaml`` (SPEC §19): the task folders the upstream executor writes.

The upstream executor (PlatformNetwork/term-executor, ``src/task/mod.rs`` ``WorkspaceConfig``) reads
these beside SPEC §4's keys; here they mean:

1. ``fail_to_pass`` / ``pass_to_pass``: lists of shell commands. When the task has no ``tests/*.sh``
   and no ``checks.txt``, each becomes a test, ``fail_to_pass_1``... then ``pass_to_pass_1``...,
   of that kind, run as a checks.txt command is (its text in a script, ``bash`` runs it). Counted
   against MAX_TESTS. Upstream prefers the scripts too when a folder has both.
2. ``install_config``: a mapping of names to strings (upstream's ``BTreeMap<String, String>``).
   Its ``install`` (a command, or a list of them) is the install step when ``install`` is absent;
   its ``python`` (a version, ``3.11``) chooses the environment mapped to ``python3.11`` in
   LANGUAGE_ENVIRONMENTS (tasks/language.py). The whole mapping is kept in the evaluation's
   ``task_metadata``; its other keys (upstream's ``go``, ``node``, ``rust``, ``java`` versions,
   which it installs from the internet) are recorded, not acted on: the toolchain is the
   environment's.
3. ``difficulty`` (a word) and ``difficulty_score`` (0 to 255, upstream's ``u8``): ``task_metadata``.
4. ``patch``: the reference solution (a diff of the repository), for ``manage.py verify_tasks`` only.
   The task folder is root's (session.py): no command of the agent can read it, and it never reaches
   the prompt, the metadata or any other field of the evaluation.
5. ``prompt``: the agent's instruction when the folder has no ``prompt.md``; held to the same caps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from evaluations.tasks.readers import Cap, is_number, raw_scalar, type_name, value_node
from evaluations.tasks.spec import TaskError, TestSpec

KINDS = ("fail_to_pass", "pass_to_pass")
MAX_DIFFICULTY_SCORE = 255  # upstream's difficulty_score is a u8


@dataclass(frozen=True)
class ForgeKeys:
    """What a workspace.yaml says in SWE-Forge's keys; empty when it uses none of them."""

    commands: dict[str, list[str]] = field(default_factory=dict)  # kind -> its commands, in order
    install_config: dict[str, str | list[str]] = field(default_factory=dict)
    difficulty: str | None = None
    difficulty_score: int | None = None
    patch: str | None = None
    prompt: str | None = None

    @property
    def install(self) -> list[str] | None:
        """install_config's ``install`` as install commands; None when it has none."""
        value = self.install_config.get("install")
        if value is None:
            return None
        return [value] if isinstance(value, str) else list(value)

    def metadata(self) -> dict | None:
        """The evaluation's ``task_metadata``: what the task says about itself (never ``patch``)."""
        found = {
            "difficulty": self.difficulty,
            "difficulty_score": self.difficulty_score,
            "install_config": self.install_config or None,
        }
        kept = {key: value for key, value in found.items() if value is not None}
        return kept or None

    def tests(self, max_tests: int) -> list[TestSpec]:
        """``fail_to_pass_N`` then ``pass_to_pass_N``; the one past MAX_TESTS is refused, named."""
        tests = []
        for kind in KINDS:
            for number, command in enumerate(self.commands.get(kind, []), 1):
                if len(tests) == max_tests:
                    raise TaskError(
                        f"workspace.yaml: '{kind}' command {number} is test {max_tests + 1}, over the cap of "
                        f"{max_tests} tests (MAX_TESTS)"
                    )
                tests.append(TestSpec(f"{kind}_{number}", kind, None, command, f"workspace.yaml {kind} {number}"))
        return tests


def read(data: dict, node: yaml.Node, prompt_cap: Cap) -> ForgeKeys:
    """SWE-Forge's keys of workspace.yaml (``data``, its ``node`` for numbers as written), checked."""
    return ForgeKeys(
        commands={kind: _commands(data, kind) for kind in KINDS if data.get(kind) is not None},
        install_config=_install_config(data, node),
        difficulty=_difficulty(data),
        difficulty_score=_difficulty_score(data),
        patch=_patch(data),
        prompt=_prompt(data, prompt_cap),
    )


def _commands(data: dict, kind: str) -> list[str]:
    value = data[kind]
    if not isinstance(value, list):
        raise TaskError(f"workspace.yaml: '{kind}' must be a list of shell commands, not {type_name(value)}")
    for number, command in enumerate(value, 1):
        if not isinstance(command, str):
            raise TaskError(f"workspace.yaml: '{kind}' command {number} must be a string, not {type_name(command)}")
        if not command.strip():
            raise TaskError(f"workspace.yaml: '{kind}' command {number} is empty")
        if "\0" in command:
            raise TaskError(f"workspace.yaml: '{kind}' command {number} contains a NUL byte")
    return list(value)


def _install_config(data: dict, node: yaml.Node) -> dict[str, str | list[str]]:
    value = data.get("install_config")
    if value is None:
        return {}
    where = "workspace.yaml: 'install_config'"
    if not isinstance(value, dict):
        raise TaskError(f"{where} must be a mapping of names to strings (install, python...), not {type_name(value)}")
    written = value_node(node, "install_config")
    config: dict[str, str | list[str]] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not name:
            raise TaskError(f"{where}: its keys must be names (install, python...), got {name!r}")
        if name == "install" and isinstance(item, list):
            if not all(isinstance(command, str) and command.strip() for command in item):
                raise TaskError(f"{where}: 'install' must be a command or a list of commands (non-empty strings)")
        elif is_number(item):  # python: 3.10, as written (not 3.1)
            item = raw_scalar(written, name) or str(item)
        elif not isinstance(item, str):
            raise TaskError(f"{where}: {name!r} must be a string, not {type_name(item)}")
        elif name == "install" and not item.strip():
            raise TaskError(f"{where}: 'install' is empty")
        if "\0" in str(item):
            raise TaskError(f"{where}: {name!r} contains a NUL byte")
        config[name] = item
    python = config.get("python")
    if python is not None and not _python_version(python):
        raise TaskError(f"{where}: 'python' must be a Python version such as 3.11, got {python!r}")
    return config


def _python_version(text: str) -> bool:
    parts = text.split(".")
    return 2 <= len(parts) <= 3 and all(part.isdigit() for part in parts)


def python_version(task) -> str | None:
    """The Python version a workspace task's install_config names (kept in its metadata), or None."""
    if task.format != "workspace" or not task.metadata:
        return None
    python = (task.metadata.get("install_config") or {}).get("python")
    return python if isinstance(python, str) else None


def python_key(version: str) -> str:
    """LANGUAGE_ENVIRONMENTS' key for a Python version: ``3.11.4`` -> ``python3.11``."""
    return "python" + ".".join(version.split(".")[:2])


def _difficulty(data: dict) -> str | None:
    value = data.get("difficulty")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TaskError(
            f"workspace.yaml: 'difficulty' must be a word such as easy, medium or hard, not {type_name(value)}"
        )
    return value


def _difficulty_score(data: dict) -> int | None:
    value = data.get("difficulty_score")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DIFFICULTY_SCORE:
        shown = (
            repr(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else type_name(value)
        )
        raise TaskError(
            f"workspace.yaml: 'difficulty_score' must be a whole number from 0 to {MAX_DIFFICULTY_SCORE}, got {shown}"
        )
    return value


def _patch(data: dict) -> str | None:
    value = data.get("patch")
    if value is None:
        return None
    if not isinstance(value, str):
        raise TaskError(f"workspace.yaml: 'patch' must be a string (a diff of the repository), not {type_name(value)}")
    if not value.strip():
        raise TaskError("workspace.yaml: 'patch' is empty (leave the key out when the task has no reference solution)")
    if "\0" in value:
        raise TaskError("workspace.yaml: 'patch' contains a NUL byte")
    return value


def _prompt(data: dict, cap: Cap) -> str | None:
    value = data.get("prompt")
    if value is None:
        return None
    if not isinstance(value, str):
        raise TaskError(f"workspace.yaml: 'prompt' must be a string (the agent's instruction), not {type_name(value)}")
    if "\0" in value:
        raise TaskError("workspace.yaml: 'prompt' contains a NUL byte")
    if len(value.encode("utf-8")) > cap.limit:
        raise TaskError(f"workspace.yaml: 'prompt' is larger than {cap.limit} bytes ({cap.setting})")
    return value
