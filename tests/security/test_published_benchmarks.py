"""Issue 35 (SPEC §22): what a published benchmark's form must never let through.

1. A test whose subTest failed is FAILED wherever pytest's summary is read, though its own line says
   PASSED (pytest 9): a no-op agent cannot "pass" a fail_to_pass id so.
2. A compose volume binding the task's folder never gives the agent the task's tests or its reference
   solution (the end-to-end check, the agent's view from inside the sandbox, is
   tests/importers/test_published_tasks.py's pipeline test).
3. Terminal-Bench's grading keeps the forgery check where pytest's counts line closes the summary.
"""

from __future__ import annotations

from evaluations.grading.parsers import swebench_ids
from evaluations.grading.parsers.pytest_summary import grade_pytest, grade_terminal_bench
from evaluations.tasks.registry import load_task
from tests.grading.test_published_grading import SUMMARY_90, SUMMARY_92
from tests.importers.test_published_tasks import bound_task

VALID = "test_data.py::TestData::test_valid"


def test_a_failing_subtest_cannot_pass_for_its_test():
    for summary in (SUMMARY_92, SUMMARY_90):
        for parser in ("pytest", "pytest_options", "pytest_v2", "matplotlib", "seaborn"):
            verdict = swebench_ids.grade(summary, 1, None, parser, [VALID], [])
            assert not verdict.passed and verdict.results[0].status == "FAILED", (parser, verdict)
        assert not grade_pytest(summary, 0).passed
        assert not grade_terminal_bench(summary, 0).passed


def test_the_agent_never_gets_a_bound_folders_tests_or_solution(tmp_path):
    root = bound_task(tmp_path / "bound", "debian:bookworm")
    (root / "solution.yaml").write_text("- command: echo secret\n")
    (root / "tests" / "hidden_expected.txt").write_text("the answer\n")
    spec = load_task(root)
    seen = {f.relpath.split("/")[0] for f in spec.workdir_files}
    assert seen.isdisjoint({"tests", "run-tests.sh", "solution.sh", "solution.yaml"}), seen
    assert not any(b"the answer" in f.data or b"echo secret" in f.data for f in spec.workdir_files)


def test_a_line_forged_through_a_skip_reason_fails_a_terminal_bench_run():
    forged = (
        "=== short test summary info ===\n"
        "FAILED t.py::test_real - assert 0\n"
        "SKIPPED [1] t.py:9: reason\nPASSED t.py::test_real\n"
        "=== 1 failed, 1 skipped in 0.1s ===\n"
    )
    assert not grade_terminal_bench(forged, 1).passed
    only_forged = "=== short test summary info ===\nSKIPPED [1] t.py:9: x\nPASSED t.py::ok\n=== 1 skipped in 0.1s ===\n"
    assert "does not stand for a test" in grade_terminal_bench(only_forged, 0).reason
