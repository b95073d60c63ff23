"""Grader ``pytest`` of a task with a verifier (Terminal-Bench's, SPEC §22): the verifier's output read as
Terminal-Bench's ``PytestParser`` reads it (parsers/pytest_summary.grade_terminal_bench): one row per
test of its summary (at most MAX_TESTS, the verifier's whole output on the first), reward 1.0 when
passed, else 0.0 and the reason. A summary that lists no test leaves the verifier's one row, failed.
"""

from __future__ import annotations

from evaluations.models import TestResult

from .base import Grade, Grader, Sandbox, VerifierRun, pass_reward, run_verifier
from .parsers.pytest_summary import grade_terminal_bench


class TerminalBench(Grader):
    name = "pytest"  # the name the task carries; registry.for_task picks this grader over a verifier

    def run(self, sandbox: Sandbox) -> Grade:
        return run_verifier(sandbox, _summary)


def _summary(sandbox: Sandbox, run: VerifierRun, row: TestResult) -> Grade:
    result = run.result
    verdict = grade_terminal_bench(result.output, result.exit_code)
    rows = [
        TestResult(
            evaluation_id=sandbox.eval_id,
            position=position,
            name=test[:255],
            kind="test",
            passed=passed,
            exit_code=result.exit_code,
            duration_ms=0,
            output="",
        )
        for position, (test, passed) in enumerate(verdict.results[: sandbox.max_tests])
    ]
    if rows:
        rows[0].output = run.output  # the verifier's whole output, once
    return Grade(rows or [row], run.block, error=verdict.reason, reward=pass_reward(verdict.passed))
