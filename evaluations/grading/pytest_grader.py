"""Grader ``pytest`` of a workspace task (SPEC §17): each test script's command runs ``pytest -rA``;
a test passed iff it exited 0 and pytest's last short test summary agrees (parsers/pytest_summary.py:
at least one test ran, every one passed, the summary's lines number what pytest's counts line counts).

The same name on a task with a verifier (Terminal-Bench's, or one ``import_tasks`` converted) is read
as Terminal-Bench's parser reads it: terminal_bench.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Grade, Grader, Sandbox
from .parsers.pytest_summary import grade_pytest
from .scripts import run_scripts

if TYPE_CHECKING:
    from evaluations.runtime import CommandResult


class Pytest(Grader):
    name = "pytest"

    def run(self, sandbox: Sandbox) -> Grade:
        return run_scripts(sandbox, check=_summary)


def _summary(result: CommandResult) -> str:
    verdict = grade_pytest(result.output, result.exit_code)
    return "" if verdict.passed else f"pytest grader: {verdict.reason}"
