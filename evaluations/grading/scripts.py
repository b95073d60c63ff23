"""A workspace task's test scripts, run one by one (graders ``exit_code``, ``pytest``, ``reward_file``).

1. Each test runs as ``bash`` on a script in the session's tests/ folder (a ``checks.txt`` command too:
   as ``bash -c`` argv it would be readable in /proc by every process on the host without the sandbox,
   another evaluation's agent included), from the working directory, within what is left of one
   TEST_TIMEOUT_SECS budget for them all; a test the budget no longer covers is not run, timed out.
2. A test passed iff its command exited 0 within its limits, and ``check`` (the grader's reading of
   its output) has nothing against it; each test's output is under its name in the live log, followed
   by its verdict; what it left running dies before the next one starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from evaluations import livelog
from evaluations.models import TestResult

from .base import Grade, Sandbox, exit_text

if TYPE_CHECKING:
    from evaluations.runtime import CommandResult
    from evaluations.tasks.spec import TestSpec

# Why a command that exited 0 did not pass, read from its result ("": it did).
Check = Callable[["CommandResult"], str]


def run_scripts(sandbox: Sandbox, *, check: Check | None = None, logs: Path | None = None) -> Grade:
    """Every test of the task, in order; ``logs``: a folder the scripts see at /logs/verifier."""
    deadline = time.monotonic() + sandbox.timeout_secs
    results = []
    for position, test in enumerate(sandbox.tests):
        sandbox.log(livelog.test_marker(test.name))  # each test's output under its name
        row = _run_test(sandbox, position, test, deadline, check, logs)
        sandbox.log(livelog.test_verdict(row.name, row.passed, row.exit_code, row.timed_out))
        results.append(row)
        sandbox.sweep()
    blocks = [f"=== {r.name} (exit {exit_text(r.exit_code)}) ===\n{r.output}" for r in results]
    return Grade(results, "\n".join(blocks))


def _run_test(
    sandbox: Sandbox, position: int, test: TestSpec, deadline: float, check: Check | None, logs: Path | None
) -> TestResult:
    budget = sandbox.timeout_secs
    left = deadline - time.monotonic()
    row = TestResult(evaluation_id=sandbox.eval_id, position=position, name=test.name, kind=test.kind, passed=False)
    if left <= 0:
        row.timed_out = True
        row.output = f"not run: the TEST_TIMEOUT_SECS budget ({budget} s) was spent"
        return row
    text = test.script if test.script is not None else test.command + "\n"
    started = time.monotonic()
    result = sandbox.run_script(f"{position:04d}-{test.name}.sh", text, timeout_secs=left, logs=logs)
    row.duration_ms = int((time.monotonic() - started) * 1000)
    row.exit_code = result.exit_code
    row.timed_out = result.timed_out
    row.output = result.output
    if result.limit_detail and not row.timed_out:
        row.output += f"\n[executor: {result.limit_detail}]"
    elif row.timed_out:
        row.output += f"\n[executor: killed, the test budget TEST_TIMEOUT_SECS={budget} s ran out]"
    row.passed = result.ok
    if check is not None and row.passed:  # the exit status agrees; the grader's reading must too
        why = check(result)
        if why:
            row.passed = False
            row.output += f"\n[executor: {why}]"
    return row
