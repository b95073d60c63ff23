"""`manage.py verify_tasks ARCHIVE|DIR...`: which paths are tasks, what each task's check carries, the
command's output, verification.json and exit status. The runs' results are made here (a fake in place of
`manage.py evaluate`) except in the last test, which runs a real Harbor task through the real pipeline."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from evaluations.importers import collect, verify
from evaluations.worker.localrun import pack_folder

SOLVE = "#!/bin/bash\ncp /solution/answer.txt answer.txt\n"
TEST_SH = """#!/bin/bash
if [ "$(cat answer.txt 2>/dev/null)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def write(root: Path, files: dict[str, str | bytes | None], *, executable: tuple[str, ...] = ()) -> Path:
    for name, content in files.items():
        if content is None:
            continue
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(path, 0o755 if name in executable else 0o644)
    return root


def harbor_task(folder: Path, image: str = "registry.example/task:1", **files: str | bytes | None) -> Path:
    """A Harbor task whose solution writes 42 to answer.txt and whose test.sh rewards exactly that."""
    return write(
        folder,
        {
            "task.toml": f'[environment]\ndocker_image = "{image}"\n',
            "instruction.md": "Write 42 to answer.txt.\n",
            "tests/test.sh": TEST_SH,
            "solution/solve.sh": SOLVE,
            "solution/answer.txt": "42\n",
            **files,
        },
        executable=("tests/test.sh", "solution/solve.sh"),
    )


def terminal_bench_task(folder: Path, **files: str | None) -> Path:
    return write(
        folder,
        {
            "task.yaml": "instruction: Write hello.txt.\nparser_name: pytest\n",
            "Dockerfile": "FROM debian:bookworm\n",
            "run-tests.sh": "#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n",
            "tests/test_outputs.py": "def test_hello():\n    assert open('hello.txt').read() == 'hello\\n'\n",
            "solution.sh": "#!/bin/bash\necho hello > hello.txt\n",
            **files,
        },
    )


def archive_of(folder: Path, archive: Path) -> Path:
    pack_folder(folder, archive)
    return archive


# -- which paths are tasks -------------------------------------------------------------------------


def test_a_folder_of_tasks_gives_its_task_folders_and_archives_an_archive_winning_over_its_folder(tmp_path):
    tasks = tmp_path / "tasks"
    harbor_task(tasks / "alpha")
    archive_of(tasks / "alpha", tasks / "alpha.tar.gz")  # as import_tasks writes both: checked once, the archive
    terminal_bench_task(tasks / "beta")
    archive_of(harbor_task(tmp_path / "gamma"), tasks / "gamma.tgz")
    (tasks / "index.json").write_text("{}")
    (tasks / "notes").mkdir()  # a folder holding no task file
    harbor_task(tasks / ".alpha.tmp")  # an import's scratch folder
    found = collect.find([str(tasks), str(tasks / "beta"), str(tasks) + "/"])
    assert [g.name for g in found] == [f"{tasks}/alpha.tar.gz", f"{tasks}/beta", f"{tasks}/gamma.tgz"]
    assert [g.name for g in collect.find([str(tasks / "beta")])] == [str(tasks / "beta")]


def test_a_path_that_is_no_task_is_named(tmp_path):
    with pytest.raises(collect.NotATask, match=f"^{tmp_path}/nope: no such file or folder$"):
        collect.find([str(tmp_path / "nope")])
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "README.md").write_text("hi")
    with pytest.raises(collect.NotATask) as info:
        collect.find([str(tmp_path / "empty")])
    assert str(info.value) == (
        f"{tmp_path}/empty: not a task folder (no workspace.yaml, task.toml, task.yaml at its root) "
        "and no task folder or archive (.tar.gz, .tgz, .tar, .zip) in it"
    )


# -- what a task's check carries -------------------------------------------------------------------


def prepare(path: Path, tmp_path: Path, config=None) -> verify.Check:
    (given,) = collect.find([str(path)])
    return collect.prepare(given, tmp_path / "scratch" / path.name, config or settings.EXECUTOR)


def test_a_harbor_folder_is_packed_and_its_whole_solution_folder_travels(tmp_path):
    folder = harbor_task(tmp_path / "hello", **{"solution/data/big.bin": bytes(range(256)) * 4})
    check = prepare(folder, tmp_path)
    assert (check.name, check.problem, check.format) == (str(folder), None, "harbor")
    with tarfile.open(check.archive) as tar:  # the archive the runs get: the folder under its name
        assert "hello/solution/data/big.bin" in tar.getnames() and "hello/task.toml" in tar.getnames()
    assert check.solution_agent == verify.solution_agent(
        str(folder),
        {"solve.sh": SOLVE.encode(), "answer.txt": b"42\n", "data/big.bin": bytes(range(256)) * 4},
        executables=frozenset({"solve.sh"}),
    )


def test_the_solution_agent_exports_solution_env(tmp_path):
    toml = '[environment]\ndocker_image = "registry.example/task:1"\n[solution.env]\nANSWER = "42"\nQ = "it\'s $(x)"\n'
    check = prepare(harbor_task(tmp_path / "env", **{"task.toml": toml}), tmp_path)
    assert check.solution_agent == verify.solution_agent(
        str(tmp_path / "env"),
        {"solve.sh": SOLVE.encode(), "answer.txt": b"42\n"},
        executables=frozenset({"solve.sh"}),
        env={"ANSWER": "42", "Q": "it's $(x)"},
    )
    assert "export ANSWER=42\nexport Q='it'\"'\"'s $(x)'\n" in check.solution_agent
    bad = harbor_task(tmp_path / "bad", **{"task.toml": toml + "N = 1\n"})
    assert prepare(bad, tmp_path).problem == (
        "the task is invalid (task_invalid): task.toml: [solution.env] N must be a string, got a number"
    )


def test_a_terminal_bench_archive_runs_its_solution_sh(tmp_path):
    archive = archive_of(terminal_bench_task(tmp_path / "tb"), tmp_path / "tb.tar.gz")
    check = prepare(archive, tmp_path)
    assert (check.archive, check.problem, check.format) == (archive.resolve(), None, "terminal-bench")
    assert check.solution_agent == verify.solution_agent(
        str(archive), {"solution.sh": b"#!/bin/bash\necho hello > hello.txt\n"}, "solution.sh"
    )


def test_tasks_that_cannot_be_checked_say_why_and_are_not_run(tmp_path):
    bare = prepare(harbor_task(tmp_path / "bare", **{"solution/solve.sh": None, "solution/answer.txt": None}), tmp_path)
    assert (bare.solution_agent, bare.problem) == (None, "the task has no reference solution (solution/solve.sh)")
    tb = terminal_bench_task(tmp_path / "tb", **{"solution.sh": None, "solution.yaml": "- command: 3\n"})
    assert prepare(tb, tmp_path).problem == (
        "the task has no reference solution (solution.sh): solution.yaml entry 1 has no 'command' string"
    )
    invalid = prepare(harbor_task(tmp_path / "invalid", **{"instruction.md": None}), tmp_path)
    assert invalid.problem.startswith("the task is invalid (task_invalid): ") and "instruction.md" in invalid.problem
    workspace = write(
        tmp_path / "ws", {"workspace.yaml": "repo: null\nenvironment: {image: x/y:1}\n", "prompt.md": "hi"}
    )
    assert prepare(workspace, tmp_path).problem == "the task has no reference solution (workspace.yaml 'patch')"
    small = dataclasses.replace(settings.EXECUTOR, max_agent_code_bytes=1000)
    big = prepare(harbor_task(tmp_path / "big", **{"solution/blob": b"x" * 1000}), tmp_path, small)
    assert big.solution_agent is None
    assert big.problem.startswith("the reference solution as an agent is ")
    assert big.problem.endswith(" bytes, over MAX_AGENT_CODE_BYTES (1000)")


def test_a_file_the_executor_cannot_read_as_a_task_is_no_task(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(collect.NotATask, match="notes.txt: task archive is not a .tar.gz, .tar or .zip file"):
        prepare(tmp_path / "notes.txt", tmp_path)
    (tmp_path / "two" / "a").mkdir(parents=True)
    (tmp_path / "two" / "b").mkdir()
    with pytest.raises(collect.NotATask, match="two.tar.gz: task archive has no workspace.yaml, task.toml"):
        prepare(archive_of(tmp_path / "two", tmp_path / "two.tar.gz"), tmp_path)


# -- the command, on made-up runs ------------------------------------------------------------------


def outcome(reward: float | None, error: str | None = None, kind: str | None = None) -> verify.RunOutcome:
    passed = reward is not None and reward >= 1
    return verify.RunOutcome(
        status="completed" if passed else "failed",
        passed=passed,
        error=None if passed else (error or f"running_tests: reward {reward:g} < 1 (/logs/verifier/reward.txt)"),
        error_kind=None if passed else (kind or "tests_failed"),
        eval_id="00000000-0000-0000-0000-000000000000",
        reward=reward,
    )


# Each task's (solution run, no-op run), by its folder's name.
RUNS = {
    "good": (outcome(1.0), outcome(0.0)),
    "half": (outcome(0.5), outcome(0.0)),
    "easy": (outcome(1.0), outcome(1.0)),
    "lost": (outcome(1.0), outcome(None, "preparing_environment: the image could not be pulled", "infrastructure")),
}


@pytest.fixture
def made_up_runs(monkeypatch):
    """`manage.py evaluate` replaced by RUNS; the calls, as (task, run), in order."""
    calls = []

    def run(archive: Path, agent: Path) -> verify.RunOutcome:
        name = archive.name.removesuffix(".tar.gz")
        solution = agent.read_text() != verify.NOOP_AGENT
        assert not solution or "# the reference solution of " in agent.read_text()
        calls.append((name, "solution" if solution else "noop"))
        return RUNS[name][0 if solution else 1]

    monkeypatch.setattr(verify, "evaluate", run)
    return calls


def verify_tasks(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_tasks", *args, stdout=out)
    except SystemExit as exc:
        return exc.code, out.getvalue()
    return 0, out.getvalue()


@pytest.mark.django_db
def test_the_command_prints_progress_and_a_table_and_writes_verification_json(made_up_runs, tmp_path):
    tasks = tmp_path / "tasks"
    for name in ("good", "half", "easy", "lost"):
        harbor_task(tasks / name)
    harbor_task(tasks / "bare", **{"solution/solve.sh": None})
    out = tmp_path / "results"
    code, printed = verify_tasks(str(tasks), "--jobs", "2", "--out", str(out))
    assert code == 1, printed
    assert sorted(made_up_runs) == sorted(
        (n, r) for n in ("easy", "good", "half", "lost") for r in ("solution", "noop")
    )
    lines = printed.splitlines()
    assert lines[0] == "verifying 5 task(s), 2 run(s) at once"
    assert lines[1] == f"{tasks}/bare: not run: the task has no reference solution (solution/solve.sh)"
    assert sorted(line.split("] ")[0] for line in lines[2:10]) == [f"[{n}/8" for n in range(1, 9)]
    assert lines[10].startswith("verified 4 task(s) in ")
    assert lines[11] == ""
    assert lines[12].split() == ["task", "solution", "no-op", "verified", "reason"]
    rows = {line.split()[0]: line.split(None, 4) for line in lines[13:18]}
    assert rows[f"{tasks}/good"] == [f"{tasks}/good", "passed", "failed", "yes"]
    assert rows[f"{tasks}/half"][1:4] == ["FAILED", "(reward", "0.5)"]
    assert rows[f"{tasks}/easy"][1:4] == ["passed", "PASSED", "NO"]
    assert rows[f"{tasks}/lost"][1:4] == ["passed", "not", "graded"]
    assert rows[f"{tasks}/bare"][1:4] == ["-", "-", "NO"]
    assert lines[18] == f"1 verified, 4 not verified; results in {out}/verification.json"

    document = json.loads((out / "verification.json").read_text())
    entries = {Path(e["task"]).name: e for e in document}
    assert [Path(e["task"]).name for e in document] == ["bare", "easy", "good", "half", "lost"]
    assert {k: entries["good"][k] for k in ("verified", "reason", "solution_reward", "noop_reward", "format")} == {
        "verified": True, "reason": None, "solution_reward": 1.0, "noop_reward": 0.0, "format": "harbor"}  # fmt: skip
    assert entries["half"]["reason"] == (
        "with the reference solution: running_tests: reward 0.5 < 1 (/logs/verifier/reward.txt)"
    )
    assert entries["easy"]["reason"] == "with the no-op agent the reward is 1: the tests pass with nothing done"
    assert entries["lost"]["reason"] == (
        "with the no-op agent the tests did not run: preparing_environment: the image could not be pulled"
    )
    assert (entries["lost"]["solution_reward"], entries["lost"]["noop_reward"]) == (1.0, None)
    assert entries["lost"]["noop"]["error_kind"] == "infrastructure"
    assert entries["bare"] == {
        "task": f"{tasks}/bare",
        "verified": False,
        "reason": "the task has no reference solution (solution/solve.sh)",
        "solution_reward": None,
        "noop_reward": None,
        "format": "harbor",
    }


@pytest.mark.django_db
def test_all_verified_is_exit_0_and_verification_json_goes_to_the_current_folder(made_up_runs, tmp_path, monkeypatch):
    archive = archive_of(harbor_task(tmp_path / "src" / "good"), tmp_path / "good.tar.gz")
    monkeypatch.chdir(tmp_path)
    code, printed = verify_tasks(str(archive))
    assert code == 0, printed
    assert made_up_runs == [("good", "solution"), ("good", "noop")]
    assert printed.splitlines()[-1] == "1 verified, 0 not verified; results in verification.json"
    (entry,) = json.loads((tmp_path / "verification.json").read_text())
    assert (entry["task"], entry["verified"], entry["solution"]["status"]) == (str(archive), True, "completed")


@pytest.mark.django_db
def test_bad_arguments_are_exit_2_before_anything_runs(made_up_runs, tmp_path):
    good = harbor_task(tmp_path / "good")
    (tmp_path / "a-file").write_text("")
    cases = [
        (("--jobs", "0", str(good)), "--jobs must be at least 1"),
        ((str(good), str(tmp_path / "missing")), f"{tmp_path}/missing: no such file or folder"),
        ((str(tmp_path / "a-file"),), "a-file: task archive is not a .tar.gz, .tar or .zip file"),
        ((str(good), "--out", str(tmp_path / "a-file")), f"--out {tmp_path}/a-file: not a folder"),
    ]
    for args, message in cases:
        with pytest.raises(CommandError) as info:
            call_command("verify_tasks", *args, stdout=io.StringIO())
        assert (info.value.returncode, message in str(info.value)) == (2, True), (args, str(info.value))
    assert made_up_runs == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "good"]


def test_the_command_line_exits_2_on_a_database_that_is_not_migrated(cli, tmp_path):
    """As a subprocess: the exit status and the sentence are what a user sees."""
    good = harbor_task(tmp_path / "good")
    done = cli.manage("verify_tasks", str(good), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the database is not migrated" in done.stderr and "manage.py migrate" in done.stderr
    assert not (tmp_path / "out").exists()
    missing = cli.manage("verify_tasks", str(tmp_path / "nope"))
    assert missing.returncode == 2 and f"{tmp_path}/nope: no such file or folder" in missing.stderr


# -- the real pipeline -----------------------------------------------------------------------------


@pytest.fixture
def bubblewrap():
    from evaluations.runtime.sandbox import probe_bwrap

    works, detail = probe_bwrap()
    if not works:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
        pytest.skip(f"bubblewrap does not work here: {detail}")


@pytest.mark.slow
def test_harbor_tasks_run_through_the_pipeline_with_their_solution_and_with_nothing(
    cli, base_image, bubblewrap, seeded_images, tmp_path
):
    """A Harbor task on the suite's Debian image: the solution (solve.sh and the answer.txt beside it,
    from /solution) earns reward 1, the no-op 0: verified. One whose test.sh rewards everyone is not."""
    registry, ref, _digest = base_image
    tasks = tmp_path / "tasks"
    # [solution.env] is the solution run's alone, over the task's own [environment.env]
    env_toml = (
        f'[environment]\ndocker_image = "{ref}"\n[environment.env]\nANSWER = "41"\n[solution.env]\nANSWER = "42"\n'
    )
    harbor_task(
        tasks / "answer", image=ref, **{"task.toml": env_toml, "solution/solve.sh": 'echo "$ANSWER" > answer.txt\n'}
    )
    harbor_task(tasks / "lenient", image=ref, **{"tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"})
    cli.migrate()
    cli.env.update(IMAGE_INSECURE_REGISTRIES=registry.host, IMAGES_DIR=str(seeded_images))
    out = tmp_path / "out"
    done = cli.manage("verify_tasks", str(tasks), "--jobs", "2", "--out", str(out), timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    entries = {Path(e["task"]).name: e for e in json.loads((out / "verification.json").read_text())}
    answer, lenient = entries["answer"], entries["lenient"]
    assert (answer["verified"], answer["reason"]) == (True, None), done.stdout
    assert (answer["solution_reward"], answer["noop_reward"]) == (1.0, 0.0)
    assert answer["solution"]["status"] == "completed" and answer["noop"]["error_kind"] == "tests_failed"
    assert answer["noop"]["error"] == "running_tests: reward 0 < 1 (/logs/verifier/reward.txt)"
    assert (lenient["verified"], lenient["solution_reward"], lenient["noop_reward"]) == (False, 1.0, 1.0)
    assert lenient["reason"] == "with the no-op agent the reward is 1: the tests pass with nothing done"
    assert re.search(rf"^  {re.escape(str(tasks))}/answer +passed +failed +yes$", done.stdout, re.M), done.stdout
    assert re.search(rf"^  {re.escape(str(tasks))}/lenient +passed +PASSED +NO +with the no-op", done.stdout, re.M)
    assert done.stdout.splitlines()[-1] == f"1 verified, 1 not verified; results in {out}/verification.json"


@pytest.mark.slow
def test_the_example_datasets_verify_through_the_pipeline(cli, hub_mirror, bubblewrap, seeded_images, tmp_path):
    """examples/harbor and examples/terminal-bench, as a user runs them: built from their Dockerfiles
    (apt-get and pip through the proxy, the registries allowed by name here), each solved by its reference
    solution (reward 1) and not by the no-op agent."""
    cli.migrate()
    cli.env.update(
        IMAGE_REGISTRY_MIRRORS=f"docker.io={hub_mirror.host}",
        IMAGE_INSECURE_REGISTRIES=hub_mirror.host,
        IMAGES_DIR=str(seeded_images),
        EGRESS_ALLOW="deb.debian.org,security.debian.org,pypi.org,files.pythonhosted.org",
    )
    examples = Path(__file__).resolve().parents[2] / "examples"
    out = tmp_path / "out"
    done = cli.manage("verify_tasks", str(examples / "harbor"), str(examples / "terminal-bench"), "--jobs", "2",
                      "--out", str(out), timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    entries = {Path(e["task"]).name: e for e in json.loads((out / "verification.json").read_text())}
    assert sorted(entries) == ["fix-greeting", "sales-report", "word-count"]
    for name, entry in entries.items():
        assert (entry["verified"], entry["solution_reward"], entry["noop_reward"]) == (True, 1.0, 0.0), (name, entry)
    assert entries["word-count"]["format"] == "terminal-bench" and entries["sales-report"]["format"] == "harbor"
    assert done.stdout.splitlines()[-1] == f"3 verified, 0 not verified; results in {out}/verification.json"


# -- a task of [[steps]] (SPEC §23) ------------------------------------------------------------------

STEP_TEST = """#!/bin/bash
if [ "$(cat {name}.txt 2>/dev/null)" = {name} ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def steps_task(folder: Path, image: str = "registry.example/task:1", **files: str | None) -> Path:
    """Two steps, each rewarding its own file; step one brings its solution, step two takes the task's."""
    return write(
        folder,
        {
            "task.toml": f'[environment]\ndocker_image = "{image}"\n[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n',
            "steps/one/instruction.md": "Write one to one.txt.\n",
            "steps/one/tests/test.sh": STEP_TEST.format(name="one"),
            "steps/one/solution/solve.sh": "#!/bin/bash\ncp /solution/one.txt .\n",
            "steps/one/solution/one.txt": "one\n",
            "steps/two/instruction.md": "Write two to two.txt.\n",
            "tests/test.sh": STEP_TEST.format(name="two"),
            "solution/solve.sh": "#!/bin/bash\necho two > two.txt\n",
            **files,
        },
        executable=("steps/one/solution/solve.sh", "solution/solve.sh"),
    )


def test_a_task_of_steps_runs_each_steps_solution_by_task_step(tmp_path):
    folder = steps_task(tmp_path / "steps")
    check = prepare(folder, tmp_path)
    assert (check.problem, check.format) == (None, "harbor")
    one = verify.solution_agent(f"{folder} (step one)", {"solve.sh": b"#!/bin/bash\ncp /solution/one.txt .\n",
                                "one.txt": b"one\n"}, executables=frozenset({"solve.sh"}))  # fmt: skip
    two = verify.solution_agent(f"{folder} (step two)", {"solve.sh": b"#!/bin/bash\necho two > two.txt\n"},
                                executables=frozenset({"solve.sh"}))  # fmt: skip
    assert check.solution_agent == verify.steps_agent(str(folder), {"one": one, "two": two})
    none = steps_task(tmp_path / "none", **{"solution/solve.sh": None})
    assert prepare(none, tmp_path).problem == (
        "step 'two' has no reference solution (steps/two/solution/solve.sh or solution/solve.sh)"
    )


def test_the_steps_agent_runs_the_step_it_is_run_for(tmp_path):
    agents = {"one": "#!/bin/bash\necho ran one\n", "it's two": "#!/bin/bash\necho ran two\n"}
    script = tmp_path / "agent.sh"
    script.write_text(verify.steps_agent("t", agents))
    for step, said in (("one", "ran one\n"), ("it's two", "ran two\n")):
        done = subprocess.run(
            ["bash", str(script)], env={**os.environ, "TASK_STEP": step}, capture_output=True, text=True
        )
        assert (done.returncode, done.stdout) == (0, said), done.stderr
    done = subprocess.run(
        ["bash", str(script)], env={**os.environ, "TASK_STEP": "three"}, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (1, "verify_tasks: no reference solution for step three\n")


@pytest.mark.slow
def test_a_task_of_steps_verifies_through_the_pipeline(cli, base_image, bubblewrap, tmp_path):
    """Each step's reference solution as that step's agent earns reward 1 (the mean of 1 and 1); the no-op's 0."""
    registry, ref, _digest = base_image
    steps_task(tmp_path / "tasks" / "steps", image=ref)
    cli.migrate()
    cli.env["IMAGE_INSECURE_REGISTRIES"] = registry.host
    out = tmp_path / "out"
    done = cli.manage("verify_tasks", str(tmp_path / "tasks"), "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = json.loads((out / "verification.json").read_text())
    assert (entry["verified"], entry["solution_reward"], entry["noop_reward"]) == (True, 1.0, 0.0), done.stdout
    assert entry["noop"]["error"] == "running_tests: reward 0 < 1 (mean of the steps' rewards)"
