"""`import_swebench --verify`: each task through the executor's pipeline with the gold patch and a no-op agent;
then an imported archive submitted to the running service."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from evaluations.importers.verify import gold_agent
from tests.helpers.gitrepos import git, make_repo
from tests.helpers.polling import submit, wait_terminal
from tests.helpers.runtimes import REGISTRIES
from tests.helpers.swebench import ADD_IDS, FIXED, SOLVER, write_jsonl

# The tests run with real pytest, installed from PyPI through the egress proxy (allowed by name).
INSTALL_PYTEST = "pip install pytest"


def test_the_gold_agent_applies_any_patch_byte_for_byte(tmp_path):
    """Patch text that is shell syntax, or holds the here-document's end marker, is applied as written."""
    nasty = "$(touch pwned) `id` 'quote' \"dq\" \\ GOLD_PATCH_END\nGOLD_PATCH_END\n\ttab é\n"
    repo = tmp_path / "repo"
    shas = make_repo(repo, [{"a.txt": "one\n"}, {"a.txt": "one\n" + nasty}])
    patch = git(repo, "diff", shas[0], shas[1]) + "\n"
    git(repo, "checkout", "--quiet", shas[0])
    agent = tmp_path / "gold.sh"
    agent.write_text(gold_agent("x", patch))
    env = {"PATH": "/usr/bin:/bin", "REPO_DIR": str(repo), "HOME": str(tmp_path)}
    ran = subprocess.run(["bash", str(agent)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (repo / "a.txt").read_text() == "one\n" + nasty
    assert not (tmp_path / "pwned").exists() and not (repo / "pwned").exists()


@pytest.mark.slow
def test_verify_marks_good_tasks_verified_and_says_why_the_others_are_not(cli, served, tmp_path):
    instances, _server, template = served
    good = instances.make("owner__good-1", repo="owner/good")
    # The gold patch does not fix the bug: it changes add() to multiply.
    wrong = instances.make("owner__wrong-1", repo="owner/wrong", fix={"calc.py": FIXED.replace("a + b", "a * b")})
    # The fail_to_pass test passes on the buggy code already: it grades nobody.
    weak = instances.make(
        "owner__weak-1",
        repo="owner/weak",
        tests={"tests/test_zero.py": "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"},
        fail_to_pass=["tests/test_zero.py::test_zero"],
        pass_to_pass=[],
    )
    cli.migrate()
    cli.env["EGRESS_ALLOW"] = ",".join(REGISTRIES)
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [good, wrong, weak])),
                      "--out", str(out), "--repo-url", template, "--install", INSTALL_PYTEST,
                      "--verify", "--jobs", "2", timeout=600)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    progress = re.findall(r"^\[(\d)/6\] (\S+) (gold|noop): ", done.stdout, re.M)
    assert sorted((i, r) for _, i, r in progress) == sorted(
        (i, r) for i in ("owner__good-1", "owner__wrong-1", "owner__weak-1") for r in ("gold", "noop")
    )
    assert re.search(r"^  owner__good-1 +passed +3/3 f2p fail +yes", done.stdout, re.M), done.stdout
    assert re.search(r"^  owner__wrong-1 +FAILED +3/3 f2p fail +NO +with the gold patch: ", done.stdout, re.M)
    assert re.search(
        r"^  owner__weak-1 +passed +0/1 f2p fail +NO +without the fix tests/test_zero.py::test_zero passes",
        done.stdout,
        re.M,
    )
    # Below the table: the ids that failed with the gold patch, and the test output's last lines.
    assert "\nowner__wrong-1 (gold run):\n  failed: tests/test_add.py::test_add[2 + 3], " in done.stdout
    assert re.search(r"^  \| =+ 3 failed, 2 passed in [\d.]+s =+$", done.stdout, re.M), done.stdout
    assert "1 verified, 2 failed verification" in done.stdout

    index = {e["instance_id"]: e for e in json.loads((out / "index.json").read_text())["tasks"]}
    assert index["owner__good-1"]["verified"] is True and "reason" not in index["owner__good-1"]
    assert index["owner__wrong-1"]["verified"] is False
    assert index["owner__wrong-1"]["reason"] == (
        "with the gold patch: running_tests: 3 of 4 test ids did not pass: "
        "tests/test_add.py::test_add[2 + 3] (FAILED, in the log as tests/test_add.py::test_add[2), "
        "tests/test_add.py::test_add[it's [x]] (FAILED, in the log as tests/test_add.py::test_add[it's), "
        'tests/test_add.py::test_add[say "hi"] (FAILED, in the log as tests/test_add.py::test_add[say)'
    )
    assert index["owner__weak-1"]["verified"] is False
    assert index["owner__weak-1"]["reason"] == "without the fix tests/test_zero.py::test_zero passes"

    runs = {e["instance_id"]: e for e in json.loads((out / "verification.json").read_text())["tasks"]}
    gold, noop = runs["owner__good-1"]["gold"], runs["owner__good-1"]["noop"]
    assert (gold["status"], gold["passed"], gold["error"]) == ("completed", True, None)
    assert [(t["name"], t["passed"]) for t in gold["tests"]] == [(i, True) for i in ADD_IDS] + [
        ("tests/test_sub.py::test_sub", True)
    ]
    assert (noop["status"], noop["passed"]) == ("failed", False)
    assert [(t["name"], t["passed"]) for t in noop["tests"]] == [(i, False) for i in ADD_IDS] + [
        ("tests/test_sub.py::test_sub", True)
    ]
    assert noop["test_counts"]["fail_to_pass"] == {"total": 3, "passed": 0, "failed": 3, "missing": 0}
    assert noop["error"].startswith("running_tests: 3 of 4 test ids did not pass: tests/test_add.py::test_add[2 + 3]")
    wrong_gold = runs["owner__wrong-1"]["gold"]
    assert runs["owner__wrong-1"]["verified"] is False and wrong_gold["failed_ids"] == ADD_IDS
    assert wrong_gold["missing_ids"] == [] and "3 failed, 2 passed" in wrong_gold["log_tail"][-2]


@pytest.mark.slow
def test_an_imported_archive_passes_on_the_running_service_with_a_solving_agent(cli, served, tmp_path, worker_service):
    instances, server, template = served
    row = instances.make("owner__calc-1")
    out = instances.www / "tasks"  # served beside the repositories, as `python -m http.server` would
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [row])), "--out", str(out),
                      "--repo-url", template, "--install", INSTALL_PYTEST)  # fmt: skip
    assert done.returncode == 0, done.stderr
    service = worker_service(EGRESS_ALLOW=",".join(REGISTRIES))
    task_url = server.url("/tasks/owner__calc-1.tar.gz")
    solved = wait_terminal(service, submit(service, task_url, SOLVER), timeout=180)
    assert (solved["status"], solved["passed"]) == ("completed", True), solved["error"]
    assert [(t["name"], t["kind"], t["passed"]) for t in solved["test_results"]] == [
        *((i, "fail_to_pass", True) for i in ADD_IDS),
        ("tests/test_sub.py::test_sub", "pass_to_pass", True),
    ]
    assert "5 passed" in solved["test_output"]  # the three parametrize ids and test_sub, by real pytest, in one run
    unsolved = wait_terminal(service, submit(service, task_url, "print('nothing')\n"), timeout=180)
    assert unsolved["status"] == "failed"
    assert unsolved["error"].startswith(
        "running_tests: 3 of 4 test ids did not pass: tests/test_add.py::test_add[2 + 3]"
    )
    assert unsolved["test_counts"]["pass_to_pass"] == {"total": 1, "passed": 1, "failed": 0, "missing": 0}
