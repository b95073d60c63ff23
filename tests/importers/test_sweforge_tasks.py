"""SWE-Forge (SPEC §19) in the importers: `verify_tasks` applies a workspace task's `patch` as the gold patch
(on a SWE-Forge folder and on import_swebench's archives), and import_swebench keeps SWE-Forge rows' fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.runtimes import REGISTRIES
from tests.helpers.swebench import FIXED, write_jsonl

ADD_WORKS = "python3 -c 'from calc import add; assert add(2, 3) == 5, add(2, 3)'"


def forge_folder(folder: Path, row: dict, template: str, **keys) -> Path:
    """A SWE-Forge task folder for ``row``: no tests/ and no prompt.md, the row's gold patch as ``patch``."""
    workspace = {
        "repo": template.replace("{repo}", row["repo"]),
        "base_commit": row["base_commit"],
        "fail_to_pass": [ADD_WORKS],
        "pass_to_pass": ["python3 -c 'from calc import sub; assert sub(5, 3) == 2'"],
        "install_config": {"install": "true", "python": "3.11"},
        "prompt": row["problem_statement"],
        "patch": row["patch"],
        **keys,
    }
    folder.mkdir(parents=True)
    (folder / "workspace.yaml").write_text(yaml.safe_dump(workspace, sort_keys=False))
    return folder


@pytest.mark.slow
def test_verify_tasks_applies_a_swe_forge_tasks_patch_as_the_gold_patch(cli, served, tmp_path):
    instances, _server, template = served
    tasks = tmp_path / "tasks"
    forge_folder(tasks / "good", instances.make("owner__good-1", repo="owner/good"), template)
    wrong = instances.make("owner__wrong-1", repo="owner/wrong", fix={"calc.py": FIXED.replace("a + b", "a * b")})
    forge_folder(tasks / "wrong", wrong, template)
    forge_folder(tasks / "none", instances.make("owner__none-1", repo="owner/none"), template, patch=None)
    cli.migrate()
    out = tmp_path / "out"
    done = cli.manage("verify_tasks", str(tasks), "--jobs", "2", "--out", str(out), timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    entries = {Path(e["task"]).name: e for e in json.loads((out / "verification.json").read_text())}
    good, wrong, none = entries["good"], entries["wrong"], entries["none"]
    assert (good["verified"], good["solution_reward"], good["noop_reward"]) == (True, 1.0, 0.0), good
    assert good["format"] == "workspace"
    assert [(t["name"], t["passed"]) for t in good["solution"]["tests"]] == [
        ("fail_to_pass_1", True),
        ("pass_to_pass_1", True),
    ]
    assert good["noop"]["error"] == "running_tests: 1 of 2 tests failed (fail_to_pass_1)"
    assert wrong["verified"] is False
    assert wrong["reason"] == "with the reference solution: running_tests: 1 of 2 tests failed (fail_to_pass_1)"
    assert (none["verified"], none["reason"]) == (False, "the task has no reference solution (workspace.yaml 'patch')")
    assert done.stdout.splitlines()[-1] == f"1 verified, 2 not verified; results in {out}/verification.json"


@pytest.mark.slow
def test_verify_tasks_verifies_import_swebenchs_archives_by_their_gold_patch(cli, served, tmp_path):
    instances, _server, template = served
    row = instances.make("owner__calc-1")
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [row])), "--out", str(out),
                      "--repo-url", template, "--install", "pip install pytest")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    cli.migrate()
    cli.env["EGRESS_ALLOW"] = ",".join(REGISTRIES)  # pytest from PyPI, through the proxy
    checked = cli.manage("verify_tasks", str(out), "--out", str(tmp_path / "checked"), timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    [entry] = json.loads((tmp_path / "checked" / "verification.json").read_text())
    assert Path(entry["task"]).name == "owner__calc-1.tar.gz"  # the archive, not the folder beside it
    assert (entry["verified"], entry["solution_reward"], entry["noop_reward"]) == (True, 1.0, 0.0), entry


def test_import_swebench_keeps_swe_forge_rows_fields_and_names_a_bad_one(cli, served, tmp_path):
    instances, _server, template = served
    forge = instances.make("owner__calc-1", language="go", install="go mod download", difficulty="hard",
                           difficulty_score=3, quality_score=0.8, FAIL_TO_PASS=["go test ./calc/..."],
                           PASS_TO_PASS=["go vet ./..."])  # fmt: skip
    bad = instances.make("owner__calc-2", difficulty_score="hard")
    worse = instances.make("owner__calc-3", difficulty=["hard"])
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [forge, bad, worse])),
                      "--out", str(out), "--repo-url", template)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    workspace = yaml.safe_load((out / "owner__calc-1" / "workspace.yaml").read_text())
    assert (workspace["language"], workspace["install"]) == ("go", ["go mod download"])
    assert (workspace["difficulty"], workspace["difficulty_score"]) == ("hard", 3)
    assert workspace["patch"] == forge["patch"]
    assert done.stderr.splitlines() == [
        "skipped owner__calc-2: difficulty_score must be a whole number from 0 to 255, got 'hard'",
        "skipped owner__calc-3: difficulty must be a string",
    ]
    # SWE-Forge's FAIL_TO_PASS / PASS_TO_PASS are commands: the task runs them, no swebench grader.
    assert "grader" not in workspace and "swebench" not in workspace
    assert workspace["fail_to_pass"] == json.loads(forge["FAIL_TO_PASS"]) if isinstance(forge["FAIL_TO_PASS"], str) \
        else workspace["fail_to_pass"] == forge["FAIL_TO_PASS"]  # fmt: skip


def test_a_swebench_row_is_graded_by_ids_and_a_swe_forge_row_by_commands(cli, served, tmp_path):
    instances, _server, template = served
    plain = instances.make("owner__calc-1")
    forge = instances.make("owner__calc-2", install="pip install -e .",
                           FAIL_TO_PASS=["python -m pytest -rA tests/test_add.py"], PASS_TO_PASS=[])  # fmt: skip
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [plain, forge])),
                      "--out", str(out), "--repo-url", template)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    graded = yaml.safe_load((out / "owner__calc-1" / "workspace.yaml").read_text())
    commands = yaml.safe_load((out / "owner__calc-2" / "workspace.yaml").read_text())
    assert graded["grader"] == "swebench" and "fail_to_pass" not in graded
    assert commands["fail_to_pass"] == ["python -m pytest -rA tests/test_add.py"] and "grader" not in commands
