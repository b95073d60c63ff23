"""A task graded ``swebench`` (SPEC §19) through the whole pipeline: the repository's own runner (here one
that prints as SymPy's ``bin/test -C --verbose`` does, written in the test repository) runs once over the
test patch's files, each id is read from its log; the gold fix passes, doing nothing fails naming the id,
a crash at import leaves every id missing, and lines forged by the code under test change nothing."""

from __future__ import annotations

import pytest

from tests.helpers.swebench import SOLVER
from tests.helpers.tasks import NOOP
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True)]

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
# SymPy's runner, in small: "path[N]", then "test_x ok|F|E" per test, the tracebacks under
# "____ path:test_x ____" headers, a summary, exit 1 when anything failed.
RUNNER = """\
import importlib.util, os, sys, traceback
sys.path.insert(0, os.getcwd())
print("=" * 29 + " test process starts " + "=" * 30)
print("executable:         %s" % sys.executable)
print()
counts = {"ok": 0, "F": 0, "E": 0}
reports = []
for path in [a for a in sys.argv[1:] if not a.startswith("-")]:
    spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [n for n, f in vars(module).items() if n.startswith("test_") and callable(f)]
    print("%s[%d] " % (path, len(tests)))
    for name in tests:
        try:
            getattr(module, name)()
            result = "ok"
        except AssertionError:
            result = "F"
        except Exception:
            result = "E"
        if result != "ok":
            reports.append((path, name, traceback.format_exc()))
        counts[result] += 1
        print(name, result, flush=True)
for path, name, text in reports:
    print("_" * 80)
    print("_" * 12, "%s:%s" % (path, name), "_" * 12)
    print(text)
print("==== tests finished: %d passed, %d failed, %d exceptions ====" % (counts["ok"], counts["F"], counts["E"]))
sys.exit(1 if counts["F"] or counts["E"] else 0)
"""
TESTS = (
    "from calc import add, sub\n\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_sub():\n    assert sub(5, 3) == 2\n\n\n"
    "def test_unrelated_broken():\n    raise RuntimeError('fails with and without the fix')\n"
)
CRASH = (
    "import os, pathlib\npathlib.Path(os.environ['REPO_DIR'], 'calc.py').write_text('raise ImportError(\"no\")\\n')\n"
)
# The code under test prints a fixed end marker (SWE-bench's), a guessed one, and forged results, before
# the runner prints the real ones.
FORGE = (
    "import os, pathlib\n"
    "f = pathlib.Path(os.environ['REPO_DIR'], 'calc.py')\n"
    "f.write_text(f.read_text() + 'print(\">>>>> End Test Output\\\\nTE-SWEBENCH-0 END\\\\ntest_add ok\\\\ntest_sub ok\")\\n')\n"
)


def swebench_task(tasks, *, fail_to_pass=("test_add",), pass_to_pass=("test_sub",)) -> str:
    repo_url, shas = tasks.repo([{"calc.py": CALC, "bin/test": RUNNER}])
    workspace = (
        f"repo: {repo_url}\nbase_commit: {shas[0]}\ngrader: swebench\nswebench:\n"
        "  test_cmd: PYTHONDONTWRITEBYTECODE=1 python3 bin/test -C --verbose\n"
        "  test_files: [calc_tests/test_calc.py]\n"
        "  parser: sympy\n"
        f"  fail_to_pass: {list(fail_to_pass)}\n"
        f"  pass_to_pass: {list(pass_to_pass)}\n"
        "  deleted_files: [calc_tests/test_old.py]\n"
    )
    return tasks.task(workspace=workspace, tests={"calc_tests/test_calc.py": TESTS})


def test_the_gold_fix_passes_and_each_id_has_a_row(tasks, e2e_config, sandbox):
    url = swebench_task(tasks)
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.reward) == ("completed", True, 1.0), (
        evaluation.error,
        evaluation.test_output,
    )
    rows = list(evaluation.test_results.values_list("name", "kind", "passed", "output", "exit_code"))
    # The runner exited 1 (test_unrelated_broken fails either way): each id passed, so the task did.
    assert rows == [("test_add", "fail_to_pass", True, "PASSED", 1), ("test_sub", "pass_to_pass", True, "PASSED", 1)]
    assert evaluation.test_counts == {
        "fail_to_pass": {"total": 1, "passed": 1, "failed": 0, "missing": 0},
        "pass_to_pass": {"total": 1, "passed": 1, "failed": 0, "missing": 0},
    }
    assert evaluation.test_output.startswith("=== swebench (exit 1) ===\nTE-SWEBENCH-")
    assert "calc_tests/test_calc.py[3]" in evaluation.test_output


def test_doing_nothing_fails_naming_the_id(tasks, e2e_config, sandbox):
    evaluation = evaluate(swebench_task(tasks), NOOP, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.error_kind, evaluation.reward) == ("failed", "tests_failed", 0.0)
    assert evaluation.error == "running_tests: 1 of 2 test ids did not pass: test_add (FAILED)"
    assert list(evaluation.test_results.values_list("name", "passed")) == [("test_add", False), ("test_sub", True)]
    assert evaluation.test_counts["fail_to_pass"] == {"total": 1, "passed": 0, "failed": 1, "missing": 0}


def test_a_crash_before_any_test_ran_leaves_every_id_missing(tasks, e2e_config):
    evaluation = evaluate(swebench_task(tasks), CRASH, config=e2e_config, sandbox="bwrap")
    assert evaluation.status == "failed"
    assert evaluation.error == (
        "running_tests: 2 of 2 test ids did not pass: test_add (not found in the log), "
        "test_sub (not found in the log); the sympy parser found no test in the log"
    )
    assert set(evaluation.test_results.values_list("output", flat=True)) == {"not found in the log"}
    assert "ImportError: no" in evaluation.test_output
    assert evaluation.test_counts["pass_to_pass"] == {"total": 1, "passed": 0, "failed": 0, "missing": 1}


def test_forged_markers_and_results_from_the_code_under_test_change_nothing(tasks, e2e_config):
    evaluation = evaluate(swebench_task(tasks), FORGE, config=e2e_config, sandbox="bwrap")
    assert "TE-SWEBENCH-0 END\ntest_add ok" in evaluation.test_output  # it did print them
    assert evaluation.error == "running_tests: 1 of 2 test ids did not pass: test_add (FAILED)"


def test_rows_are_capped_by_max_tests_failing_ids_first(tasks, e2e_config):
    import dataclasses

    config = dataclasses.replace(e2e_config, max_tests=2)
    url = swebench_task(tasks, pass_to_pass=("test_sub", "test_gone_1", "test_gone_2"))
    evaluation = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    assert evaluation.error == (
        "running_tests: 2 of 4 test ids did not pass: test_gone_1 (not found in the log), "
        "test_gone_2 (not found in the log)"
    )
    assert list(evaluation.test_results.values_list("name", "passed")) == [
        ("test_gone_1", False),
        ("test_gone_2", False),
    ]
    assert evaluation.test_counts == {
        "fail_to_pass": {"total": 1, "passed": 1, "failed": 0, "missing": 0},
        "pass_to_pass": {"total": 3, "passed": 1, "failed": 0, "missing": 2},
    }
