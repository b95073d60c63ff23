"""The toolchain a task's ``language`` asks for (SPEC §19), chosen at ``downloading_task``.

Not the agent's language (evaluations/languages.py): this is what the task's install and test
commands need, SWE-Forge's ``language: go | rust | javascript | typescript | java``.

1. A task that names its ``environment`` runs there: the task knows its toolchain.
2. Else LANGUAGE_ENVIRONMENTS chooses, by the most specific key first: ``pythonX.Y`` for a Python
   task whose ``install_config`` names Python X.Y, then the task's language. The choice becomes the
   task's environment (a name under ENVIRONMENTS_ROOT, or an image) and is recorded as any other.
3. Else the commands run where they would anyway (DEFAULT_ENVIRONMENT, or the host), and a language
   with a toolchain must find its program there (``TOOLCHAINS``): none is ``NoToolchain``, one
   sentence naming the language, the program and the setting, before anything is cloned.
"""

from __future__ import annotations

import dataclasses
import shutil

from evaluations import environments
from evaluations.tasks import sweforge
from evaluations.tasks.readers import environment_choice
from evaluations.tasks.spec import TaskError, TaskSpec

# The program each language's commands cannot do without (what SWE-Forge's tests run: go test,
# cargo test, npm/yarn/pnpm over node, javac with maven or gradle).
TOOLCHAINS = {"go": "go", "rust": "cargo", "javascript": "node", "typescript": "node", "java": "javac"}
SETTING = "LANGUAGE_ENVIRONMENTS"


class NoToolchain(Exception):
    """The task's language has no toolchain on this executor; the sentence names it and the setting."""


def with_toolchain(task: TaskSpec, config, command_path: str) -> TaskSpec:
    """``task`` with the environment its language (or Python version) is mapped to, if it names none.

    Raises NoToolchain when nothing is mapped and the commands would not find the language's
    program; TaskError cannot happen for a mapping settings_loader accepted.
    """
    if task.environment is not None:
        return task
    language = (task.language or "").strip().lower()
    mapping = config.language_environment
    for key in _keys(task, language):
        if key in mapping:
            try:
                chosen = environment_choice(mapping[key], f"{SETTING}: {key}")
            except TaskError as exc:  # settings_loader checked it; a Config made another way may not be
                raise NoToolchain(str(exc)) from None
            return dataclasses.replace(task, environment=chosen)
    program = TOOLCHAINS.get(language)
    if program is not None:
        _check_program(language, program, config, command_path)
    return task


def _keys(task: TaskSpec, language: str) -> list[str]:
    keys = []
    python = sweforge.python_version(task)
    if python is not None and language in ("", "python"):
        keys.append(sweforge.python_key(python))
    if language:
        keys.append(language)
    return keys


def _check_program(language: str, program: str, config, command_path: str) -> None:
    unmapped = f"{SETTING} maps no environment to {language}"
    if config.default_environment:
        try:
            environment = environments.resolve(config.environments_root, config.default_environment)
        except environments.BadEnvironment:
            return  # preparing_environment says what is wrong with it
        if environments.find_interpreter(environment, program) is None:
            raise NoToolchain(
                f"the task's language is {language} and this executor has no toolchain for it: {unmapped}, "
                f"and environment {environment.name} (DEFAULT_ENVIRONMENT) has no {program}"
            )
        return
    if shutil.which(program, path=command_path) is None:
        raise NoToolchain(
            f"the task's language is {language} and this executor has no toolchain for it: {unmapped}, "
            f"and the host has no {program} on the commands' PATH ({command_path})"
        )
