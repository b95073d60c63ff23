"""Issue 35 (SPEC §22): Terminal-Bench tasks as its published collections have them: a compose service with
working_dir, command, environment and a volume of the task's own folder (LiveCodeBench Pro), a script that
prints its own summary (aider polyglot), parser_name swebench with tests/config.json (its SWE-bench adapter),
and `import_tasks --report`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evaluations.tasks.registry import load_task
from tests.importers.test_verify_tasks import bubblewrap  # noqa: F401  (a fixture)
from tests.tasks.test_formats import write

BOUND_COMPOSE = """\
services:
  client:
    container_name: ${COMPOSE_PROJECT_NAME}
    build:
      context: .
      dockerfile: Dockerfile
    working_dir: /app
    volumes:
      - ./:/app
      - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}
    environment:
      - GREETING=hello
    tty: true
    stdin_open: true
    command: ["sleep", "infinity"]
"""
# aider polyglot's shape: the tests run, then the script prints its own summary; no pytest counts line.
OWN_SUMMARY = """\
#!/bin/bash
cd /app
if bash /app/tests/check.sh; then status=0; else status=1; fi
echo "=============== short test summary info ==============="
if [ $status -eq 0 ]; then echo "PASSED bound_task_test"; else echo "FAILED bound_task_test"; fi
exit $status
"""
# The reference solution checks what the agent sees: /app is the task's folder without its tests,
# run-tests.sh and solution; the compose file's environment is set.
SOLUTION = """\
#!/bin/bash
set -e
test "$PWD" = /app
test ! -e /app/tests && test ! -e /app/run-tests.sh && test ! -e /app/solution.sh
test "$GREETING" = hello
cp input.txt output.txt
echo "$GREETING" >> output.txt
"""


def bound_task(folder: Path, image: str) -> Path:
    return write(
        folder,
        {
            "task.yaml": "instruction: Copy input.txt to output.txt and add $GREETING.\nparser_name: pytest\n",
            "Dockerfile": f"FROM {image}\nWORKDIR /srv\n",
            "docker-compose.yaml": BOUND_COMPOSE,
            "input.txt": "hello\n",
            "run-tests.sh": OWN_SUMMARY,
            "tests/check.sh": 'test "$(cat /app/output.txt)" = "$(printf \'hello\\nhello\')"\n',
            "solution.sh": SOLUTION,
        },
        executable=("run-tests.sh", "solution.sh"),
    )


def swebench_task(folder: Path) -> Path:
    row = {
        "repo": "astropy/astropy",
        "instance_id": "astropy__astropy-12907",
        "FAIL_TO_PASS": json.dumps(
            ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
        ),
        "PASS_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_coord_matrix"]),
        "difficulty": "15 min - 1 hour",
    }
    return write(
        folder,
        {
            "task.yaml": "instruction: Fix separability_matrix.\nparser_name: swebench\n",
            "Dockerfile": "FROM swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest\n",
            "run-tests.sh": "#!/bin/bash\ncd /testbed\npytest -rA astropy/modeling/tests/test_separable.py || true\n",
            "tests/config.json": json.dumps(row),
            "solution.sh": "#!/bin/bash\ngit apply /dev/null\n",
        },
    )


def test_a_compose_volume_of_the_tasks_folder_is_a_copy_without_its_tests_and_solution(tmp_path):
    spec = load_task(bound_task(tmp_path / "bound", "debian:bookworm"))
    assert spec.environment.workdir == "/app"
    assert spec.env == {"GREETING": "hello"}
    assert [f.relpath for f in spec.workdir_files] == ["Dockerfile", "docker-compose.yaml", "input.txt", "task.yaml"]
    assert [f.relpath for f in spec.support_files] == ["run-tests.sh", "tests/check.sh"]  # put back for the verifier


def test_a_swebench_parser_task_is_graded_swebench_from_its_config_json(tmp_path):
    spec = load_task(swebench_task(tmp_path / "sweb"))
    assert (spec.grader, spec.swebench.parser) == ("swebench", "pytest_v2")  # astropy's parser
    assert spec.swebench.fail_to_pass == [
        "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"
    ]


def test_import_tasks_reports_every_folder_and_converts_what_it_read(cli, tmp_path):
    collection = tmp_path / "collection"
    bound_task(collection / "livecodebench" / "lcb-1", "debian:bookworm")
    swebench_task(collection / "swebench" / "astropy__astropy-12907")
    write(collection / "swebench" / "mle-1", {
        "task.yaml": "instruction: x\nparser_name: mlebench\n", "Dockerfile": "FROM debian:bookworm\n",
        "run-tests.sh": "true\n",
    })  # fmt: skip
    (collection / "swebench" / "notes").mkdir()
    out, report = tmp_path / "out", tmp_path / "report.json"
    done = cli.manage("import_tasks", "--from", "terminal-bench", str(collection / "livecodebench"),
                      str(collection / "swebench"), "--out", str(out), "--report", str(report))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    entries = json.loads(report.read_text())
    assert [(Path(e["folder"]).name, e["dataset"], e["imported"]) for e in entries] == [
        ("lcb-1", "livecodebench", True),
        ("astropy__astropy-12907", "swebench", True),
        ("mle-1", "swebench", False),
        ("notes", "swebench", False),
    ]
    assert entries[0]["reason"] == "" and entries[3]["reason"] == "passed over: it holds no task.yaml"
    assert entries[2]["reason"].startswith("task.yaml: 'parser_name' 'mlebench' is not supported here: ")
    converted = load_task(out / "lcb-1")  # Harbor's layout, read back as the Terminal-Bench task reads
    original = load_task(collection / "livecodebench" / "lcb-1")
    assert (converted.format, converted.environment.workdir) == ("harbor", "/app")
    assert [f.relpath for f in converted.workdir_files] == ["Dockerfile", "docker-compose.yaml", "input.txt"]
    assert converted.support_files == original.support_files
    sweb = load_task(out / "astropy__astropy-12907")
    assert (sweb.grader, sweb.swebench) == ("swebench", load_task(collection / "swebench" / sweb.root.name).swebench)


@pytest.mark.slow
def test_a_bound_folder_task_verifies_through_the_pipeline(cli, base_image, bubblewrap, seeded_images, tmp_path):  # noqa: F811
    """Built from the suite's Debian image: the agent runs in /app, which holds the task's folder without its
    tests and solution (the solution checks so, and fails otherwise); the verifier finds the tests at
    /app/tests; the script's own summary is the grade. The no-op agent fails it: verified."""
    registry, ref, _digest = base_image
    tasks = tmp_path / "tasks"
    bound_task(tasks / "bound", ref)
    cli.migrate()
    cli.env.update(IMAGE_INSECURE_REGISTRIES=registry.host, IMAGES_DIR=str(seeded_images))
    out = tmp_path / "out"
    done = cli.manage("verify_tasks", str(tasks), "--out", str(out), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    [entry] = json.loads((out / "verification.json").read_text())
    assert (entry["verified"], entry["solution_reward"], entry["noop_reward"]) == (True, 1.0, 0.0), entry
    assert entry["noop"]["error"] == "running_tests: 1 of 1 test failed (bound_task_test)"
    assert re.search(r"bound +passed +failed +yes", done.stdout), done.stdout
