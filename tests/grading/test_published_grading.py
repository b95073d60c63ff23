"""Issue 35 (SPEC §22) in the graders: which rows are SWE-Forge's, pytest 9's SUBFAILED lines in every reader of
pytest's summary, Terminal-Bench's own pytest parser semantics, and parser_name swebench's tests/config.json."""

from __future__ import annotations

import json
import textwrap

import pytest

from evaluations.grading.parsers import swebench_ids, swebench_logs
from evaluations.grading.parsers.pytest_summary import grade_pytest, grade_terminal_bench
from evaluations.grading.tbparsers import swebench_from_config
from evaluations.importers.testids import COMMANDS, IDS, is_command, kind_of
from evaluations.tasks.spec import SupportFile, TaskError
from tests.grading.test_graders import run_pytest

# -- test ids or shell commands ------------------------------------------------------------------

IDS_SEEN = [
    "tests/test_blueprints.py::test_empty_name_not_allowed",  # pallets__flask-5014 (Verified)
    "testing/test_skipping.py::TestXFail::test_xfail_run_anyway",
    "tests/test_add.py::test_add[2 + 3]",  # parametrize ids: blanks, brackets, quotes, shell characters
    "tests/test_add.py::test_add[it's [x]]",
    'tests/test_add.py::test_add[say "hi"]',
    "t.py::test_p[a && b | c; $(x) `y`]",
    "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]",
    "tests/test_x.py::test_y[a",  # SWE-bench's ids cut at the first blank keep an open bracket
    "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)",  # Django
    "test_x (module.Class.test_x)",  # Django 5
    "test_issue_21651",  # SymPy
    "tests/test_sub.py",
    # Django docstring lines SWE-bench Verified holds as ids (django__django-10097, -11149, -13658...)
    "test the raw() method across databases",
    "By default the command generates models with `Meta.managed = False` (#14305)",
    "#5749 - `field_name` may be used as a key in _html_output().",
    "alternate: manage.py output syntax color can be deactivated with the `--no-color` option",
    "Regression for #20509",
    "src/parser.test.ts > parses a > b",  # a JavaScript id: prose, not a redirection
]
COMMANDS_SEEN = [
    "python -m pytest -rA tests/test_add.py",  # SWE-Forge's
    "pytest tests/test_x.py::test_a",
    "python3 -c 'from calc import add; assert add(2, 3) == 5'",
    "go test ./pkg/... -run TestParse",
    "cargo test --lib parser::tests",
    "npx jest src/a.test.ts",
    "npm test -- --grep 'x y'",
    "cd sub && make check",
    "CI=1 FOO=bar yarn test",
    "./run_tests.sh unit",
    "/usr/bin/python3 -m unittest tests.test_x",
    ".venv/bin/pytest -q",
    "bash -c 'pytest -x'",
    "mvn -q test -Dtest=FooTest",
    "pytest",
    "make",
]


@pytest.mark.parametrize("entry", IDS_SEEN)
def test_a_test_id_is_no_command(entry):
    assert not is_command(entry)


@pytest.mark.parametrize("entry", COMMANDS_SEEN)
def test_a_shell_command_is_one(entry):
    assert is_command(entry)


def test_a_row_is_swe_forges_only_when_every_fail_to_pass_entry_is_a_command():
    assert kind_of(COMMANDS_SEEN) == COMMANDS
    assert kind_of(IDS_SEEN) == IDS
    # One id beside a docstring line that starts like a command: ids.
    assert kind_of(["make sure the cache is cleared", "test_x (cache.tests.Tests)"]) == IDS


# -- pytest 9 subtests -----------------------------------------------------------------------------

SUBTESTS = """
    import unittest

    class TestData(unittest.TestCase):
        def test_valid(self):
            for value in ("a", "\\\\x41", "b"):
                with self.subTest("hex-escape", value=value):
                    self.assertNotIn("\\\\x", value)

        def test_fine(self):
            with self.subTest(i=1):
                self.assertTrue(True)
"""
# pytest 9.2's -rA summary of SUBTESTS, captured, and the same with the other forms of the line: pytest 9.0's
# description in brackets (as the issue's hukkin/tomli log has it) and pytest-subtests' SUBFAIL.
SUMMARY_92 = """\
=========================== short test summary info ============================
PASSED test_data.py::TestData::test_fine
PASSED test_data.py::TestData::test_valid
SUBFAILED test_data.py::TestData::test_valid - AssertionError: '\\\\x' unexpect...
========================= 1 failed, 2 passed in 0.05s ==========================
"""
SUMMARY_90 = SUMMARY_92.replace("SUBFAILED test_data", "SUBFAILED[hex-escape] (value='\\\\x41') test_data")
SUMMARY_SUBFAIL = SUMMARY_92.replace("SUBFAILED", "SUBFAIL").replace("1 failed", "1 subtests failed")


def test_a_real_pytest_run_with_a_failing_subtest_fails_its_test(tmp_path):
    output, code = run_pytest(tmp_path, {"test_data.py": SUBTESTS}, "-rA")
    assert "PASSED test_data.py::TestData::test_valid" in output  # the trap: its own line says PASSED
    assert "SUBFAILED" in output and code == 1
    verdict = grade_pytest(output, code)
    assert verdict.results == [
        ("test_data.py::TestData::test_fine", True),
        ("test_data.py::TestData::test_valid", False),
    ]
    assert verdict.reason == "1 of 2 tests failed (test_data.py::TestData::test_valid)"
    assert grade_terminal_bench(output, code).reason == verdict.reason
    statuses = swebench_logs.parse_pytest(output)
    assert statuses["test_data.py::TestData::test_valid"] == swebench_logs.FAILED


@pytest.mark.parametrize("summary", [SUMMARY_92, SUMMARY_90, SUMMARY_SUBFAIL])
def test_every_reader_of_pytests_summary_fails_a_test_a_subtest_of_failed(summary):
    valid = "test_data.py::TestData::test_valid"
    for grade in (grade_pytest, grade_terminal_bench):
        verdict = grade(summary, 1)
        assert (valid, False) in verdict.results and not verdict.passed, (grade, verdict)
        assert verdict.reason == f"1 of 2 tests failed ({valid})"  # the counts agree: no forgery reported
    for name in ("pytest", "pytest_options", "pytest_v2", "matplotlib", "seaborn"):
        statuses = swebench_logs.PARSERS[name](summary)
        assert statuses[valid] == swebench_logs.FAILED, name
        assert statuses["test_data.py::TestData::test_fine"] == swebench_logs.PASSED, name
    verdict = swebench_ids.grade(summary, 1, None, "pytest", [valid], ["test_data.py::TestData::test_fine"])
    assert not verdict.passed and verdict.results[0].status == swebench_logs.FAILED


def test_a_subtest_id_keeps_its_brackets_blanks_and_dashes():
    line = "SUBFAILED[in [bracket] x] (p=c [d) ]) t.py::test_param[c d - e] - AssertionError: x - y"
    assert swebench_logs.subfailed_id(line) == "t.py::test_param[c d - e]"
    assert swebench_logs.subfailed_id("SUBFAIL t.py::test_a") == "t.py::test_a"
    assert swebench_logs.subfailed_id("SUBPASSED t.py::test_a") is None
    assert swebench_logs.subfailed_id("SUBFAILED(<subtest>) t.py::test_a") is None  # not pytest's form
    assert swebench_logs.subfailed_id("SUBFAILED (<subtest>) t.py::C::test_a - x") == "t.py::C::test_a"


# -- Terminal-Bench's pytest parser ---------------------------------------------------------------

AIDER = """\
=== STARTING TEST EXECUTION ===
Running tests for all-your-base (cpp)
All tests passed (61 assertions in 19 test cases)
=== TEST EXECUTION COMPLETED ===
Exit code: 0
=============== short test summary info ===============
PASSED aider_polyglot_test
✓ All tests passed successfully
=== SCRIPT FINISHED ===
"""


def test_a_script_that_prints_its_own_summary_is_graded_by_its_lines():
    """aider polyglot's run-tests.sh: no pytest counts line; its lines are the results (issue 35)."""
    assert grade_terminal_bench(AIDER, 0).passed
    assert grade_terminal_bench(AIDER, 0).results == [("aider_polyglot_test", True)]
    failed = AIDER.replace("PASSED aider", "FAILED aider")
    assert grade_terminal_bench(failed, 1).reason == "1 of 1 test failed (aider_polyglot_test)"
    assert not grade_pytest(AIDER, 0).passed  # the workspace grader still wants pytest's own counts line


def test_the_lines_after_the_first_header_are_the_results_to_the_end():
    two_runs = textwrap.dedent("""\
        ============ short test summary info ============
        PASSED a.py::test_a
        ============ 1 passed in 0.01s ============
        ============ short test summary info ============
        FAILED b.py::test_b - boom
        ============ 1 failed in 0.01s ============
        """)
    verdict = grade_terminal_bench(two_runs, 1)
    assert verdict.results == [("a.py::test_a", True), ("b.py::test_b", False)] and not verdict.passed


def test_skipped_counts_as_passed_as_terminal_bench_counts_it():
    summary = "=== short test summary info ===\nPASSED t.py::a\nSKIPPED [1] t.py:3: no net\n=== 1 passed, 1 skipped in 0.1s ===\n"
    assert grade_terminal_bench(summary, 0).passed
    assert grade_pytest(summary, 0).passed and grade_pytest(summary, 0).skipped == 1


def test_the_forgery_check_holds_where_pytests_counts_line_closes_the_summary():
    forged = "=== short test summary info ===\nSKIPPED [1] t.py:3: x\nPASSED forged\n=== 1 skipped in 0.1s ===\n"
    assert grade_terminal_bench(forged, 0).reason == (
        "the short test summary lists 1 PASSED but pytest's final line counts 0: a line in it does not stand for a test"
    )
    ok = "=== short test summary info ===\nPASSED t.py::a\n=== 1 passed in 0.1s ===\n"
    assert grade_terminal_bench(ok, 2).reason == "pytest exited 2 though the summary shows every test passed"
    assert grade_terminal_bench("no summary here\n", 0).reason.startswith("no test ran")
    assert not grade_terminal_bench("=== short test summary info ===\nsome text\n", 0).passed  # no result


# -- parser_name: swebench -----------------------------------------------------------------------------


def config(**row) -> list[SupportFile]:
    return [SupportFile("config.json", json.dumps(row).encode(), 0o644)]


def test_tests_config_json_gives_the_swebench_grading():
    ids = ["tests/test_a.py::test_x[a b]"]
    spec = swebench_from_config(config(repo="django/django", FAIL_TO_PASS=json.dumps(ids), PASS_TO_PASS="[]"))
    assert (spec.parser, spec.fail_to_pass, spec.pass_to_pass) == ("django", ids, [])
    spec = swebench_from_config(config(repo="x/y", log_parser="parse_log_sphinx", FAIL_TO_PASS=ids, PASS_TO_PASS=[]))
    assert spec.parser == "pytest_v2"
    with pytest.raises(TaskError, match=r"'log_parser' 'parse_log_jest' is not a parser this executor has"):
        swebench_from_config(config(repo="x/y", log_parser="parse_log_jest", FAIL_TO_PASS=ids))
    with pytest.raises(TaskError, match=r"'FAIL_TO_PASS' is empty"):
        swebench_from_config(config(repo="x/y", FAIL_TO_PASS="[]"))


def test_a_terminal_bench_swebench_log_is_read_per_id_whatever_its_exit_status():
    """run-tests.sh's whole output, `set -x` lines and the in-container verdict included; its exit status is
    the in-container grader's, so it is not cross-checked."""
    log = (
        "+ git apply /tmp/test_patch.diff\nPASSED t.py::test_a\nFAILED t.py::test_b - x\nSWEBench results starts here\n"
    )
    verdict = swebench_ids.grade(log, 127, None, "pytest", ["t.py::test_a"], [], check_exit=False)
    assert verdict.passed
    verdict = swebench_ids.grade(log, 0, None, "pytest", ["t.py::test_a", "t.py::test_b"], [], check_exit=False)
    assert not verdict.passed and "t.py::test_b (FAILED)" in verdict.reason


# -- SWE-bench 5.0's eval_script and eval_type -----------------------------------------------------------

EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
cd "$WORK"
: '>>>>> Start Test Output'
printf 'PASSED t.py::test_a\\nPASSED t.py::test_b\\n'
exit_with() { return "$1"; }
exit_with 3
: '>>>>> End Test Output'
git checkout abc123 t.py
"""


def test_an_eval_script_runs_to_its_end_line_with_the_test_commands_status(tmp_path):
    import subprocess

    command = swebench_ids.eval_script_command(swebench_ids.check_eval_script(EVAL_SCRIPT))
    assert "git checkout" not in command  # after the END line: only resets the test files
    script = tmp_path / "w.sh"
    script.write_text(swebench_ids.wrapper_script(command, []))
    done = subprocess.run(["bash", str(script)], input="MARK\n", capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "WORK": str(tmp_path)})  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    verdict = swebench_ids.grade(done.stdout + done.stderr, done.returncode, "MARK", "pytest", ["t.py::test_a"], [],
                            marked=True)  # fmt: skip
    assert verdict.reason.startswith("the test command exited 3 though its log shows no failing test")
    with pytest.raises(ValueError, match="has no '>>>>> Start Test Output' and '>>>>> End Test Output' lines"):
        swebench_ids.check_eval_script("pytest -rA\n")


def test_fail_only_passes_an_id_unless_the_log_says_it_failed():
    log = "PASSED t.py::a\nFAILED t.py::b\n"
    verdict = swebench_ids.grade(log, 1, None, "pytest", ["t.py::a", "t.py::c"], [], eval_type=swebench_ids.FAIL_ONLY)
    assert verdict.passed  # t.py::c is not in the log: SWE-bench's check_fail_only counts it a success
    verdict = swebench_ids.grade(log, 1, None, "pytest", ["t.py::b"], [], eval_type=swebench_ids.FAIL_ONLY)
    assert not verdict.passed
    assert not swebench_ids.grade("", 0, None, "pytest", ["t.py::a"], [], eval_type=swebench_ids.FAIL_ONLY).passed
