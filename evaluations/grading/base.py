"""The one interface of every grader, and what it is given (SPEC §17 "Graders").

1. ``Grader.run(sandbox)``: what runs after the agent (the task's verifier, its test scripts one by
   one, SWE-bench's wrapper) and how its result is read, as a ``Grade``: the rows of ``test_results``,
   the ``test_output`` block, the reward, and why it is not a pass.
2. ``Grader.verdict(grade, results)``: how the evaluation ends, from that grade and the rows as stored.

Invariants:

- A grade is the executor's, made from the output the runtime captured or from files read without
  following a link, after every process of the commands is dead (``Sandbox.sweep``): never the word of a
  program in the sandbox, whose word would be the agent's.
- A grader reaches the sandbox only through ``Sandbox``: how a command runs there (its policy, mounts,
  root, environment) is the pipeline's (pipeline/grading_sandbox.py); nothing here imports the pipeline.
  A fault of the host's while grading (a session folder that cannot be read) is ``HostFault``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from evaluations import livelog
from evaluations.models import ErrorKind, Status, TestResult

if TYPE_CHECKING:
    from evaluations.runtime import CommandResult
    from evaluations.tasks.spec import TaskSpec, TestSpec


class HostFault(Exception):
    """Grading could not read what the executor itself made (the host's fault): the step fails, infrastructure."""


@dataclass(frozen=True)
class Grade:
    """What the tests' run became: its rows and output block, and the grade (SPEC §17 "Rewards")."""

    results: list[TestResult]  # the rows of test_results, unsaved, at most MAX_TESTS
    output: str  # test_output: each command's output under its name
    error: str = ""  # why it is not a pass; "": the rows decide
    reward: float | None = None  # reward_file: the reward read (None: none could be); others: 1.0 or 0.0, or unset
    rewards: dict | None = None  # reward_file: every named number of the reward file
    source: str = ""  # reward_file: the file read, reward.json or reward.txt
    counts: dict | None = None  # swebench: test_counts, every id counted (the rows stop at MAX_TESTS)

    def stored(self) -> dict:
        """The evaluation's columns written with the rows (lifecycle.store_test_results)."""
        return {"test_output": self.output, **({"test_counts": self.counts} if self.counts is not None else {})}


class Verdict(NamedTuple):
    """How the evaluation ends (run.Ending's fields): status, error, SPEC §14 error_kind, columns written."""

    status: str
    error: str
    kind: str | None
    fields: dict | None = None  # the reward and rewards (SPEC §17)


@dataclass(frozen=True)
class VerifierRun:
    """The task's verifier, run once (Harbor, Terminal-Bench): what the graders read of it."""

    name: str  # its script, as its row and the live log name it
    result: CommandResult
    output: str  # what it printed, with the executor's note when it was killed
    duration_ms: int
    logs: Path  # its /logs/verifier, as it left it (the session's folder)

    @property
    def block(self) -> str:
        """Its output under its name, as test_output holds it."""
        return f"=== {self.name} (exit {exit_text(self.result.exit_code)}) ===\n{self.output}"


class Sandbox(Protocol):
    """What a grader is given (pipeline/grading_sandbox.py): the evaluation's task and test budget, and a
    way to run the tests' commands as the task's commands run (its root, environment and network for the
    tests, the session's files), from the working directory the agent left."""

    eval_id: str
    task: TaskSpec
    tests: list[TestSpec]  # the task's test scripts, their placeholders filled
    max_tests: int  # MAX_TESTS: the rows kept
    timeout_secs: int  # TEST_TIMEOUT_SECS, as the task's request capped it

    def log(self, text: str) -> None:
        """Append ``text`` to the evaluation's live log."""

    def sweep(self) -> None:
        """Kill every process the commands left: after it, nothing of theirs writes what is read."""

    def reward_folder(self) -> Path:
        """A fresh, empty folder that ``run_script(logs=...)`` mounts writable at /logs/verifier."""

    def run_script(
        self, name: str, text: str, *, timeout_secs: float, logs: Path | None = None, stdin_data: bytes | None = None
    ) -> CommandResult:
        """``bash`` on ``text``, written as the session's ``tests/<name>`` (read-only to the command)."""

    def run_verifier(self) -> VerifierRun:
        """The task's verifier in a sandbox of its own (SPEC §17), once; its processes swept after."""


class Grader(ABC):
    """One grader name (SPEC §17): what runs after the agent, and how its result becomes a grade."""

    name: str  # as a task names it (workspace.yaml ``grader:``, task.toml ``[verifier] grader``)

    def needs_tests(self, task: TaskSpec) -> bool:
        """Whether what runs is the task's own test scripts: a task without any is refused before anything runs."""
        return task.verifier is None

    @abstractmethod
    def run(self, sandbox: Sandbox) -> Grade:
        """Run the tests after the agent and read their result."""

    def verdict(self, grade: Grade, results: list[tuple[str, bool]]) -> Verdict:
        """completed only if the grade names no error, there is at least one test and every one passed (a
        timed-out one failed); ``results``: (name, passed) of the rows as stored."""
        if grade.error:
            return Verdict(Status.FAILED, f"running_tests: {grade.error}", ErrorKind.TESTS_FAILED, {"reward": 0.0})
        failed = [name for name, passed in results if not passed]
        if not results:
            return Verdict(Status.FAILED, "running_tests: task defines no tests", ErrorKind.TASK_INVALID)
        if failed:
            shown = ", ".join(failed[:5]) + (", ..." if len(failed) > 5 else "")
            error = f"running_tests: {len(failed)} of {len(results)} tests failed ({shown})"
            return Verdict(Status.FAILED, error, ErrorKind.TESTS_FAILED)
        return Verdict(Status.COMPLETED, "", None)


def run_verifier(sandbox: Sandbox, read: Callable[[Sandbox, VerifierRun, TestResult], Grade]) -> Grade:
    """The task's verifier, run once and read by ``read`` (given its one row, failed until read says
    otherwise); a verifier killed for its timeout or a limit is failed, reward 0, whatever it left.
    Each row's verdict goes to the live log."""
    run = sandbox.run_verifier()
    result = run.result
    row = TestResult(
        evaluation_id=sandbox.eval_id,
        position=0,
        name=run.name,
        kind="test",
        passed=False,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        duration_ms=run.duration_ms,
        output=run.output,
    )
    if result.timed_out or result.limit is not None:
        why = "timed out" if result.timed_out else result.limit_detail
        grade = Grade([row], run.block, error=f"the verifier {run.name} {why}", reward=0.0)
    else:
        grade = read(sandbox, run, row)
    for graded in grade.results:
        sandbox.log(livelog.test_verdict(graded.name, graded.passed, graded.exit_code, graded.timed_out))
    return grade


def pass_reward(passed: bool) -> float:
    """The reward of a grader other than reward_file (SPEC §17): 1.0 when passed, else 0.0."""
    return 1.0 if passed else 0.0


def exit_text(code: int | None) -> str:
    return "none" if code is None else str(code)
