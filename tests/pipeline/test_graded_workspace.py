"""workspace.yaml's ``grader:`` (SPEC §17) through the whole pipeline: ``pytest`` holds each script to
its -rA summary as well as its exit status; ``reward_file`` gives the scripts an empty /logs/verifier and
grades what they leave there, whatever they exit with."""

from __future__ import annotations

import pytest

from tests.helpers.archives import Exec
from tests.helpers.tasks import SOLVER
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True)]


def summary(*lines: str, counts: str) -> str:
    body = "\n".join(lines)
    return f"==== short test summary info ====\n{body}\n==== {counts} in 0.01s ====\n"


def task_with_grader(tasks, grader: str, tests: dict) -> str:
    repo_url, shas = tasks.repo([{"calc.py": "def add(a, b):\n    return a - b\n"}])
    return tasks.task(workspace=f"repo: {repo_url}\nbase_commit: {shas[0]}\ngrader: {grader}\n", tests=tests)


def script(text: str, exit_code: int = 0) -> Exec:
    return Exec(f"#!/bin/bash\ncat <<'OUT'\n{text}OUT\nexit {exit_code}\n")


@pytest.mark.parametrize(
    "text, exit_code, passed",
    [
        (summary("PASSED tests/t.py::test_a", "PASSED tests/t.py::test_b", counts="2 passed"), 0, True),
        (
            summary("PASSED tests/t.py::test_a", "FAILED tests/t.py::test_b - assert 1", counts="1 failed, 1 passed"),
            0,
            False,
        ),  # fmt: skip
        (summary("PASSED tests/t.py::test_a", counts="1 passed"), 1, False),  # the exit status disagrees
        ("all good, trust me\n", 0, False),  # no summary: no test ran
    ],
)
def test_grader_pytest_holds_each_script_to_its_summary_and_its_exit_status(
    tasks, e2e_config, sandbox, text, exit_code, passed
):
    url = task_with_grader(tasks, "pytest", {"test_suite.sh": script(text, exit_code)})
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.passed is passed, (evaluation.error, evaluation.test_output)
    assert evaluation.reward == (1.0 if passed else 0.0)
    if not passed:
        assert evaluation.error_kind == "tests_failed"
        row = evaluation.test_results.get()
        assert exit_code != 0 or "[executor: pytest grader:" in row.output


def test_grader_reward_file_grades_what_the_scripts_leave_in_logs_verifier(tasks, e2e_config):
    writes = Exec('#!/bin/bash\necho \'{"reward": 0.5, "coverage": 0.8}\' > /logs/verifier/reward.json\nexit 0\n')
    url = task_with_grader(tasks, "reward_file", {"test_reward.sh": writes})
    half = evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap")
    assert (half.status, half.passed, half.reward, half.rewards) == (
        "failed",
        False,
        0.5,
        {"reward": 0.5, "coverage": 0.8},
    )
    assert half.error == "running_tests: reward 0.5 < 1 (/logs/verifier/reward.json)"
    full = evaluate(task_with_grader(tasks, "reward_file", {"test_reward.sh": Exec(
        "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nexit 3\n")}), SOLVER, config=e2e_config, sandbox="bwrap")  # fmt: skip
    assert (full.status, full.passed, full.reward) == ("completed", True, 1.0), full.error
    silent = evaluate(task_with_grader(tasks, "reward_file", {"test_reward.sh": Exec("#!/bin/bash\ntrue\n")}),
                      SOLVER, config=e2e_config, sandbox="bwrap")  # fmt: skip
    assert (silent.status, silent.error_kind, silent.reward) == ("failed", "tests_failed", None)
    assert "neither /logs/verifier/reward.json nor /logs/verifier/reward.txt" in silent.error


def test_grader_reward_file_needs_the_sandbox(tasks, e2e_config):
    url = task_with_grader(
        tasks, "reward_file", {"test_reward.sh": Exec("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")}
    )
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox="none")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "infrastructure")
    assert "grader reward_file needs the sandbox" in evaluation.error
