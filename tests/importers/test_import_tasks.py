"""`manage.py import_tasks`: Terminal-Bench 1.x and Harbor folders -> Harbor-layout folders, archives, index.json."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tomllib

import pytest

from evaluations.importers.harborlayout import TEST_SH, toml_value
from evaluations.pipeline.archive import extract_archive, find_task_root
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import ImageEnvironment, SupportFile, TaskRequest
from evaluations.worker.localrun import LocalRunError, task_url_for
from tests.tasks.test_formats import HARBOR_TOML, harbor, terminal_bench, write


def import_tasks(cli, *args: str) -> subprocess.CompletedProcess:
    return cli.manage("import_tasks", *args)


def from_archive(archive, dest):
    extract_archive(archive, dest, max_members=1000, max_bytes=10 << 20)
    return load_task(find_task_root(dest))


def test_terminal_bench_tasks_become_harbor_tasks(cli, tmp_path):
    source = tmp_path / "tb"
    terminal_bench(source)  # source/tb-task
    compose = "services:\n  client:\n    image: ghcr.io/org/ready:1\n"
    other = write(
        source / "second",
        {
            "task.yaml": "instruction: Second.\nmax_test_timeout_sec: 10\n",
            "docker-compose.yaml": compose,
            "run-tests.sh": "pytest -rA\n",
        },
    )
    (source / "notes").mkdir()  # no task in it: passed over, named
    out = tmp_path / "out"
    done = import_tasks(cli, "--from", "terminal-bench", str(source), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert f"passed over {source / 'notes'}: it holds no task.yaml" in lines
    assert lines[-1] == f"imported 2 task(s) into {out}, refused 0"

    original = load_task(source / "tb-task")
    task = out / "tb-task"
    assert sorted(p.relative_to(task).as_posix() for p in task.rglob("*") if p.is_file()) == [
        "environment/Dockerfile",  # the build context: the task root without what only the harness reads
        "environment/run-tests.sh",
        "environment/tests/test_outputs.py",
        "instruction.md",
        "solution/solve.sh",
        "task.toml",
        "tests/run-tests.sh",
        "tests/test.sh",
        "tests/test_outputs.py",
    ]
    assert tomllib.loads((task / "task.toml").read_text()) == {
        "version": "1.0",
        "metadata": {
            "author_name": "someone",
            "difficulty": "easy",
            "tags": ["file", "beginner"],
            "run_tests_in_same_shell": False,
        },
        "agent": {"timeout_sec": 120.0},
        "verifier": {
            "timeout_sec": 30.0,
            "grader": "pytest",
            "env": {"TEST_DIR": "/tests", "T_BENCH_TEST_DIR": "/tests"},
        },
        "environment": {"env": {"TEST_DIR": "/tests"}},
    }
    spec = load_task(task)
    assert (spec.format, spec.grader) == ("harbor", "pytest")
    assert (spec.prompt, spec.env, spec.request, spec.solution) == (
        original.prompt,
        original.env,
        original.request,
        original.solution,
    )
    assert spec.environment == ImageEnvironment(dockerfile="environment/Dockerfile", context="environment")
    assert spec.verifier.script == "test.sh" and spec.verifier.env == original.verifier.env
    assert spec.verifier.files == sorted(
        [*original.verifier.files, SupportFile("test.sh", TEST_SH.encode(), 0o755)], key=lambda f: f.relpath
    )
    assert spec.solution_files == [SupportFile("solve.sh", original.solution.encode(), 0o755)]

    second = load_task(out / "second")
    assert second.environment == ImageEnvironment(image="ghcr.io/org/ready:1")
    assert second.solution is None and not (out / "second" / "solution").exists()
    assert second.request == TaskRequest(verifier_timeout_secs=10.0)

    index = json.loads((out / "index.json").read_text())
    assert [e["name"] for e in index["tasks"]] == ["second", "tb-task"]
    entry = index["tasks"][1]
    assert entry == {
        "name": "tb-task",
        "format": "harbor",
        "source_format": "terminal-bench",
        "source": str(source / "tb-task"),
        "folder": "tb-task",
        "archive": "tb-task.tar.gz",
        "sha256": hashlib.sha256((out / "tb-task.tar.gz").read_bytes()).hexdigest(),
    }
    packed = from_archive(out / "tb-task.tar.gz", tmp_path / "x")
    assert (packed.format, packed.grader, packed.verifier, packed.request) == (
        "harbor",
        "pytest",
        spec.verifier,
        spec.request,
    )
    assert from_archive(out / "second.tar.gz", tmp_path / "y").environment == second.environment
    assert other.exists()


@pytest.mark.parametrize(("status", "reward"), [(0, "1"), (3, "0")])
def test_the_converted_test_sh_keeps_the_exit_status_and_writes_harbor_a_reward(tmp_path, status, reward):
    tests, logs = tmp_path / "tests", tmp_path / "logs" / "verifier"
    tests.mkdir()
    (tests / "run-tests.sh").write_text(f"echo PASSED x; pwd; exit {status}\n")
    script = TEST_SH.replace("/tests/", f"{tests}/").replace("/logs/verifier", str(logs))
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == status
    assert done.stdout == f"PASSED x\n{tmp_path}\n"  # run from the working directory, its output passed on
    assert (logs / "reward.txt").read_text() == reward + "\n"


def test_refused_tasks_are_named_and_the_rest_is_written(cli, tmp_path):
    source = tmp_path / "tb"
    terminal_bench(source)
    write(
        source / "broken",
        {"task.yaml": "instruction: x\nparser_name: sweperf\n", "Dockerfile": "FROM scratch\n", "run-tests.sh": "x\n"},
    )
    clash = write(
        source / "clash",
        {
            "task.yaml": "instruction: x\n",
            "Dockerfile": "FROM scratch\n",
            "run-tests.sh": "x\n",
            "tests/test.sh": "x\n",
        },
    )
    out = tmp_path / "out"
    done = import_tasks(cli, "--from", "terminal-bench", str(source), "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"refused {source / 'broken'}: task.yaml: 'parser_name' 'sweperf' is not supported here: SWE-Perf's parser "
        "reads a verdict the task's own scripts compute in the sandbox, which the executor cannot check (pytest and "
        "swebench are)",
        f"refused {clash}: tests/test.sh would be replaced by the converted task's test.sh",
    ]
    assert done.stdout.splitlines()[-1] == f"imported 1 task(s) into {out}, refused 2"
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "tb-task", "tb-task.tar.gz"]  # no scratch left


def test_harbor_tasks_are_validated_and_packed(cli, tmp_path):
    source = tmp_path / "hb"
    harbor(source)  # source/harbor-task
    write(source / "bad", {"task.toml": '[environment]\nos = "windows"\n', "instruction.md": "x"})
    terminal_bench(tmp_path / "tb")
    out = tmp_path / "out"
    done = import_tasks(cli, "--from", "harbor", str(source), str(tmp_path / "tb" / "tb-task"), "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"refused {tmp_path / 'tb' / 'tb-task'}: is a terminal-bench task (task.yaml), not a harbor one",
        f"refused {source / 'bad'}: task.toml: [environment] os = 'windows': Windows tasks cannot run here (Linux only)",
    ]
    assert (out / "harbor-task" / "task.toml").read_text() == HARBOR_TOML
    original, copied = load_task(source / "harbor-task"), load_task(out / "harbor-task")
    assert (copied.verifier, copied.request, copied.metadata, copied.solution_files) == (
        original.verifier,
        original.request,
        original.metadata,
        original.solution_files,
    )
    packed = from_archive(out / "harbor-task.tar.gz", tmp_path / "x")
    assert (packed.grader, packed.verifier, packed.solution_files) == (
        "reward_file",
        original.verifier,
        original.solution_files,
    )
    index = json.loads((out / "index.json").read_text())
    assert [(e["name"], e["source_format"]) for e in index["tasks"]] == [("harbor-task", "harbor")]

    # A second import into the same OUT keeps the first's entries.
    done = import_tasks(cli, "--from", "terminal-bench", str(tmp_path / "tb"), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    index = json.loads((out / "index.json").read_text())
    assert [e["name"] for e in index["tasks"]] == ["harbor-task", "tb-task"]


def test_two_tasks_of_one_name_and_a_folder_without_tasks(cli, tmp_path):
    terminal_bench(tmp_path / "a")
    terminal_bench(tmp_path / "b")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    done = import_tasks(
        cli,
        "--from",
        "terminal-bench",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
        str(tmp_path / "empty"),
        "--out",
        str(out),
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"refused {tmp_path / 'empty'}: holds no terminal-bench task (task.yaml in it or in a sub-folder)",
        f"refused {tmp_path / 'b' / 'tb-task'}: a second task named tb-task",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "terminal-bench", "/nonexistent-dir", "--out", "x"], "DIR /nonexistent-dir: no such folder"),
        (["--from", "swe-bench", "."], "invalid choice: 'swe-bench'"),
        (["."], "the following arguments are required: --from"),
    ],
)
def test_bad_arguments_exit_2(cli, args, message):
    done = import_tasks(cli, *args)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        'quo"te\\back',
        "new\nline\ttab",
        "del\x7fcontrol\x01",
        "ünïcødé ✓",
        3,
        2.5,
        True,
        [1, "a", [False]],
        {"a b": {"c": 1}},
    ],
)
def test_the_toml_writer_round_trips(value):
    assert tomllib.loads(f"key = {toml_value(value)}\n") == {"key": value}


def test_manage_py_evaluate_packs_harbor_and_terminal_bench_folders(tmp_path):
    for root, task_format in ((harbor(tmp_path / "h"), "harbor"), (terminal_bench(tmp_path / "t"), "terminal-bench")):
        url = task_url_for(str(root), tmp_path)
        assert url.startswith("file://") and url.endswith("/task.tar.gz")
        assert from_archive(url[len("file://") :], tmp_path / f"{task_format}-out").format == task_format
    (tmp_path / "none").mkdir()
    with pytest.raises(LocalRunError) as info:
        task_url_for(str(tmp_path / "none"), tmp_path)
    assert (
        str(info.value)
        == f"TASK {tmp_path / 'none'}: the folder has no workspace.yaml, task.toml or task.yaml (is it the task's root?)"
    )
