"""The grader of a task, by the name it carries (SPEC §17): one instance per grader, none holding state.

``pytest`` names two readings of pytest's summary: a workspace task's test scripts (pytest_grader.py),
and a verifier's output as Terminal-Bench's parser reads it (terminal_bench.py, SPEC §22): the task's
verifier decides which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Grader
from .exit_code import ExitCode
from .pytest_grader import Pytest
from .reward_file import RewardFile
from .swebench import Swebench
from .terminal_bench import TerminalBench

if TYPE_CHECKING:
    from evaluations.tasks.spec import TaskSpec

GRADERS: dict[str, Grader] = {grader.name: grader for grader in (ExitCode(), RewardFile(), Pytest(), Swebench())}
TERMINAL_BENCH = TerminalBench()


def for_task(task: TaskSpec) -> Grader:
    """The grader of ``task`` (its ``grader`` is one of GRADERS: the task readers refuse any other)."""
    if task.verifier is not None and task.grader == TERMINAL_BENCH.name:
        return TERMINAL_BENCH
    return GRADERS[task.grader]
