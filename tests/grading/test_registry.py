"""The grader of a task (grading/registry.py) and how each ends an evaluation (``Grader.verdict``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evaluations.grading.base import Grade
from evaluations.grading.exit_code import ExitCode
from evaluations.grading.pytest_grader import Pytest
from evaluations.grading.registry import GRADERS, for_task
from evaluations.grading.reward_file import RewardFile
from evaluations.grading.swebench import Swebench
from evaluations.grading.terminal_bench import TerminalBench
from evaluations.models import ErrorKind, Status
from evaluations.tasks.spec import GRADERS as TASK_GRADERS


def task(grader: str, verifier: bool):
    return SimpleNamespace(grader=grader, verifier=object() if verifier else None)


def test_every_name_a_task_may_carry_has_its_grader():
    assert set(GRADERS) == set(TASK_GRADERS)
    assert all(grader.name == name for name, grader in GRADERS.items())


@pytest.mark.parametrize(
    ("grader", "verifier", "kind"),
    [
        ("exit_code", False, ExitCode),
        ("exit_code", True, ExitCode),
        ("reward_file", False, RewardFile),
        ("reward_file", True, RewardFile),
        ("pytest", False, Pytest),  # a workspace task's scripts
        ("pytest", True, TerminalBench),  # a verifier's output, as Terminal-Bench's parser reads it (SPEC §22)
        ("swebench", False, Swebench),
        ("swebench", True, Swebench),
    ],
)
def test_for_task(grader, verifier, kind):
    assert type(for_task(task(grader, verifier))) is kind


def test_only_a_task_whose_scripts_run_needs_them():
    assert for_task(task("exit_code", False)).needs_tests(task("exit_code", False))
    assert for_task(task("pytest", False)).needs_tests(task("pytest", False))
    assert not for_task(task("reward_file", True)).needs_tests(task("reward_file", True))
    assert not for_task(task("pytest", True)).needs_tests(task("pytest", True))
    assert not for_task(task("swebench", False)).needs_tests(task("swebench", False))


def test_the_rows_decide_unless_the_grade_names_an_error():
    grader = ExitCode()
    assert grader.verdict(Grade([], "", error="t.sh exited 1", reward=0.0), [("t.sh", False)]) == (
        Status.FAILED,
        "running_tests: t.sh exited 1",
        ErrorKind.TESTS_FAILED,
        {"reward": 0.0},
    )
    assert grader.verdict(Grade([], ""), []) == (
        Status.FAILED,
        "running_tests: task defines no tests",
        ErrorKind.TASK_INVALID,
        None,
    )
    failed = [(f"t{i}", False) for i in range(6)]
    verdict = grader.verdict(Grade([], ""), [("ok", True), *failed])
    assert (verdict.status, verdict.kind) == (Status.FAILED, ErrorKind.TESTS_FAILED)
    assert verdict.error == "running_tests: 6 of 7 tests failed (t0, t1, t2, t3, t4, ...)"
    assert grader.verdict(Grade([], ""), [("a", True), ("b", True)]) == (Status.COMPLETED, "", None, None)


def test_a_reward_alone_decides_a_reward_file_task():
    grader = RewardFile()
    rewards = {"reward": 0.5, "speed": 2.0}
    low = grader.verdict(Grade([], "", reward=0.5, rewards=rewards, source="reward.json"), [("t", True)])
    assert low == (
        Status.FAILED,
        "running_tests: reward 0.5 < 1 (/logs/verifier/reward.json)",
        ErrorKind.TESTS_FAILED,
        {"reward": 0.5, "rewards": rewards},
    )
    none = grader.verdict(Grade([], "", error="the verifier wrote no reward"), [("t", True)])
    assert none == (
        Status.FAILED,
        "running_tests: the verifier wrote no reward",
        ErrorKind.TESTS_FAILED,
        {"reward": None, "rewards": None},
    )
    passed = grader.verdict(Grade([], "", reward=1.0, rewards={"reward": 1.0}, source="reward.txt"), [("t", False)])
    assert passed == (Status.COMPLETED, "", None, {"reward": 1.0, "rewards": {"reward": 1.0}})
