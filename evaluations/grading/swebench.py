"""Grader ``swebench`` (SPEC §19, §22): the test command's log read per id, as SWE-bench reads it.

1. A workspace task (``workspace.yaml``'s ``swebench:``, after the step wrote the test patch's files
   into the working directory): ``swebench-tests.sh`` (parsers/swebench_ids.wrapper_script, in the
   session's tests/ folder, read-only to the sandbox) runs the test command once over the test files;
   the per-evaluation marker reaches it on stdin only, and only the log between its two marker lines
   is read.
2. A Terminal-Bench task of ``parser_name: swebench``: its verifier's whole output is read per id with
   the row's parser; its exit status (its in-container grader's) is not cross-checked.
3. Either way the executor grades the output (parsers/swebench_ids.grade): the grade's error names the
   first failing or missing ids; one row per id (failing ids first, at most MAX_TESTS rows), the counts
   of every id (``test_counts``), the whole output in ``test_output``.
"""

from __future__ import annotations

import time

from evaluations import livelog
from evaluations.models import TestResult

from .base import Grade, Grader, Sandbox, VerifierRun, exit_text, pass_reward, run_verifier
from .parsers import swebench_ids

SCRIPT = "swebench-tests.sh"
NAME = "swebench"  # the test's name in the live log and the output block


class Swebench(Grader):
    name = "swebench"

    def needs_tests(self, task) -> bool:
        return False  # the test command is the task's swebench mapping, not scripts

    def run(self, sandbox: Sandbox) -> Grade:
        if sandbox.task.verifier is not None:
            return run_verifier(sandbox, _verifier_log)
        return _run_wrapper(sandbox)


def _run_wrapper(sandbox: Sandbox) -> Grade:
    spec = sandbox.task.swebench
    budget = sandbox.timeout_secs
    command = swebench_ids.eval_script_command(spec.eval_script) if spec.eval_script else spec.test_cmd
    script = swebench_ids.wrapper_script(command, spec.test_files, spec.deleted_files)
    marker = swebench_ids.new_marker()
    sandbox.log(livelog.test_marker(NAME))
    started = time.monotonic()
    result = sandbox.run_script(SCRIPT, script, timeout_secs=budget, stdin_data=(marker + "\n").encode())
    duration = int((time.monotonic() - started) * 1000)
    sandbox.sweep()
    output = result.output
    verdict = swebench_ids.grade(
        output,
        result.exit_code,
        marker,
        spec.parser,
        spec.fail_to_pass,
        spec.pass_to_pass,
        eval_type=spec.eval_type,
        marked=spec.eval_script is not None,
    )
    error = verdict.reason
    if result.timed_out:
        output += f"\n[executor: killed, the test budget TEST_TIMEOUT_SECS={budget} s ran out]"
        error = f"the test command timed out (TEST_TIMEOUT_SECS={budget} s)"
    elif result.limit is not None:
        output += f"\n[executor: {result.limit_detail}]"
        error = f"the test command was stopped: {result.limit_detail}"
    rows = _rows(sandbox, verdict, error, result, duration)
    block = f"=== {NAME} (exit {exit_text(result.exit_code)}) ===\n{output}"
    return Grade(rows, block, error=error, reward=pass_reward(verdict.passed and not error), counts=verdict.counts)


def _verifier_log(sandbox: Sandbox, run: VerifierRun, row: TestResult) -> Grade:
    """A Terminal-Bench task of ``parser_name: swebench`` (SPEC §22): its run-tests.sh's whole output read
    per id with the row's parser, its exit status not cross-checked. A timeout or a limit was graded by
    run_verifier."""
    spec = sandbox.task.swebench
    result = run.result
    verdict = swebench_ids.grade(
        result.output,
        result.exit_code,
        None,
        spec.parser,
        spec.fail_to_pass,
        spec.pass_to_pass,
        eval_type=spec.eval_type,
        check_exit=False,
    )
    rows = _rows(sandbox, verdict, verdict.reason, result, run.duration_ms)
    if rows:
        rows[0].output = run.output + "\n" + rows[0].output  # the verifier's whole output, once
    return Grade(rows or [row], run.block, error=verdict.reason, reward=pass_reward(verdict.passed))


def _rows(sandbox: Sandbox, verdict, error: str, result, duration: int) -> list[TestResult]:
    """One row per id (failing ids first, at most MAX_TESTS), the summary in the live log."""
    passed = verdict.passed and not error
    rows = [
        TestResult(
            evaluation_id=sandbox.eval_id,
            position=position,
            name=item.test_id[:255],
            kind=item.kind,
            passed=item.passed,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_ms=duration if position == 0 else 0,
            output=item.shown,
        )
        for position, item in enumerate(verdict.rows_order()[: sandbox.max_tests])
    ]
    shown = len(rows)
    total = len(verdict.results)
    summary = f"--- {NAME}: {'passed' if passed else 'failed'} (exit {exit_text(result.exit_code)}): " + ", ".join(
        f"{kind} {c['passed']}/{c['total']} passed, {c['missing']} not in the log" for kind, c in verdict.counts.items()
    )
    if shown < total:
        summary += f"; test_results holds {shown} of the {total} ids (MAX_TESTS), failing ones first"
    sandbox.log(livelog.executor_line(summary + " ---"))
    return rows
