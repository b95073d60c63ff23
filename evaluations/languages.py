"""Agent languages: the file an agent's code is written to and the interpreter that runs it."""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    name: str
    extension: str
    interpreter: str
    # What makes the interpreter start without code its environment names (the task's env, HOME):
    # python ignores PYTHON* (PYTHONPATH, PYTHONSTARTUP...) and the user site (usercustomize, .pth
    # in HOME); bash in privileged mode reads no BASH_ENV/ENV and imports no functions. Node has no
    # such switch: its NODE_OPTIONS never comes from the task (pipeline/agentenv.py).
    start_options: tuple[str, ...] = ()

    def argv(self, agent_file: str, prompt: str, interpreter: str) -> list[str]:
        """``interpreter``: the absolute path the executor chose (pipeline/agentenv.py), never PATH's."""
        return [interpreter, *self.start_options, agent_file, "--instruction", prompt]


ALL = {
    lang.name: lang
    for lang in (
        Language("python", "py", "python3", ("-E", "-s")),
        Language("bash", "sh", "bash", ("-p",)),
        Language("node", "js", "node"),
    )
}


@functools.cache
def available() -> dict[str, Language]:
    """The languages whose interpreter this host has, in a fixed order."""
    return {name: lang for name, lang in ALL.items() if shutil.which(lang.interpreter)}
