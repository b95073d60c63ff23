"""Issue 35 (SPEC §22): SWE-bench rows as published (SWE-bench Verified's JSON-string ids and `difficulty`,
SWE-bench 5.0's `eval_script`/`log_parser`/`eval_type`), and a repository whose fix shows only in a
`unittest` subTest (pytest 9 prints PASSED and SUBFAILED for it), imported and verified through the pipeline."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers.runtimes import REGISTRIES
from tests.helpers.swebench import BASE_FILES, TEST_COMMIT, write_json_list, write_jsonl

INSTALL_PYTEST = "pip install pytest"  # from PyPI through the egress proxy: pytest 9, which prints SUBFAILED
VERIFIED_FIELDS = {"difficulty": "<15 min fix", "created_at": "2023-05-01T17:14:57Z", "hints_text": ""}
# A fix that shows only in a subTest: without it, pytest 9 says PASSED for test_valid and SUBFAILED beside it.
SUBTESTS = {
    "tests/test_data.py": (
        "import unittest\n\nfrom calc import add\n\n\n"
        "class TestData(unittest.TestCase):\n"
        "    def test_valid(self):\n"
        "        for a, b, want in ((0, 0, 0), (2, 3, 5)):\n"
        "            with self.subTest('sums', a=a, b=b):\n"
        "                self.assertEqual(add(a, b), want)\n"
    ),
    "tests/test_sub.py": TEST_COMMIT["tests/test_sub.py"],
}


def test_a_verified_row_is_graded_by_its_ids_whatever_other_fields_it_carries(cli, served, tmp_path):
    """SWE-bench Verified's `difficulty` made a row SWE-Forge's, its ids run as shell commands (issue 35)."""
    instances, _server, template = served
    verified = instances.make("owner__calc-1", **VERIFIED_FIELDS)
    forge = instances.make("owner__calc-2", difficulty="hard",
                           FAIL_TO_PASS=["python -m pytest -rA tests/test_add.py"], PASS_TO_PASS=[])  # fmt: skip
    out = tmp_path / "out"
    rows = write_json_list(tmp_path / "rows.json", [verified, forge])  # ids JSON-encoded, as published
    done = cli.manage("import_swebench", str(rows), "--out", str(out), "--repo-url", template)
    assert done.returncode == 0, done.stdout + done.stderr
    graded = yaml.safe_load((out / "owner__calc-1" / "workspace.yaml").read_text())
    assert graded["grader"] == "swebench" and "fail_to_pass" not in graded
    assert graded["swebench"]["fail_to_pass"] == verified["FAIL_TO_PASS"]
    assert graded["difficulty"] == "<15 min fix"  # kept, in the evaluation's task_metadata
    commands = yaml.safe_load((out / "owner__calc-2" / "workspace.yaml").read_text())
    assert commands["fail_to_pass"] == ["python -m pytest -rA tests/test_add.py"] and "grader" not in commands


def test_swebench_5_rows_bring_their_eval_script_and_parser(cli, served, tmp_path):
    instances, _server, template = served
    script = "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\npytest -rA tests/test_add.py\n: '>>>>> End Test Output'\n"
    row = instances.make("owner__calc-1", eval_script=script, log_parser="parse_log_sphinx", eval_type="fail_only",
                         image="", **VERIFIED_FIELDS)  # fmt: skip
    jest = instances.make("owner__calc-2", log_parser="parse_log_jest")
    odd = instances.make("owner__calc-3", eval_type="sometimes")
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [row, jest, odd])),
                      "--out", str(out), "--repo-url", template)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    swebench = yaml.safe_load((out / "owner__calc-1" / "workspace.yaml").read_text())["swebench"]
    assert (swebench["eval_script"], swebench["parser"], swebench["eval_type"]) == (script, "pytest_v2", "fail_only")
    assert "test_cmd" not in swebench and "test_files" not in swebench
    assert done.stderr.splitlines()[0].startswith(
        "skipped owner__calc-2: log_parser 'parse_log_jest' is not one this executor has (it has: parse_log_pytest, "
    )
    assert done.stderr.splitlines()[1] == (
        "skipped owner__calc-3: eval_type 'sometimes' is not one this executor has (it has: pass_and_fail, fail_only)"
    )


@pytest.mark.slow
def test_verified_rows_and_a_subtests_fix_verify_through_the_pipeline(cli, served, tmp_path):
    """Both rows as the published dataset has them (a JSON list, ids JSON-encoded, Verified's fields): the gold
    patch passes every id, the no-op agent fails every fail_to_pass id, the subTest's failure included."""
    instances, _server, template = served
    verified = instances.make("owner__calc-1", **VERIFIED_FIELDS)
    subtests = instances.make("owner__data-1", repo="owner/data", base=BASE_FILES, tests=SUBTESTS,
                              fail_to_pass=["tests/test_data.py::TestData::test_valid"],
                              pass_to_pass=["tests/test_sub.py::test_sub"], **VERIFIED_FIELDS)  # fmt: skip
    cli.migrate()
    cli.env["EGRESS_ALLOW"] = ",".join(REGISTRIES)
    out = tmp_path / "out"
    rows = write_json_list(tmp_path / "rows.json", [verified, subtests])
    done = cli.manage("import_swebench", str(rows), "--out", str(out), "--repo-url", template,
                      "--install", INSTALL_PYTEST, "--verify", "--jobs", "2", timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {e["instance_id"]: e for e in json.loads((out / "verification.json").read_text())["tasks"]}
    assert runs["owner__calc-1"]["verified"] is True, runs["owner__calc-1"]
    data = runs["owner__data-1"]
    assert data["verified"] is True, data
    noop = data["noop"]
    assert [(t["name"], t["passed"]) for t in noop["tests"]] == [
        ("tests/test_data.py::TestData::test_valid", False),
        ("tests/test_sub.py::test_sub", True),
    ]
    assert "test_data.py::TestData::test_valid (FAILED)" in noop["error"]
