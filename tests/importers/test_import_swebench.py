"""`manage.py import_swebench FILE`: rows of real repositories served on 127.0.0.1 -> task folders and archives."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile

import yaml

from evaluations.grading.parsers.swebench_ids import wrapper_script
from evaluations.tasks.registry import load_task
from tests.helpers.swebench import ADD_IDS, ADD_TESTS, TEST_COMMIT, write_json_list, write_jsonl


def index(out) -> dict:
    return {entry["instance_id"]: entry for entry in json.loads((out / "index.json").read_text())["tasks"]}


def test_json_lines_become_task_folders_archives_and_an_index(cli, served, tmp_path):
    instances, server, template = served
    good = instances.make("owner__calc-1")
    lone = instances.make("owner__calc-2", pass_to_pass=[])  # same repository: cloned once
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [good, lone])),
                      "--out", str(out), "--repo-url", template)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    assert "imported 2 task(s)" in done.stdout
    assert [r["path"] for r in server.requests].count("/owner/calc.git/info/refs?service=git-upload-pack") == 1

    task = out / "owner__calc-1"
    workspace = yaml.safe_load((task / "workspace.yaml").read_text())
    assert workspace == {
        "repo": server.url("/owner/calc.git"),
        "base_commit": good["base_commit"],
        "version": "1.0",
        "install": ["pip install -e ."],
        # Graded as SWE-bench grades: the test patch's test files (not its data file) run once, each id
        # read from the log by the repository's parser (pytest -rA for a repository SWE-bench does not list).
        "grader": "swebench",
        "swebench": {
            "test_cmd": "python -m pytest -rA -p no:cacheprovider",
            "test_files": ["tests/test_add.py", "tests/test_sub.py"],
            "parser": "pytest",
            "fail_to_pass": ADD_IDS,
            "pass_to_pass": ["tests/test_sub.py::test_sub"],
            "deleted_files": ["tests/test_old.py"],
        },
        "patch": good["patch"],  # the gold patch: verify_tasks' reference solution
    }
    assert (task / "prompt.md").read_text() == good["problem_statement"]
    # The files the test_patch adds or changes, as they are after it, under tests/; not the one it deletes.
    assert (task / "tests" / "tests" / "test_add.py").read_text() == ADD_TESTS
    assert (task / "tests" / "tests" / "data" / "cases.txt").read_text() == "support file in a subfolder\n"
    assert not (task / "tests" / "tests" / "test_old.py").exists()
    assert sorted(p.name for p in (task / "tests").iterdir()) == ["tests"]  # no test script: the grader runs it
    lone_yaml = yaml.safe_load((out / "owner__calc-2" / "workspace.yaml").read_text())
    assert lone_yaml["swebench"]["pass_to_pass"] == []

    # The pipeline's own reader accepts the folder: the swebench mapping, the support files, the repo.
    spec = load_task(task)
    assert (spec.grader, spec.tests) == ("swebench", [])
    assert spec.swebench.fail_to_pass == ADD_IDS and spec.swebench.deleted_files == ["tests/test_old.py"]
    assert [f.relpath for f in spec.support_files] == ["tests/data/cases.txt", "tests/test_add.py", "tests/test_sub.py"]

    listed = index(out)
    assert set(listed) == {"owner__calc-1", "owner__calc-2"}
    entry = listed["owner__calc-1"]
    assert entry["archive"] == "owner__calc-1.tar.gz" and entry["folder"] == "owner__calc-1"
    assert entry["sha256"] == hashlib.sha256((out / "owner__calc-1.tar.gz").read_bytes()).hexdigest()
    assert "verified" not in entry
    with tarfile.open(out / "owner__calc-1.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert load_task(tmp_path / "unpacked" / "owner__calc-1").swebench == spec.swebench
    assert sorted(p.name for p in out.iterdir()) == [
        "index.json", "owner__calc-1", "owner__calc-1.tar.gz", "owner__calc-2", "owner__calc-2.tar.gz",
    ]  # fmt: skip

    # Importing again writes the same bytes: an archive's sha256 changes only with its content.
    again = cli.manage("import_swebench", str(tmp_path / "rows.jsonl"), "--out", str(out), "--repo-url", template)
    assert again.returncode == 0, again.stdout + again.stderr
    assert index(out)["owner__calc-1"]["sha256"] == entry["sha256"]


def test_ids_are_kept_as_written_and_the_test_files_reach_the_command_quoted(cli, served, tmp_path):
    instances, _server, template = served
    odd = [*ADD_IDS, "t.py::test[a\tb]", "t.py::test[$(touch pwned)]", "t.py::test[`id`;\\ ']", "t.py::test[a"]
    odd_files = {"tests/test_add.py": ADD_TESTS, "tests/it's a (test).py": "x = 1\n", "tests/$(touch pwned).py": ""}
    row = instances.make("owner__calc-3", fail_to_pass=odd, tests={**TEST_COMMIT, **odd_files})
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [row])), "--out", str(out),
                      "--repo-url", template, "--test-cmd", "printf '<%s>\\n'")  # fmt: skip
    assert done.returncode == 0, done.stderr
    spec = load_task(out / "owner__calc-3").swebench
    assert spec.fail_to_pass == odd
    assert spec.test_files == [
        "tests/$(touch pwned).py",
        "tests/it's a (test).py",
        "tests/test_add.py",
        "tests/test_sub.py",
    ]
    here = tmp_path / "run"
    here.mkdir()
    (here / "run.sh").write_text(wrapper_script(spec.test_cmd, spec.test_files, spec.deleted_files))
    ran = subprocess.run(["bash", "run.sh"], cwd=here, input="M\n", capture_output=True, text=True, check=True)
    assert ran.stdout == "M START\n" + "".join(f"<{name}>\n" for name in spec.test_files) + "\nM END\n"
    assert sorted(p.name for p in here.iterdir()) == ["run.sh"]  # nothing in a name ran as shell


def test_django_rows_name_test_modules_and_each_repository_its_parser(cli, served, tmp_path):
    instances, _server, template = served
    django_tests = {"tests/admin_views/tests.py": "x = 1\n", "tests/admin_views/fixtures/data.json": "[]\n"}
    django = instances.make("django__django-1", repo="django/django", tests=django_tests,
                            fail_to_pass=["test_add (admin_views.tests.AdminViewTest)"])  # fmt: skip
    sympy = instances.make("sympy__sympy-1", repo="sympy/sympy", fail_to_pass=["test_add"])
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(write_jsonl(tmp_path / "rows.jsonl", [django, sympy])), "--out",
                      str(out), "--repo-url", template, "--test-cmd", "./tests/runtests.py --verbosity 2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    django_spec = load_task(out / "django__django-1").swebench
    assert (django_spec.parser, django_spec.test_files) == ("django", ["admin_views.tests"])
    assert [f.relpath for f in load_task(out / "django__django-1").support_files] == [
        "tests/admin_views/fixtures/data.json",
        "tests/admin_views/tests.py",
    ]  # the data file is a support file, not a test to run
    sympy_spec = load_task(out / "sympy__sympy-1").swebench
    assert (sympy_spec.parser, sympy_spec.test_files) == ("sympy", ["tests/test_add.py", "tests/test_sub.py"])


def test_a_json_list_with_encoded_lists_and_the_options(cli, served, tmp_path):
    instances, _server, template = served
    plain = instances.make("owner__calc-1")
    forge = instances.make(
        "owner__calc-2",
        install="pip install -r requirements-test.txt",
        test_cmd="python -m unittest",
        language="python",
    )
    listed = instances.make("owner__calc-3", install=["make deps", "make"])
    rows = write_json_list(tmp_path / "rows.json", [plain, forge, listed])
    assert isinstance(json.loads(rows.read_text())[0]["FAIL_TO_PASS"], str)
    out = tmp_path / "out"

    done = cli.manage("import_swebench", str(rows), "--out", str(out), "--repo-url", template)
    assert done.returncode == 0, done.stderr
    forge_yaml = yaml.safe_load((out / "owner__calc-2" / "workspace.yaml").read_text())
    assert forge_yaml["install"] == ["pip install -r requirements-test.txt"] and forge_yaml["language"] == "python"
    assert forge_yaml["swebench"]["test_cmd"] == "python -m unittest"
    assert yaml.safe_load((out / "owner__calc-3" / "workspace.yaml").read_text())["install"] == ["make deps", "make"]
    first_sha = index(out)["owner__calc-2"]["sha256"]

    # Options override every row; --only re-imports one task and keeps the others in the index.
    again = cli.manage("import_swebench", str(rows), "--out", str(out), "--repo-url", template,
                       "--only", "owner__calc-2", "--install", "pip install pytest", "--install", "pip install -e .",
                       "--test-cmd", "pytest -x", "--environment", "tools")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "imported 1 task(s)" in again.stdout
    workspace = yaml.safe_load((out / "owner__calc-2" / "workspace.yaml").read_text())
    assert workspace["install"] == ["pip install pytest", "pip install -e ."]
    assert workspace["environment"] == "tools"
    assert workspace["swebench"]["test_cmd"] == "pytest -x"
    assert set(index(out)) == {"owner__calc-1", "owner__calc-2", "owner__calc-3"}
    assert index(out)["owner__calc-2"]["sha256"] != first_sha
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no scratch folder or old copy left

    unknown = cli.manage("import_swebench", str(rows), "--out", str(out), "--repo-url", template, "--only", "nope")
    assert unknown.returncode == 1
    assert unknown.stderr == "skipped nope: no row of FILE has this instance_id (--only)\n"


def test_bad_rows_are_reported_by_id_and_skipped_whole(cli, served, tmp_path):
    instances, _server, template = served
    good = instances.make("owner__calc-1")
    broken_patch = good["test_patch"].replace("-def test_old", "-def test_older")
    rows = [
        good,
        {k: v for k, v in good.items() if k != "test_patch"} | {"instance_id": "no-test-patch"},
        good | {"instance_id": "unknown-commit", "base_commit": "0123456789" * 4},
        good | {"instance_id": "does-not-apply", "test_patch": broken_patch},
        good | {"instance_id": "unreachable", "repo": "owner/missing"},
        good | {"instance_id": "bad-lists", "FAIL_TO_PASS": "[not json"},
        good | {"instance_id": "no-fail-to-pass", "FAIL_TO_PASS": []},
        good | {"instance_id": "owner__calc-1"},  # the same id twice
        good | {"instance_id": "long-prompt", "problem_statement": "x" * 140_000},
        *(good | {"instance_id": bad} for bad in ("../x", "/abs", "", ".hidden", "a/b", "index.json")),
    ]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    path.write_text(path.read_text() + "{not json\n")
    out = tmp_path / "out"
    done = cli.manage("import_swebench", str(path), "--out", str(out), "--repo-url", template)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "imported 1 task(s)" in done.stdout and "skipped 15" in done.stdout
    reported = done.stderr.splitlines()
    expected = {
        "no-test-patch": "missing required field(s): test_patch",
        "unknown-commit": "base_commit 0123456789",
        "does-not-apply": "test_patch does not apply at base_commit",
        "unreachable": "cannot clone " + template.replace("{repo}", "owner/missing"),
        "bad-lists": "FAIL_TO_PASS is a string but not a JSON-encoded list",
        "no-fail-to-pass": "FAIL_TO_PASS is empty",
        "owner__calc-1": "a second row with instance_id owner__calc-1",
        "long-prompt": "problem_statement is over 131071 bytes",
        "../x (line 10)": "is not a safe folder name",
        "/abs (line 11)": "is not a safe folder name",
        "line 12": "instance_id '' is not a safe folder name",
        ".hidden (line 13)": "is not a safe folder name",
        "a/b (line 14)": "is not a safe folder name",
        "index.json (line 15)": "is not a safe folder name",
        "line 16": "not a JSON object",
    }
    for label, message in expected.items():
        assert any(line.startswith(f"skipped {label}: ") and message in line for line in reported), (label, reported)
    assert len(reported) == 15
    assert "is not in the repository" in next(line for line in reported if "unknown-commit" in line)
    # Only the good row was written, and nothing half-written is left beside it.
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "owner__calc-1", "owner__calc-1.tar.gz"]
    assert set(index(out)) == {"owner__calc-1"}


def test_a_file_that_cannot_be_read_is_exit_2_and_writes_nothing(cli, tmp_path):
    out = tmp_path / "out"
    missing = cli.manage("import_swebench", str(tmp_path / "nope.jsonl"), "--out", str(out))
    assert missing.returncode == 2 and "No such file" in missing.stderr
    (tmp_path / "broken.json").write_text('[{"instance_id": "x"},')
    broken = cli.manage("import_swebench", str(tmp_path / "broken.json"), "--out", str(out))
    assert broken.returncode == 2 and "is not a JSON list" in broken.stderr
    jobs = cli.manage("import_swebench", str(tmp_path / "broken.json"), "--verify", "--jobs", "0")
    assert jobs.returncode == 2 and "--jobs must be at least 1" in jobs.stderr
    template = cli.manage("import_swebench", str(tmp_path / "broken.json"), "--repo-url", "https://example.com/x.git")
    assert template.returncode == 2 and "{repo}" in template.stderr
    (tmp_path / "empty.jsonl").write_text("")
    unmigrated = cli.manage("import_swebench", str(tmp_path / "empty.jsonl"), "--out", str(out), "--verify")
    assert unmigrated.returncode == 2, unmigrated.stdout + unmigrated.stderr
    assert "--verify: the database is not migrated" in unmigrated.stderr and "manage.py migrate" in unmigrated.stderr
    assert not out.exists()
