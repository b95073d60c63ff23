"""``running_tests`` for a task graded ``swebench`` (SPEC §19), after steps.running_tests wrote the
task's support files (the test patch's files) into the working directory.

1. ``swebench-tests.sh`` (grading.wrapper_script, in the session's tests/ folder, read-only to the
   sandbox) runs the test command once over the test files; the per-evaluation marker reaches it on
   stdin only.
2. The executor grades the output (grading.grade): ``ctx.grade`` (its error names the first failing
   or missing ids), one TestResult per id (failing ids first, at most MAX_TESTS rows), the counts of
   every id on the evaluation (``test_counts``), the whole output in ``test_output``.
"""

from __future__ import annotations

import time

from evaluations import lifecycle, livelog
from evaluations.models import TestResult
from evaluations.pipeline.context import Context, Grade
from evaluations.runtime import Mount
from evaluations.safefs import write_file_nofollow

from . import grading

SCRIPT = "swebench-tests.sh"
NAME = "swebench"  # the test's name in the live log and the output block


def run_tests(ctx: Context, env: dict[str, str], mounts: list[Mount]) -> None:
    spec = ctx.task.swebench
    config = ctx.config
    session = ctx.session
    session.tests.mkdir(mode=0o755, exist_ok=True)
    command = grading.eval_script_command(spec.eval_script) if spec.eval_script else spec.test_cmd
    script = grading.wrapper_script(command, spec.test_files, spec.deleted_files)
    write_file_nofollow(session.tests, SCRIPT, script.encode(), 0o644)
    mounts = [Mount(session.tests, str(session.tests), writable=False), *mounts]
    policy = ctx.task_policy(network=config.test_network, mounts=mounts)
    marker = grading.new_marker()
    livelog.append_text(session.log, livelog.test_marker(NAME))
    started = time.monotonic()
    result = ctx.run(
        ["bash", str(session.tests / SCRIPT)],
        env=env,
        timeout_secs=config.test_timeout_secs,
        policy=policy,
        stdin_data=(marker + "\n").encode(),
    )
    duration = int((time.monotonic() - started) * 1000)
    ctx.spawner.sweep()
    output = result.output
    verdict = grading.grade(
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
        output += f"\n[executor: killed, the test budget TEST_TIMEOUT_SECS={config.test_timeout_secs} s ran out]"
        error = f"the test command timed out (TEST_TIMEOUT_SECS={config.test_timeout_secs} s)"
    elif result.limit is not None:
        output += f"\n[executor: {result.limit_detail}]"
        error = f"the test command was stopped: {result.limit_detail}"
    rows = _graded(ctx, verdict, error, result, duration)
    block = f"=== {NAME} (exit {_exit(result.exit_code)}) ===\n{output}"
    lifecycle.store_test_results(ctx.eval_id, rows, test_output=block, test_counts=verdict.counts)


def grade_verifier(ctx: Context, result, output: str, duration: int) -> list[TestResult]:
    """A Terminal-Bench task of ``parser_name: swebench`` (SPEC §22): its run-tests.sh's whole output read
    per id with the row's parser, its exit status (its in-container grader's) not cross-checked; the
    rows, ``ctx.grade`` set. A timeout or a limit was graded by the caller."""
    spec = ctx.task.swebench
    verdict = grading.grade(
        result.output,
        result.exit_code,
        None,
        spec.parser,
        spec.fail_to_pass,
        spec.pass_to_pass,
        eval_type=spec.eval_type,
        check_exit=False,
    )
    rows = _graded(ctx, verdict, verdict.reason, result, duration)
    if rows:
        rows[0].output = output + "\n" + rows[0].output  # the verifier's whole output, once
    return rows


def _graded(ctx: Context, verdict, error: str, result, duration: int) -> list[TestResult]:
    """``ctx.grade`` and one row per id (failing ids first, at most MAX_TESTS), the summary in the live log."""
    config = ctx.config
    passed = verdict.passed and not error
    ctx.grade = Grade(reward=1.0 if passed else 0.0, rewards=None, error=error)
    rows = [
        TestResult(
            evaluation_id=ctx.eval_id,
            position=position,
            name=item.test_id[:255],
            kind=item.kind,
            passed=item.passed,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_ms=duration if position == 0 else 0,
            output=item.shown,
        )
        for position, item in enumerate(verdict.rows_order()[: config.max_tests])
    ]
    shown = len(rows)
    total = len(verdict.results)
    summary = f"--- {NAME}: {'passed' if passed else 'failed'} (exit {_exit(result.exit_code)}): " + ", ".join(
        f"{kind} {c['passed']}/{c['total']} passed, {c['missing']} not in the log" for kind, c in verdict.counts.items()
    )
    if shown < total:
        summary += f"; test_results holds {shown} of the {total} ids (MAX_TESTS), failing ones first"
    livelog.append_text(ctx.session.log, livelog.executor_line(summary + " ---"))
    return rows


def _exit(code: int | None) -> str:
    return "none" if code is None else str(code)
