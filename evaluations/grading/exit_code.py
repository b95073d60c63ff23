"""Grader ``exit_code`` (SPEC §17, the default): a test passed iff its command exited 0 within its limits.

A workspace task's test scripts each a row (scripts.py); a Harbor task's verifier one row, its reward
1.0 when it passed, else 0.0.
"""

from __future__ import annotations

from evaluations.models import TestResult

from .base import Grade, Grader, Sandbox, VerifierRun, pass_reward, run_verifier
from .scripts import run_scripts


class ExitCode(Grader):
    name = "exit_code"

    def run(self, sandbox: Sandbox) -> Grade:
        if sandbox.task.verifier is not None:
            return run_verifier(sandbox, _exit_status)
        return run_scripts(sandbox)


def _exit_status(sandbox: Sandbox, run: VerifierRun, row: TestResult) -> Grade:
    row.passed = run.result.ok
    error = "" if row.passed else f"{run.name} exited {run.result.exit_code}"
    return Grade([row], run.block, error=error, reward=pass_reward(row.passed))
