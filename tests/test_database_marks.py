"""The ``database`` marking (tests/helpers/database_marks.py): what the rule marks, and that a test it
misses fails in the run without a database (.ci/run's first pass) instead of passing there.

Each test runs pytest in a subprocess, as .ci/run does, on a probe file of its own; the subprocess
reaches no database (DATABASE_URL is NO_DATABASE_URL), so this file needs none either.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers.database_marks import NO_DATABASE_URL
from tests.helpers.service import PROJECT

PROBE = """
import subprocess
import sys

import pytest


def test_free():
    assert sum([1, 2]) == 3


def test_queries_in_process_unmarked():
    from evaluations.models import Evaluation

    Evaluation.objects.count()


def test_runs_manage_py_on_the_database_unmarked():
    done = subprocess.run([sys.executable, "manage.py", "showmigrations"], cwd={project!r},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.django_db
def test_marked_django_db():
    pass


def test_through_a_fixture(transactional_db):
    pass


@pytest.fixture
def live_service():
    return None


def test_through_a_project_fixture(live_service):
    pass


@pytest.mark.database
def test_marked_by_hand():
    pass
"""

TOUCHING = {"test_marked_django_db", "test_through_a_fixture", "test_through_a_project_fixture", "test_marked_by_hand"}


def run_pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE.format(project=str(PROJECT)))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST_"))}
    env["DATABASE_URL"] = NO_DATABASE_URL
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "pytest.ini", "-p", "tests.helpers.database_marks",
         "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'bt'}", *args, str(probe)],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def outcomes(output: str) -> dict[str, str]:
    """{test name: PASSED / FAILED / ...} from the short test summary (-rA)."""
    return dict((name, status) for status, name in re.findall(r"^(\w+) \S*::(\w+)", output, re.MULTILINE))


def test_the_rule_marks_the_tests_that_touch_the_database(tmp_path):
    done = run_pytest(tmp_path, "--collect-only", "-q", "-m", "database")
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(re.findall(r"::(\w+)$", done.stdout, re.MULTILINE)) == TOUCHING


def test_a_test_touching_the_database_unmarked_fails_in_the_run_without_one(tmp_path):
    done = run_pytest(tmp_path, "-rA", "-m", "not database")
    assert done.returncode == 1, done.stdout + done.stderr
    assert outcomes(done.stdout) == {
        "test_free": "PASSED",
        "test_queries_in_process_unmarked": "FAILED",
        "test_runs_manage_py_on_the_database_unmarked": "FAILED",
    }, done.stdout
    assert "Database access not allowed" in done.stdout  # pytest-django's blocker, in this process
    assert "Connection refused" in done.stdout  # NO_DATABASE_URL, in the subprocess
    assert f"{len(TOUCHING)} deselected" in done.stdout
