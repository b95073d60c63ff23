"""The oracle check's own logic (evaluations/importers/verify.py): the verdict, the table, verification.json,
the runs' order and concurrency, and the solution agent run by real bash. The runs' results are made here:
what a whole pipeline run does is test_verify_tasks.py's end-to-end test."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from evaluations.importers import verify
from evaluations.importers.verify import SWEBENCH, Check, RunOutcome, verdict


def graded(reward, error=None, tests=()) -> RunOutcome:
    """A run whose tests ran: completed when the reward is at least 1, else failed by its tests."""
    passed = reward is not None and reward >= 1
    return RunOutcome(
        status="completed" if passed else "failed",
        passed=passed,
        error=None if passed else error or f"running_tests: reward {reward} < 1 (/logs/verifier/reward.txt)",
        error_kind=None if passed else "tests_failed",
        eval_id="e",
        tests=list(tests),
        reward=reward,
    )


def ungraded(status="failed", error="preparing_environment: the image could not be pulled", kind="infrastructure"):
    return RunOutcome(status=status, passed=False, error=error, error_kind=kind, reward=None)


def test_verified_when_the_solution_scores_1_and_the_noop_does_not():
    assert verdict(graded(1.0), graded(0.0)) == (True, None)
    assert verdict(graded(1.0), graded(0.5)) == (True, None)
    # A verifier that writes no reward when nothing was done still failed the no-op: its tests ran.
    no_reward = graded(None, error="running_tests: /logs/verifier/reward.txt is missing")
    assert verdict(graded(1.0), no_reward) == (True, None)


def test_each_other_combination_says_why():
    half = graded(0.5, error="running_tests: reward 0.5 < 1 (/logs/verifier/reward.json)")
    assert verdict(half, graded(0.0)) == (
        False,
        "with the reference solution: running_tests: reward 0.5 < 1 (/logs/verifier/reward.json)",
    )
    missing = graded(None, error="running_tests: /logs/verifier/reward.txt is missing")
    assert verdict(missing, graded(0.0)) == (
        False,
        "with the reference solution: running_tests: /logs/verifier/reward.txt is missing",
    )
    assert verdict(graded(2.0), graded(0.0)) == (False, "with the reference solution: reward 2, not 1")
    timeout = ungraded(error="running_agent: the agent timed out after 900 s", kind="agent_timeout")
    assert verdict(timeout, graded(0.0)) == (
        False,
        "with the reference solution: running_agent: the agent timed out after 900 s",
    )
    assert verdict(graded(1.0), graded(1.0)) == (
        False,
        "with the no-op agent the reward is 1: the tests pass with nothing done",
    )
    assert verdict(graded(1.0), ungraded()) == (
        False,
        "with the no-op agent the tests did not run: preparing_environment: the image could not be pulled",
    )
    not_started = RunOutcome("not_started", False, "CommandError: the request is invalid: agent_code: too long")
    assert verdict(not_started, not_started) == (
        False,
        "with the reference solution: CommandError: the request is invalid: agent_code: too long; "
        "with the no-op agent the tests did not run: CommandError: the request is invalid: agent_code: too long",
    )


def test_a_fail_to_pass_test_that_passes_without_the_fix_is_named():
    f2p = {"name": "fail_to_pass_1", "kind": "fail_to_pass", "passed": True, "exit_code": 0, "timed_out": False}
    p2p = {"name": "pass_to_pass_1", "kind": "pass_to_pass", "passed": False, "exit_code": 1, "timed_out": False}
    # The no-op failed (reward 0, by pass_to_pass_1), but its fail_to_pass test passed: it grades nobody.
    noop = graded(0.0, error="running_tests: 1 of 2 tests failed (pass_to_pass_1)", tests=[f2p, p2p])
    assert verdict(graded(1.0), noop, SWEBENCH) == (False, "without the fix fail_to_pass_1 passes")
    wrong = graded(0.0, error="running_tests: 1 of 2 tests failed (fail_to_pass_1)")
    assert verdict(wrong, graded(0.0), SWEBENCH) == (
        False,
        "with the gold patch: running_tests: 1 of 2 tests failed (fail_to_pass_1)",
    )


def results() -> list[verify.Verification]:
    return [
        verify.Verification("tasks/good", True, None, {"solution": graded(1.0), "noop": graded(0.0)}, "harbor"),
        verify.Verification(
            "tasks/half",
            False,
            "with the reference solution: running_tests: reward 0.5 < 1 (/logs/verifier/reward.txt)",
            {"solution": graded(0.5), "noop": graded(None)},
            "harbor",
        ),
        verify.Verification(
            "tasks/easy",
            False,
            "with the no-op agent the reward is 1: the tests pass with nothing done",
            {"solution": graded(1.0), "noop": graded(1.0)},
            "terminal-bench",
        ),
        verify.Verification(
            "tasks/broken",
            False,
            "with the no-op agent the tests did not run: x",
            {"solution": graded(1.0), "noop": ungraded()},
        ),  # fmt: skip
        verify.Verification("tasks/bare", False, "the task has no reference solution (solution/solve.sh)", {}),
    ]


def test_the_table_has_a_row_per_task_and_says_each_run_in_a_word():
    lines = verify.table(results()).splitlines()
    assert lines[0].split() == ["task", "solution", "no-op", "verified", "reason"]
    cells = {line.split()[0]: line for line in lines[1:]}
    assert cells["tasks/good"].split() == ["tasks/good", "passed", "failed", "yes"]
    assert cells["tasks/half"].split()[:6] == ["tasks/half", "FAILED", "(reward", "0.5)", "failed", "(no"]
    assert cells["tasks/half"].endswith("reward 0.5 < 1 (/logs/verifier/reward.txt)")
    assert cells["tasks/easy"].split()[:4] == ["tasks/easy", "passed", "PASSED", "NO"]
    assert cells["tasks/broken"].split()[:5] == ["tasks/broken", "passed", "not", "graded", "NO"]
    assert cells["tasks/bare"].split()[:4] == ["tasks/bare", "-", "-", "NO"]
    # The columns line up: each row's verdict starts where the header's does.
    column = lines[0].index("verified")
    assert all(line[column : column + 3] in ("yes", "NO ") for line in lines[1:])


def test_verification_json_is_a_list_of_tasks_with_both_rewards(tmp_path):
    path = verify.write_json(tmp_path / "verification.json", results())
    document = json.loads(path.read_text())
    assert [entry["task"] for entry in document] == [
        "tasks/good",
        "tasks/half",
        "tasks/easy",
        "tasks/broken",
        "tasks/bare",
    ]
    good, half, _easy, broken, bare = document
    assert {k: good[k] for k in ("verified", "reason", "solution_reward", "noop_reward", "format")} == {
        "verified": True, "reason": None, "solution_reward": 1.0, "noop_reward": 0.0, "format": "harbor"}  # fmt: skip
    assert good["solution"]["status"] == "completed" and good["noop"]["error_kind"] == "tests_failed"
    assert (half["solution_reward"], half["noop_reward"]) == (0.5, None)
    assert (broken["solution_reward"], broken["noop_reward"]) == (1.0, None)
    assert bare == {
        "task": "tasks/bare",
        "verified": False,
        "reason": "the task has no reference solution (solution/solve.sh)",
        "solution_reward": None,
        "noop_reward": None,
    }
    assert not list(tmp_path.glob(".*.tmp"))


def swebench_document(rows, counts, error, output="") -> dict:
    """An evaluation object of a task graded swebench (SPEC §19), as `evaluate --json` prints it."""
    passed = error is None
    return {
        "eval_id": "e",
        "status": "completed" if passed else "failed",
        "passed": passed,
        "error": error,
        "error_kind": None if passed else "tests_failed",
        "reward": 1.0 if passed else 0.0,
        "test_counts": counts,
        "test_output": output,
        "test_results": [
            {"name": n, "kind": k, "passed": p, "exit_code": 1, "timed_out": False, "duration_ms": 0, "output": o}
            for n, k, p, o in rows
        ],
    }


def counts(f2p=(1, 0, 0, 0), p2p=(0, 0, 0, 0)) -> dict:
    keys = ("total", "passed", "failed", "missing")
    return {"fail_to_pass": dict(zip(keys, f2p, strict=True)), "pass_to_pass": dict(zip(keys, p2p, strict=True))}


def test_a_swebench_run_names_its_failed_and_missing_ids_and_keeps_the_logs_last_lines(tmp_path):
    log = "=== swebench (exit 1) ===\n" + "".join(f"line {n}\n" for n in range(1, 31)) + "\n\n"
    gold = verify.outcome_of(swebench_document(
        [("t.py::test_a", "fail_to_pass", False, "FAILED"), ("t.py::test_b[x", "pass_to_pass", False,
         "not found in the log"), ("t.py::test_c", "pass_to_pass", True, "PASSED")],
        counts((1, 0, 1, 0), (2, 1, 0, 1)),
        "running_tests: 2 of 3 test ids did not pass: t.py::test_a (FAILED), t.py::test_b[x (not found in the log)",
        log,
    ))  # fmt: skip
    assert (gold.failed_ids, gold.missing_ids) == (["t.py::test_a"], ["t.py::test_b[x"])
    assert gold.log_tail == [f"line {n}" for n in range(16, 31)]
    noop = verify.outcome_of(swebench_document([("t.py::test_a", "fail_to_pass", False, "FAILED")], counts((1, 0, 1, 0)),
                                               "running_tests: 1 of 1 test ids did not pass: t.py::test_a (FAILED)"))  # fmt: skip
    ok, reason = verdict(gold, noop, SWEBENCH)
    assert not ok and reason == (
        "with the gold patch: running_tests: 2 of 3 test ids did not pass: t.py::test_a (FAILED), "
        "t.py::test_b[x (not found in the log)"
    )
    result = verify.Verification("owner__x-1", ok, reason, {"gold": gold, "noop": noop})
    assert "1/1 f2p fail" in verify.table([result], SWEBENCH)
    assert verify.details([result], SWEBENCH) == (
        "owner__x-1 (gold run):\n"
        "  failed: t.py::test_a\n"
        "  not found in the log: t.py::test_b[x\n"
        "  the test output's last lines:\n" + "".join(f"  | line {n}\n" for n in range(16, 31))
    )
    document = verify.write_json(tmp_path / "v.json", [result], SWEBENCH)
    entry = json.loads(document.read_text())[0]
    assert entry["gold"]["failed_ids"] == ["t.py::test_a"] and entry["gold"]["missing_ids"] == ["t.py::test_b[x"]
    assert entry["gold"]["log_tail"][-1] == "line 30" and entry["gold"]["test_counts"]["pass_to_pass"]["missing"] == 1


def test_a_run_that_failed_installing_names_the_connections_the_proxy_refused(tmp_path):
    # A real SWE-bench row (pallets__flask-4045): requirements/dev.txt has git+https://github.com/...,
    # pip's last line is its "note: ...not a problem with pip." and the tests never ran.
    error = (
        "installing_deps: install command 'python -m pip install -r requirements/dev.txt' exited with code 1: "
        "note: This error originates from a subprocess, and is likely not a problem with pip."
    )
    egress = [
        {"step": "installing_deps", "host": "pypi.org", "port": 443, "allowed": True,
         "reason": "allowed by EGRESS_ALLOW", "bytes_out": 9, "bytes_in": 9, "count": 3},
        {"step": "installing_deps", "host": "github.com", "port": 443, "allowed": False,
         "reason": "resolution failed", "bytes_out": 0, "bytes_in": 0, "count": 1},
        {"step": "running_tests", "host": "10.0.0.1", "port": 80, "allowed": False,
         "reason": "a private address", "bytes_out": 0, "bytes_in": 0, "count": 2},
    ]  # fmt: skip
    runs = {}
    for run in ("gold", "noop"):
        document = {**swebench_document([], None, error), "error_kind": "task_invalid", "reward": None}
        runs[run] = verify.outcome_of({**document, "egress": egress if run == "gold" else []})
    assert runs["gold"].refused == [
        "github.com:443 during installing_deps: resolution failed",
        "10.0.0.1:80 during running_tests: a private address",
    ]
    assert runs["noop"].refused == [] and verify.outcome_of(swebench_document([], None, error)).refused == []
    ok, reason = verdict(runs["gold"], runs["noop"], SWEBENCH)
    result = verify.Verification("pallets__flask-4045", ok, reason, runs)
    assert verify.details([result], SWEBENCH) == (
        "pallets__flask-4045 (gold run):\n"
        "  refused connections: github.com:443 during installing_deps: resolution failed; "
        "10.0.0.1:80 during running_tests: a private address\n"
    )  # the no-op run, refused nothing and with no output, adds no block
    entry = json.loads(verify.write_json(tmp_path / "v.json", [result], SWEBENCH).read_text())[0]
    assert entry["gold"]["refused"][0] == "github.com:443 during installing_deps: resolution failed"
    assert entry["noop"]["refused"] == []


def test_fail_to_pass_ids_passing_without_the_fix_are_counted_beyond_the_rows():
    gold = verify.outcome_of(swebench_document([("a", "fail_to_pass", True, "PASSED")], counts((9, 9, 0, 0)), None))
    # MAX_TESTS kept two rows, failing first: the counts say seven more passed.
    noop = verify.outcome_of(swebench_document(
        [("a", "fail_to_pass", False, "FAILED"), ("b", "fail_to_pass", True, "PASSED")], counts((9, 8, 1, 0)),
        "running_tests: 1 of 9 test ids did not pass: a (FAILED)",
    ))  # fmt: skip
    assert verdict(gold, noop, SWEBENCH) == (False, "without the fix b and 7 more passes")
    result = verify.Verification("x", False, "", {"gold": gold, "noop": noop})
    assert "1/9 f2p fail" in verify.table([result], SWEBENCH)
    assert verify.details([result], SWEBENCH) == "x (noop run):\n  failed: a\n  fail_to_pass passing: b\n"


def test_every_solution_run_comes_before_any_noop_run_and_a_task_that_cannot_run_is_not_run(tmp_path):
    archives = {name: tmp_path / f"{name}.tar.gz" for name in ("a", "b")}
    checks = [
        Check("a", archives["a"], "#!/bin/bash\necho a\n", format="harbor"),
        Check("skipped", None, None, "the task has no reference solution"),
        Check("b", archives["b"], "#!/bin/bash\necho b\n", format="harbor"),
    ]
    calls = []

    def run(archive: Path, agent: Path) -> RunOutcome:
        solution = agent.name != "noop.sh"
        calls.append((archive.name, "solution" if solution else "noop"))
        if solution:
            assert agent.read_text() == f"#!/bin/bash\necho {archive.name[0]}\n"
        else:
            assert agent.read_text() == verify.NOOP_AGENT
        return graded(1.0 if solution else 0.0)

    lines = []
    found = verify.verify(checks, tmp_path, 1, lines.append, run=run)
    assert calls == [("a.tar.gz", "solution"), ("b.tar.gz", "solution"), ("a.tar.gz", "noop"), ("b.tar.gz", "noop")]
    assert [line[: line.rindex(" (")] for line in lines[:4]] == [
        "[1/4] a solution: passed (reward 1)",
        "[2/4] b solution: passed (reward 1)",
        "[3/4] a noop: failed: running_tests: reward 0.0 < 1 (/logs/verifier/reward.txt) (reward 0)",
        "[4/4] b noop: failed: running_tests: reward 0.0 < 1 (/logs/verifier/reward.txt) (reward 0)",
    ]
    assert all(line.endswith(" s)") for line in lines[:4])
    assert lines[4].startswith("verified 2 task(s) in ")
    assert [(v.task, v.verified, v.reason) for v in found] == [
        ("a", True, None),
        ("skipped", False, "the task has no reference solution"),
        ("b", True, None),
    ]


def test_jobs_runs_that_many_at_once(tmp_path):
    """Two checks, --jobs 2: both solution runs are in flight together (each waits for the other)."""
    both = threading.Barrier(2, timeout=60)
    checks = [Check(name, tmp_path / f"{name}.tar.gz", "#!/bin/bash\n") for name in ("a", "b")]

    def run(archive: Path, agent: Path) -> RunOutcome:
        if agent.name != "noop.sh":
            both.wait()  # a BrokenBarrierError after 60 s if the runs were one at a time
        return graded(1.0 if agent.name != "noop.sh" else 0.0)

    found = verify.verify(checks, tmp_path, 2, lambda line: None, run=run)
    assert [v.verified for v in found] == [True, True]


# -- the solution agent, run by bash ---------------------------------------------------------------

NASTY = b"$(touch pwned) `id` 'q' \"dq\" \\ GOLD_PATCH_END\nGOLD_PATCH_END\n\t\xc3\xa9\n"
SOLVE = b"""#!/bin/bash
set -e
here=$(dirname "$0")
pwd > "$REPO_DIR/ran-in"
cat "$here/data/my file.txt" > answer.txt
"$here/helper.sh" >> answer.txt
echo "DEBIAN_FRONTEND=$DEBIAN_FRONTEND" >> answer.txt
exit "${SOLVE_EXIT:-0}"
"""


def run_agent(agent: str, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    path = tmp_path / "agent.sh"
    path.write_text(agent)
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    base = {"PATH": "/usr/bin:/bin", "REPO_DIR": str(repo), "HOME": str(tmp_path), "TMPDIR": str(tmp)}
    return subprocess.run(["bash", str(path)], cwd=tmp_path, env={**base, **env}, capture_output=True, text=True)


def solution(**kwargs) -> str:
    files = {"solve.sh": SOLVE, "data/my file.txt": NASTY, "helper.sh": b"#!/bin/sh\necho helped\n"}
    return verify.solution_agent("tasks/x\n$(evil)", files, executables=frozenset({"helper.sh"}), **kwargs)


def test_the_solution_agent_writes_every_file_byte_for_byte_and_runs_solve_sh_in_the_working_directory(tmp_path):
    where = tmp_path / "solution"
    ran = run_agent(solution(where=str(where)), tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    repo = tmp_path / "repo"
    assert (repo / "ran-in").read_text().strip() == str(repo)
    assert (repo / "answer.txt").read_bytes() == NASTY + b"helped\nDEBIAN_FRONTEND=noninteractive\n"
    assert (where / "data" / "my file.txt").read_bytes() == NASTY
    assert os.access(where / "helper.sh", os.X_OK) and os.access(where / "solve.sh", os.X_OK)
    assert not os.access(where / "data" / "my file.txt", os.X_OK)
    assert not list(tmp_path.rglob("pwned"))
    assert "cannot be made" not in ran.stdout
    # The task's name is one comment line, whatever it holds.
    assert solution().splitlines()[1].startswith("# the reference solution of tasks/x $(evil), run by")


def test_where_solution_cannot_be_made_the_files_go_under_tmpdir_and_a_line_says_so(tmp_path):
    (tmp_path / "a-file").write_text("")
    where = tmp_path / "a-file" / "solution"  # not even root makes a folder under a file
    ran = run_agent(solution(where=str(where)), tmp_path, SOLVE_EXIT="3")
    assert ran.returncode == 3, ran.stdout + ran.stderr  # the solution's exit status is the agent's
    made = list((tmp_path / "tmp").glob("solution.*"))
    assert len(made) == 1 and (made[0] / "data" / "my file.txt").read_bytes() == NASTY
    assert f"verify_tasks: {where} cannot be made by this user; the solution is in {made[0]}" in ran.stdout
    assert (tmp_path / "repo" / "answer.txt").read_bytes().endswith(b"helped\nDEBIAN_FRONTEND=noninteractive\n")


def test_solution_env_is_over_debian_frontend_and_the_tasks_own_variables(tmp_path):
    where = tmp_path / "solution"
    env = {"DEBIAN_FRONTEND": "teletype", "SOLVE_EXIT": "4", "ODD": "a b'\"$(touch pwned)\n`x`"}
    ran = run_agent(solution(where=str(where), env=env), tmp_path, SOLVE_EXIT="0")
    assert ran.returncode == 4, ran.stdout + ran.stderr  # the solution's value, not the environment's
    assert (tmp_path / "repo" / "answer.txt").read_bytes().endswith(b"helped\nDEBIAN_FRONTEND=teletype\n")
    assert not list(tmp_path.rglob("pwned"))
    probe = verify.solution_agent("t", {"solve.sh": b'printf %s "$ODD"'}, where=str(tmp_path / "s2"), env=env)
    assert run_agent(probe, tmp_path).stdout == env["ODD"]  # byte for byte, nothing of it run


def test_a_solution_without_its_script_is_refused():
    with pytest.raises(ValueError, match="the solution has no solve.sh"):
        verify.solution_agent("t", {"other.sh": b""})
