"""`manage.py evaluate TASK AGENT`: one evaluation here, through the worker's pipeline."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import signal
import subprocess
import sys
import zipfile

import pytest

from evaluations.runtime.killer import tagged
from tests.helpers.cli import EvaluateCli
from tests.helpers.polling import wait_for
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow

CALC = PROJECT / "examples" / "calc"
STEPS = [
    "downloading_task",
    "preparing_environment",
    "cloning_repo",
    "installing_deps",
    "installing_agent",
    "running_agent",
    "running_tests",
    "cleanup",
]
STEP_LINE = re.compile(r"^  ([a-z_]+) +([0-9]+\.[0-9]{2}) s$", re.M)


def test_a_task_folder_and_a_solving_agent_pass_with_every_step_timed(cli, built_examples):
    done = cli.evaluate(str(built_examples["dir"] / "calc-task"), str(CALC / "solve_agent.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.match(r"^evaluation [0-9a-f-]{36}: file:///.*task\.tar\.gz \(python, sandbox (bwrap|none)\)\n", out)
    assert [step for step, _ in STEP_LINE.findall(out)] == STEPS
    table = out[out.index("  test ") :]
    assert re.search(r"^  fail_to_pass_add +fail_to_pass +passed +0 ", table, re.M)
    assert re.search(r"^  check_1 +check +passed +0 ", table, re.M)
    assert re.search(r"^PASSED: 3 of 3 tests passed in [0-9.]+ s \(evaluation [0-9a-f-]{36}\)$", out, re.M)
    if os.environ.get("REQUIRE_SANDBOX") == "1":
        assert "sandbox bwrap" in out


def test_an_archive_and_a_non_solving_agent_fail_with_exit_1(cli, built_examples):
    done = cli.evaluate(str(built_examples["dir"] / "calc-task.tar.gz"), str(CALC / "noop_agent.py"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"^  fail_to_pass_add +fail_to_pass +FAILED +1 ", done.stdout, re.M)
    assert "FAILED: running_tests: 1 of 3 tests failed (fail_to_pass_add)" in done.stdout


def test_a_url_with_json_prints_the_evaluation_object(cli, built_examples):
    url = f"{built_examples['url']}/calc-task.tar.gz"
    done = cli.evaluate(url, str(CALC / "solve_agent.py"), "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)  # nothing but the object on stdout
    assert (body["status"], body["step"], body["passed"], body["task_url"]) == ("completed", "done", True, url)
    assert [r["name"] for r in body["test_results"]] == ["fail_to_pass_add", "pass_to_pass_sub", "check_1"]
    assert body["metadata"]["submitted_with"] == "manage.py evaluate"
    assert body["owner"] is None  # no tenant: the operator's own run (SPEC §20)
    assert "+    return a + b" in body["agent_patch"]
    assert [step for step, _ in STEP_LINE.findall(done.stderr)] == STEPS  # the progress went to stderr


def test_an_agent_folder_and_an_agent_archive_are_sent_as_projects(cli, built_examples, tmp_path):
    project = tmp_path / "my-agent"
    (project / "lib").mkdir(parents=True)
    (project / "lib" / "__init__.py").write_text("")
    (project / "lib" / "solve.py").write_text((CALC / "solve_agent.py").read_text())
    (project / "main.py").write_text("import lib.solve\n")
    done = cli.evaluate(str(built_examples["dir"] / "calc-task"), str(project), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(done.stdout)
    assert body["passed"] is True and "patched calc.py" in body["agent_output"]
    assert [step for step, _ in STEP_LINE.findall(done.stderr)] == STEPS
    archive = tmp_path / "agent.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(project / "main.py", "src/run.py")
        zf.writestr("src/lib/__init__.py", "")
        zf.write(project / "lib" / "solve.py", "src/lib/solve.py")
    done = cli.evaluate(str(built_examples["dir"] / "calc-task"), str(archive), "--entrypoint", "src/run.py", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(done.stdout)
    assert body["passed"] is True and body["agent_sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    (project / "link.py").symlink_to("/etc/passwd")
    done = cli.evaluate(str(built_examples["dir"] / "calc-task"), str(project))
    assert done.returncode == 2 and "agent archive member 'link.py' is a symbolic link" in done.stderr


def test_on_a_terminal_a_live_line_shows_the_current_step(cli, built_examples, tmp_path):
    agent = tmp_path / "slow.py"
    agent.write_text("import time\nfor i in range(10):\n    print(i, flush=True)\n    time.sleep(0.1)\n")
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "evaluate", str(built_examples["dir"] / "calc-task"), str(agent)],
        cwd=PROJECT,
        env=cli.env,
        stdout=follower,
        stderr=(tmp_path / "stderr").open("w"),
    )
    os.close(follower)
    output = b""
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not data:
            break
        output += data
    os.close(leader)
    text = output.decode()
    assert process.wait(timeout=120) == 1, text + (tmp_path / "stderr").read_text()  # the agent solves nothing
    assert re.search(r"\r\x1b\[K  running_agent +[0-9]+\.[0-9] s [|/\\-]", text), text  # the live line
    assert re.search(r"\r\x1b\[K  running_agent +[0-9]+\.[0-9]{2} s\r\n", text), text  # replaced by the final one


def test_ctrl_c_cancels_the_evaluation_and_kills_its_processes(cli, built_examples, tmp_path):
    _interrupt_a_running_agent(cli, built_examples, tmp_path)


def test_ctrl_c_cancels_even_when_the_command_starts_with_sigint_ignored(cli, built_examples, tmp_path):
    """A background job of a non-interactive shell (`bin/test > log &`, a CI step) starts with SIGINT
    ignored, and so does every process it starts: Python then turns no SIGINT into KeyboardInterrupt.
    The command takes SIGINT itself; before, it went on running the agent (issue 23)."""
    ignoring = ("/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh")  # what such a shell does to its jobs
    probe = [*ignoring, sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT).name)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "SIG_IGN\n"
    _interrupt_a_running_agent(cli, built_examples, tmp_path, prefix=ignoring)


def _interrupt_a_running_agent(cli, built_examples, tmp_path, prefix: tuple[str, ...] = ()) -> None:
    """SIGINT once the agent runs: the evaluation ends cancelled, with nothing of it left running."""
    agent = tmp_path / "sleeper.py"
    agent.write_text(
        "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\n"
        "print('sleeper is running', flush=True)\ntime.sleep(300)\n"
    )
    command = [sys.executable, "manage.py", "evaluate", str(built_examples["dir"] / "calc-task"), str(agent), "--json"]
    process = subprocess.Popen(
        [*prefix, *command],
        cwd=PROJECT,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = ""
    while not (started := re.search(r"^evaluation ([0-9a-f-]{36}): ", seen, re.M)):
        line = process.stderr.readline()
        assert line, f"the command ended early: {seen}"
        seen += line
    live_log = cli.workspace_base / started[1] / "log.txt"

    def agent_running() -> bool:
        assert process.poll() is None, f"the command ended early: {seen}"
        return live_log.is_file() and "sleeper is running" in live_log.read_text(errors="replace")

    wait_for(agent_running, timeout=120, what="the agent's first line in the live log")
    process.send_signal(signal.SIGINT)
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"no exit within 60 s of SIGINT; it printed:\n{seen}{stderr}{stdout}")
    assert process.returncode == 1, seen + stderr
    body = json.loads(stdout)
    assert (body["status"], body["error"]) == ("cancelled", "running_agent: interrupted on the command line")
    assert "interrupted: cancelling" in stderr
    assert not tagged(body["eval_id"]), "a process of the evaluation outlived it"


@pytest.mark.database  # an EvaluateCli of its own, unmigrated then migrated
def test_it_refuses_to_start_with_a_message_and_exit_2(tmp_path, built_examples):
    unmigrated = EvaluateCli(tmp_path / "unmigrated")
    try:
        done = unmigrated.evaluate(str(built_examples["dir"] / "calc-task"), str(CALC / "solve_agent.py"))
        assert done.returncode == 2
        assert "the database is not migrated" in done.stderr and "manage.py migrate" in done.stderr
        unmigrated.migrate()
        done = unmigrated.evaluate(str(tmp_path / "nowhere"), str(CALC / "solve_agent.py"))
        assert done.returncode == 2 and "no such folder or archive, and not a URL" in done.stderr
        done = unmigrated.evaluate(str(CALC / "task"), str(CALC / "solve_agent.py"))  # the unbuilt template
        assert done.returncode == 1 and "downloading_task: workspace.yaml" in done.stdout
        notes = tmp_path / "agent.txt"
        notes.write_text("hi")
        done = unmigrated.evaluate(str(built_examples["dir"] / "calc-task"), str(notes))
        assert done.returncode == 2 and "cannot tell the language of agent.txt" in done.stderr
        done = unmigrated.evaluate(
            str(built_examples["dir"] / "calc-task"), str(notes), "--language", "bash", "--timeout", "0"
        )
        assert done.returncode == 2 and "timeout_secs" in done.stderr
    finally:
        unmigrated.close()


def test_several_tasks_are_a_batch_with_its_table_and_reward(cli, built_examples):
    tasks = [str(built_examples["dir"] / "calc-task"), str(built_examples["dir"] / "calc-task.tar.gz"),
             str(built_examples["dir"] / "layout-task")]  # fmt: skip
    done = cli.evaluate(*tasks, str(CALC / "solve_agent.py"))
    assert done.returncode == 1, done.stdout + done.stderr  # not every task passed
    out = done.stdout
    assert re.match(r"^batch [0-9a-f-]{36}: 3 tasks\n", out)
    assert len(re.findall(r"^\[\d/3\] evaluation [0-9a-f-]{36}: file:///", out, re.M)) == 3
    table = out[out.rindex("  task ") :]
    rows = [line.split() for line in table.splitlines()[1:4]]
    assert rows == [
        [tasks[0], "completed", "yes", "-"],
        [tasks[1], "completed", "yes", "-"],
        [tasks[2], "failed", "no", rows[2][3]],  # error_kind: set by the outcomes' lifecycle (issue 17)
    ]
    assert re.search(r"^reward: 0\.667 \(2 of 3 tasks passed; batch [0-9a-f-]{36} completed\)$", out, re.M)


def test_a_batch_with_json_prints_the_batch_object(cli, built_examples):
    url = f"{built_examples['url']}/calc-task.tar.gz"
    done = cli.evaluate(url, str(built_examples["dir"] / "calc-task"), str(CALC / "solve_agent.py"), "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert (body["status"], body["total"], body["passed"], body["reward"]) == ("completed", 2, 2, 1.0)
    assert body["owner"] is None  # no tenant: the operator's own run (SPEC §20)
    assert body["evaluations"][0]["task_url"] == url
    assert "reward: 1.000" in done.stderr


def test_a_batch_refuses_the_same_task_twice_and_runs_nothing(cli, built_examples):
    url = f"{built_examples['url']}/calc-task.tar.gz"
    done = cli.evaluate(url, url, str(CALC / "solve_agent.py"))
    assert done.returncode == 2
    assert "task_urls: task_urls[1]: the same URL as task_urls[0]" in done.stderr
