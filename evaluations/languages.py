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

    def argv(self, agent_file: str, prompt: str, interpreter: str | None = None) -> list[str]:
        """``interpreter``: another than the language's (an agent project's own venv python)."""
        return [interpreter or self.interpreter, agent_file, "--instruction", prompt]


ALL = {
    lang.name: lang
    for lang in (
        Language("python", "py", "python3"),
        Language("bash", "sh", "bash"),
        Language("node", "js", "node"),
    )
}


@functools.cache
def available() -> dict[str, Language]:
    """The languages whose interpreter this host has, in a fixed order."""
    return {name: lang for name, lang in ALL.items() if shutil.which(lang.interpreter)}
