"""SWE-bench's grading (evaluations/grading/parsers/swebench_logs.py, swebench_ids.py): the parsers on logs
written as the real runners print them (pytest -rA, Django's runtests.py --verbosity 2, SymPy's bin/test -C
--verbose), ids matched as SWE-bench matches them, the marker-delimited region, the exit-status cross-check,
and the mapping of workspace.yaml."""

from __future__ import annotations

import pytest

from evaluations.grading.parsers import swebench_ids, swebench_logs
from evaluations.grading.parsers.swebench_ids import grade, region, resolve, wrapper_script
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import TaskError

PYTEST_LOG = """\
============================= test session starts ==============================
platform linux -- Python 3.11.2, pytest-8.3.3, pluggy-1.5.0
rootdir: /testbed
configfile: pyproject.toml
collected 8 items

testing/test_assertrewrite.py ..F.sxE.                                   [100%]

==================================== ERRORS ====================================
____________________ ERROR at setup of test_fixture_broken _____________________
file /testbed/testing/test_assertrewrite.py, line 60
  fixture 'tmpdir_x' not found
=================================== FAILURES ===================================
_____________ TestRewrite.test_name[assertion with message] _____________
E       AssertionError: assert 1 == 2
testing/test_assertrewrite.py:42: AssertionError
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED testing/test_assertrewrite.py::test_get_assertion_exprs[trivial]
PASSED testing/test_assertrewrite.py::test_get_assertion_exprs[assertion with message]
PASSED testing/test_assertrewrite.py::test_brackets[multi[nested] - dash]
PASSED testing/test_assertrewrite.py::TestRewrite::test_plain
SKIPPED [1] testing/test_assertrewrite.py:88: needs numpy
XFAIL testing/test_assertrewrite.py::test_known_bug - reason: #1234
FAILED testing/test_assertrewrite.py::TestRewrite::test_name[assertion with message] - AssertionError: assert 1 == 2
ERROR testing/test_assertrewrite.py::test_fixture_broken - fixture 'tmpdir_x' not found
============= 1 failed, 4 passed, 1 skipped, 1 xfailed, 1 error in 0.12s =============
"""

DJANGO_LOG = """\
Testing against Django installed in '/testbed/django' with up to 1 processes
Importing application admin_views
Found 7 test(s).
Skipping setup of unused database(s): other.
Operations to perform:
  Synchronize unmigrated apps: admin_views, auth, contenttypes, messages, sessions, staticfiles
  Apply all migrations: admin, sites
System check identified no issues (1 silenced).
test_add_view (admin_views.tests.AdminViewBasicTest) ... ok
test_changelist (admin_views.tests.AdminViewBasicTest) ... FAIL
test_delete (admin_views.tests.AdminViewBasicTest) ... ERROR
test_history (admin_views.tests.AdminViewBasicTest)
The history view lists changes in order. ... ok
test_slow (admin_views.tests.AdminViewBasicTest) ... skipped 'slow database'
test_prints (admin_views.tests.AdminViewBasicTest) ... some output of the test itself
ok
test_unicode (admin_views.tests.AdminViewBasicTest.test_unicode) ... ok

======================================================================
ERROR: test_delete (admin_views.tests.AdminViewBasicTest)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/admin_views/tests.py", line 88, in test_delete
    raise KeyError('x')
KeyError: 'x'

======================================================================
FAIL: test_changelist (admin_views.tests.AdminViewBasicTest)
----------------------------------------------------------------------
AssertionError: 200 != 302

----------------------------------------------------------------------
Ran 7 tests in 0.412s

FAILED (failures=1, errors=1, skipped=1)
"""

SYMPY_LOG = """\
============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
cache:              no
ground types:       python
numpy:              None
random seed:        53428720
hash randomization: on (PYTHONHASHSEED=2340593183)

sympy/core/tests/test_basic.py[4]
test_equality ok
test_matches_basic F
test_has E
test_subs ok                                                                [FAIL]


________________________________________________________________________________
____________ sympy/core/tests/test_basic.py:test_matches_basic _________________
Traceback (most recent call last):
  File "/testbed/sympy/core/tests/test_basic.py", line 60, in test_matches_basic
    assert b1.match(b2) is None
AssertionError

======= tests finished: 2 passed, 1 failed, 1 exceptions, in 0.05 seconds ========
DO *NOT* COMMIT!
"""


def test_pytest_parser_reads_names_cut_at_the_first_blank_as_swebench_does():
    statuses = swebench_logs.parse_pytest(PYTEST_LOG)
    assert statuses == {
        "testing/test_assertrewrite.py::test_get_assertion_exprs[trivial]": "PASSED",
        "testing/test_assertrewrite.py::test_get_assertion_exprs[assertion": "PASSED",
        "testing/test_assertrewrite.py::test_brackets[multi[nested]": "PASSED",
        "testing/test_assertrewrite.py::TestRewrite::test_plain": "PASSED",
        "testing/test_assertrewrite.py::test_known_bug": "XFAIL",
        "testing/test_assertrewrite.py::TestRewrite::test_name[assertion": "FAILED",
        "testing/test_assertrewrite.py::test_fixture_broken": "ERROR",
    }  # "SKIPPED [1] path:88" names a place, not a test


def test_pytest_v2_keeps_whole_names_and_reads_verbose_lines():
    statuses = swebench_logs.parse_pytest_v2(PYTEST_LOG)
    assert statuses["testing/test_assertrewrite.py::test_get_assertion_exprs[assertion with message]"] == "PASSED"
    assert statuses["testing/test_assertrewrite.py::test_brackets[multi[nested] - dash]"] == "PASSED"
    assert statuses["testing/test_assertrewrite.py::TestRewrite::test_name[assertion with message]"] == "FAILED"
    verbose = (
        "\x1b[32mastropy/io/tests/test_x.py::test_read[a b] PASSED\x1b[0m\nastropy/io/tests/test_x.py::test_w FAILED\n"
    )
    assert swebench_logs.parse_pytest_v2(verbose) == {
        "astropy/io/tests/test_x.py::test_read[a b]": "PASSED",
        "astropy/io/tests/test_x.py::test_w": "FAILED",
    }


def test_pytest_options_and_matplotlib_variants():
    log = "PASSED tests/test_r.py::test_path[/tmp/pytest-of-root/pytest-3/x/data.txt]\nPASSED tests/t.py::test_u[//net/x]\n"
    assert swebench_logs.parse_pytest_options(log) == {
        "tests/test_r.py::test_path[/data.txt]": "PASSED",  # a temporary path differs per run: its last part
        "tests/t.py::test_u[//net/x]": "PASSED",
    }
    clicks = "PASSED lib/matplotlib/tests/test_widgets.py::test_click[MouseButton.LEFT]\n"
    assert swebench_logs.parse_matplotlib(clicks) == {"lib/matplotlib/tests/test_widgets.py::test_click[1]": "PASSED"}


def test_seaborn_parser():
    log = "tests/test_core.py::test_a PASSED [ 50%]\nFAILED tests/test_core.py::test_b - x\nPASSED tests/test_core.py::test_c\n"
    assert swebench_logs.parse_seaborn(log) == {
        "tests/test_core.py::test_a": "PASSED",
        "tests/test_core.py::test_b": "FAILED",
        "tests/test_core.py::test_c": "PASSED",
    }


def test_django_parser_reads_the_runners_lines_docstrings_and_late_results():
    statuses = swebench_logs.parse_django(DJANGO_LOG)
    assert statuses["test_add_view (admin_views.tests.AdminViewBasicTest)"] == "PASSED"
    assert statuses["test_changelist (admin_views.tests.AdminViewBasicTest)"] == "FAILED"
    assert statuses["test_delete (admin_views.tests.AdminViewBasicTest)"] == "ERROR"
    # A test with a docstring is named by its first line, as SWE-bench's Django ids are.
    assert statuses["The history view lists changes in order."] == "PASSED"
    assert statuses["test_slow (admin_views.tests.AdminViewBasicTest)"] == "SKIPPED"
    # Its own output between "..." and the result: the "ok" on the next line counts.
    assert statuses["test_prints (admin_views.tests.AdminViewBasicTest)"] == "PASSED"
    assert statuses["test_unicode (admin_views.tests.AdminViewBasicTest.test_unicode)"] == "PASSED"  # Python 3.11+
    interrupted = "test_x (a.tests.T) ... System check identified no issues (0 silenced)\nok\n"
    assert swebench_logs.parse_django(interrupted)["test_x (a.tests.T)"] == "PASSED"


def test_sympy_parser():
    statuses = swebench_logs.parse_sympy(SYMPY_LOG)
    assert statuses["test_equality"] == "PASSED"
    assert statuses["test_matches_basic"] == "FAILED"
    assert statuses["test_has"] == "ERROR"
    assert statuses["sympy/core/tests/test_basic.py:test_matches_basic"] == "FAILED"
    # The last test of a file shares its line with the file's [FAIL]/[OK]: SWE-bench's parser does not
    # read it, so neither do we (its published ids come from the same reading).
    assert "test_subs" not in statuses


def test_each_repository_has_swebenchs_parser():
    assert swebench_logs.parser_for_repo("django/django") == "django"
    assert swebench_logs.parser_for_repo("sympy/sympy") == "sympy"
    assert swebench_logs.parser_for_repo("Sphinx-Doc/Sphinx") == "pytest_v2"
    assert swebench_logs.parser_for_repo("psf/requests") == "pytest_options"
    assert swebench_logs.parser_for_repo("someone/else") == "pytest"
    assert set(swebench_logs.REPO_PARSERS.values()) <= set(swebench_logs.PARSERS)


def test_ids_match_exactly_cut_at_the_first_blank_or_by_swebenchs_prefix_rule():
    cut = swebench_logs.parse_pytest(PYTEST_LOG)
    whole = swebench_logs.parse_pytest_v2(PYTEST_LOG)
    published = "testing/test_assertrewrite.py::test_get_assertion_exprs[assertion"
    written_out = "testing/test_assertrewrite.py::test_get_assertion_exprs[assertion with message]"
    assert resolve(published, cut, "pytest") == (published, "PASSED")
    assert resolve(written_out, cut, "pytest") == (published, "PASSED")  # the id cut as the parser cuts
    assert resolve(published, whole, "pytest_v2") == (written_out, "PASSED")  # more [ than ]: a prefix
    split = {"t.py::test[a b]": "PASSED", "t.py::test[a c]": "FAILED", "t.py::test[a d]": "XFAIL"}
    assert resolve("t.py::test[a", split, "pytest_v2") is None  # the names it starts disagree: no status
    assert resolve("t.py::test[a", {k: "PASSED" for k in split}, "pytest_v2") == ("t.py::test[a b]", "PASSED")
    assert resolve("testing/test_assertrewrite.py::test_nothing", cut, "pytest") is None
    # Django's names hold blanks: never cut (a "FAIL: test_x" header reads as "test_x").
    assert (
        resolve("test_changelist (admin_views.tests.Other)", swebench_logs.parse_django(DJANGO_LOG), "django") is None
    )


def marked(body: str, marker: str = "TE-SWEBENCH-abc") -> str:
    return f"setup noise\n{marker} START\n{body}\n{marker} END\nleft behind: test_add ok\n"


def test_grade_reads_each_id_and_names_the_failing_ones_first():
    output = marked(SYMPY_LOG)
    result = grade(
        output, 1, "TE-SWEBENCH-abc", "sympy", ["test_matches_basic", "test_has"], ["test_equality", "test_gone"]
    )
    assert not result.passed
    assert result.reason == (
        "3 of 4 test ids did not pass: test_matches_basic (FAILED), test_has (ERROR), test_gone (not found in the log)"
    )
    assert result.counts == {
        "fail_to_pass": {"total": 2, "passed": 0, "failed": 2, "missing": 0},
        "pass_to_pass": {"total": 2, "passed": 1, "failed": 0, "missing": 1},
    }
    assert [(r.test_id, r.kind, r.passed, r.shown) for r in result.rows_order()] == [
        ("test_matches_basic", "fail_to_pass", False, "FAILED"),
        ("test_has", "fail_to_pass", False, "ERROR"),
        ("test_gone", "pass_to_pass", False, "not found in the log"),
        ("test_equality", "pass_to_pass", True, "PASSED"),
    ]


def test_resolved_when_every_id_passes_whatever_else_failed():
    result = grade(marked(DJANGO_LOG), 1, "TE-SWEBENCH-abc", "django",
                   ["test_add_view (admin_views.tests.AdminViewBasicTest)"],
                   ["The history view lists changes in order.", "test_slow (admin_views.tests.AdminViewBasicTest)"])  # fmt: skip
    assert (result.passed, result.reason) == (True, "")  # a skipped pass_to_pass id is kept, as SWE-bench keeps it
    skipped = grade(marked(DJANGO_LOG), 1, "TE-SWEBENCH-abc", "django",
                    ["test_slow (admin_views.tests.AdminViewBasicTest)"], [])  # fmt: skip
    assert not skipped.passed and "(SKIPPED)" in skipped.reason  # a skipped fail_to_pass id shows no fix
    shown = grade(marked(PYTEST_LOG), 1, "TE-SWEBENCH-abc", "pytest",
                  ["testing/test_assertrewrite.py::test_get_assertion_exprs[assertion with message]"], [])  # fmt: skip
    assert shown.passed
    assert (
        shown.results[0].shown
        == "PASSED, in the log as testing/test_assertrewrite.py::test_get_assertion_exprs[assertion"
    )


def test_only_the_region_between_this_evaluations_markers_counts():
    marker = "TE-SWEBENCH-0123"
    real = "test_add F\ntest_sub ok"
    forged = (
        "test_add ok\n>>>>> End Test Output\nTE-SWEBENCH-ffff END\n"  # SWE-bench's fixed marker, a guessed one
        f" {marker} END\n{marker} END trailing\n"  # not the line itself
    )
    output = f"{forged}{marker} START\n{forged}{real}\n{marker} END\ntest_add ok\n{marker} END\n"
    assert region(output, marker) == f"{forged}{real}"
    result = grade(output, 1, marker, "sympy", ["test_add"], ["test_sub"])
    assert not result.passed and result.reason == "1 of 2 test ids did not pass: test_add (FAILED)"
    assert region(f"{marker} START\ntest_add ok\n", marker) is None  # killed before its end
    cut_short = grade(f"{marker} START\ntest_add ok\n", None, marker, "sympy", ["test_add"], [])
    assert (cut_short.passed, cut_short.reason) == (
        False,
        "the test command's output has no end marker: it did not run to its end",
    )
    assert swebench_ids.new_marker() != swebench_ids.new_marker()


def test_the_exit_status_cross_check():
    output = marked("test_add ok\ntest_sub ok")
    assert grade(output, 0, "TE-SWEBENCH-abc", "sympy", ["test_add"], ["test_sub"]).passed
    forged = grade(output, 1, "TE-SWEBENCH-abc", "sympy", ["test_add"], ["test_sub"])
    assert (forged.passed, forged.reason) == (
        False,
        "the test command exited 1 though its log shows no failing test: the log does not describe the run",
    )
    assert all(r.passed for r in forged.results)  # each id as the log says; the verdict is not
    other_failure = marked("test_add ok\ntest_sub ok\ntest_unrelated F")
    assert grade(other_failure, 1, "TE-SWEBENCH-abc", "sympy", ["test_add"], ["test_sub"]).passed
    crashed = grade(marked("Traceback (most recent call last):\nImportError: no module calc"), 1,
                    "TE-SWEBENCH-abc", "sympy", ["test_add"], [])  # fmt: skip
    assert crashed.reason == (
        "1 of 1 test ids did not pass: test_add (not found in the log); the sympy parser found no test in the log"
    )


def test_wrapper_quotes_each_file_and_reads_the_marker_from_stdin(tmp_path):
    import subprocess

    script = wrapper_script("printf '<%s>\\n'", ["a b.py", "$(touch pwned)", "it's"], ["gone.py"])
    (tmp_path / "gone.py").write_text("x")
    (tmp_path / "w.sh").write_text(script)
    ran = subprocess.run(["bash", "w.sh"], cwd=tmp_path, input="M1\n", capture_output=True, text=True)
    assert ran.returncode == 0
    assert ran.stdout == "M1 START\n<a b.py>\n<$(touch pwned)>\n<it's>\n\nM1 END\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "gone.py").exists()
    failing = tmp_path / "f.sh"
    failing.write_text(wrapper_script("cat; exit 3", []))  # the command's stdin is /dev/null, not the marker's
    ran = subprocess.run(["bash", str(failing)], input="M2\nsecret\n", capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (3, "M2 START\n\nM2 END\n")


SWEBENCH_YAML = """\
repo: https://example.com/r.git
base_commit: abc123
grader: swebench
swebench:
  test_cmd: ./tests/runtests.py --verbosity 2
  test_files: [admin_views.tests]
  parser: django
  fail_to_pass: ["test_add_view (admin_views.tests.AdminViewBasicTest)"]
  pass_to_pass: []
"""


def write_task(root, workspace: str, files: dict | None = None):
    root.mkdir(parents=True, exist_ok=True)
    (root / "workspace.yaml").write_text(workspace)
    (root / "prompt.md").write_text("Fix it.\n")
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_workspace_yaml_swebench_mapping(tmp_path):
    spec = load_task(write_task(tmp_path / "ok", SWEBENCH_YAML, {"tests/tests/admin_views/tests.py": "x\n"}))
    assert spec.grader == "swebench" and spec.tests == []
    assert spec.swebench.test_cmd == "./tests/runtests.py --verbosity 2"
    assert spec.swebench.test_files == ["admin_views.tests"] and spec.swebench.parser == "django"
    assert spec.swebench.fail_to_pass == ["test_add_view (admin_views.tests.AdminViewBasicTest)"]
    assert spec.swebench.pass_to_pass == [] and spec.swebench.deleted_files == []
    assert [f.relpath for f in spec.support_files] == ["tests/admin_views/tests.py"]


@pytest.mark.parametrize(
    "change, message",
    [
        (("  parser: django\n", "  parser: nose\n"), "'swebench': 'parser' must be one of pytest, pytest_options"),
        (
            ('  fail_to_pass: ["test_add_view (admin_views.tests.AdminViewBasicTest)"]\n', "  fail_to_pass: []\n"),
            "'swebench': 'fail_to_pass' is empty",
        ),
        (("  pass_to_pass: []\n", ""), "'swebench': 'pass_to_pass' must be a list of strings, not empty"),
        (
            ("  test_files: [admin_views.tests]\n", "  test_files: [../x.py]\n"),
            "'test_files' item 1 '../x.py' must be a relative path inside the repository",
        ),
        (("  test_files: [admin_views.tests]\n", "  test_files: [--collect-only]\n"), "'test_files' item 1"),
        (("  test_cmd: ./tests/runtests.py --verbosity 2\n", "  test_cmd: ''\n"), "'test_cmd' must be a non-empty"),
        (("  test_cmd: ./tests/runtests.py --verbosity 2\n", '  test_cmd: "a\\nb"\n'), "'test_cmd' must be one line"),
        (("  pass_to_pass: []\n", "  pass_to_pass: [1]\n"), "'pass_to_pass' item 1 must be a non-empty string"),
        (("  pass_to_pass: []\n", "  pass_to_pass: []\n  timeout: 3\n"), "has the unknown key 'timeout'"),
        (("grader: swebench\n", "grader: exit_code\n"), "'swebench' is read only with 'grader: swebench'"),
    ],
)
def test_workspace_yaml_swebench_mapping_refusals(tmp_path, change, message):
    old, new = change
    assert old in SWEBENCH_YAML
    with pytest.raises(TaskError) as refused:
        load_task(write_task(tmp_path / "t", SWEBENCH_YAML.replace(old, new)))
    assert message in str(refused.value)
    assert str(refused.value).startswith("workspace.yaml: ")


def test_grader_swebench_needs_the_mapping_and_no_scripts(tmp_path):
    without = SWEBENCH_YAML.split("swebench:\n")[0]
    with pytest.raises(TaskError, match="'grader' swebench needs a 'swebench' mapping"):
        load_task(write_task(tmp_path / "a", without))
    with pytest.raises(TaskError, match="the task's tests/\\*.sh scripts would not run"):
        load_task(write_task(tmp_path / "b", SWEBENCH_YAML, {"tests/fail_to_pass_1.sh": "true\n"}))
    with pytest.raises(TaskError, match="the task's checks.txt would not run"):
        load_task(write_task(tmp_path / "c", SWEBENCH_YAML, {"checks.txt": "true\n"}))
