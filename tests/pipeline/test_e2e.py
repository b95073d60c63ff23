"""Whole evaluations through the real pipeline (in this process): real git repositories,
real archives served on 127.0.0.1, real commands under the configured sandbox."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from evaluations import lifecycle
from evaluations.models import Evaluation, Status
from evaluations.pipeline.cancel import CancelState, Stop
from evaluations.runtime.killer import TAG_VAR, tagged
from tests.helpers.archives import Exec
from tests.helpers.polling import wait_for
from tests.helpers.runtimes import run_evaluation
from tests.helpers.tasks import ADD_TEST, NOOP, SOLVER

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def evaluate(task_url, agent_code, *, config, sandbox, language="python", timeout_secs=None, cancel=None, env=None):
    evaluation = Evaluation.objects.create(
        task_url=task_url, agent_code=agent_code, language=language, timeout_secs=timeout_secs, env=env or {}
    )
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(str(evaluation.id), config, sandbox, cancel)
    evaluation.refresh_from_db()
    assert not tagged(str(evaluation.id)), "a process of the evaluation outlived it"
    assert not (config.workspace_base / str(evaluation.id)).exists()
    return evaluation


def test_solving_agent_passes(tasks, e2e_config, sandbox):
    url = tasks.task(
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_true.sh": "true\n"}, checks="# c\n\ntest -f calc.py\n"
    )
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.error) == ("completed", True, ""), evaluation.error
    results = list(evaluation.test_results.values_list("name", "kind", "passed", "exit_code"))
    assert results == [
        ("fail_to_pass_add", "fail_to_pass", True, 0),
        ("pass_to_pass_true", "pass_to_pass", True, 0),
        ("check_1", "check", True, 0),
    ]
    assert "fixed: Make add() add." in evaluation.agent_output
    assert evaluation.agent_exit_code == 0
    assert "-    return a - b" in evaluation.agent_patch and "+    return a + b" in evaluation.agent_patch
    assert "=== fail_to_pass_add (exit 0) ===\nadd-ok" in evaluation.test_output
    steps = [t.step for t in evaluation.transitions.all()]
    assert steps == ["queued", "downloading_task", "preparing_environment", "cloning_repo", "installing_deps", "installing_agent",
                     "running_agent", "running_tests", "cleanup", "done"]  # fmt: skip
    assert evaluation.results_sha256 and evaluation.duration_ms is not None
    assert evaluation.error_kind is None


def test_non_solving_agent_fails_naming_the_test(tasks, e2e_config, sandbox):
    evaluation = evaluate(tasks.task(), NOOP, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("failed", False)
    assert evaluation.error == "running_tests: 1 of 1 tests failed (fail_to_pass_add)"
    assert evaluation.error_kind == "tests_failed"


def test_agent_exiting_non_zero_that_solves_still_passes(tasks, e2e_config, sandbox):
    evaluation = evaluate(tasks.task(), SOLVER + "raise SystemExit(3)\n", config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.agent_exit_code) == ("completed", True, 3)


def test_bash_agent(tasks, e2e_config, sandbox):
    agent = "#!/bin/bash\n[ \"$1\" = --instruction ] || exit 9\nsed -i 's/a - b/a + b/' calc.py\n"
    evaluation = evaluate(tasks.task(), agent, language="bash", config=e2e_config, sandbox=sandbox)
    assert evaluation.passed, evaluation.error


def test_agent_timeout_cancels_without_running_tests(tasks, e2e_config, sandbox):
    evaluation = evaluate(
        tasks.task(), "import time; time.sleep(60)", timeout_secs=1, config=e2e_config, sandbox=sandbox
    )
    assert evaluation.status == "cancelled"
    assert evaluation.error == "running_agent: agent timed out after 1 s"
    assert evaluation.error_kind == "agent_timeout"
    assert evaluation.test_results.count() == 0


def test_install_failure_names_the_command(tasks, e2e_config, sandbox):
    url = tasks.task(install=["echo fine", "echo broken-dep >&2; exit 4"])
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed"
    assert (
        evaluation.error
        == "installing_deps: install command 'echo broken-dep >&2; exit 4' exited with code 4: broken-dep"
    )
    assert evaluation.error_kind == "task_invalid"


def test_missing_base_commit_fails_the_clone(tasks, e2e_config, sandbox):
    repo_url, _ = tasks.repo([{"a.txt": "a"}])
    url = tasks.task(workspace=f"repo: {repo_url}\nbase_commit: 1a2b3c4d5e\n")
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed"
    assert evaluation.error.startswith("cloning_repo: base_commit 1a2b3c4d5e not found in http://127.0.0.1:")
    assert evaluation.error_kind == "task_invalid"


def test_the_future_fix_is_unreachable_to_the_agent(tasks, e2e_config, sandbox):
    url = tasks.task()
    fix_sha = tasks.last_shas[1]
    probe = (
        "import subprocess\n"
        "def git(*a): return subprocess.run(['git', *a], capture_output=True, text=True)\n"
        f"print('LOG', git('log', '--all', '--format=%H').stdout.split())\n"
        f"print('CAT', git('cat-file', '-e', '{fix_sha}').returncode)\n"
        "print('TAGS', git('tag').stdout.split())\n"
        "print('REFS', git('for-each-ref').stdout.split())\n"
    )
    evaluation = evaluate(url, probe, config=e2e_config, sandbox=sandbox)
    assert f"LOG ['{tasks.last_shas[0]}']" in evaluation.agent_output, evaluation.agent_output
    assert "CAT 0" not in evaluation.agent_output and "CAT " in evaluation.agent_output
    assert "TAGS []" in evaluation.agent_output and "REFS []" in evaluation.agent_output


def test_agent_sees_a_clean_environment(tasks, e2e_config, sandbox):
    probe = "import os, json; print('ENV', json.dumps(dict(os.environ), sort_keys=True))"
    evaluation = evaluate(tasks.task(), probe, config=e2e_config, sandbox=sandbox, env={"MY_FLAG": "1"})
    env = __import__("json").loads(evaluation.agent_output.split("ENV ", 1)[1].splitlines()[0])
    assert env["MY_FLAG"] == "1" and env["LANG"] == "C.UTF-8" and env["TZ"] == "UTC" and env["PYTHONHASHSEED"] == "0"
    assert env["TASK_ID"] == str(evaluation.id) and env["REPO_DIR"].endswith("/repo")
    assert env["HOME"].endswith("/home") and env["TASK_PROMPT"].endswith("prompt.md")
    assert "DATABASE_URL" not in env and "DJANGO_SETTINGS_MODULE" not in env


def test_an_empty_test_set_fails(tasks, e2e_config, sandbox):
    evaluation = evaluate(tasks.task(tests={"README": "no scripts here\n"}), SOLVER, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.error) == ("failed", "running_tests: task defines no tests")
    assert evaluation.error_kind == "task_invalid"


def test_test_budget_is_shared_and_an_overrun_is_timed_out(tasks, e2e_config, sandbox):
    config = dataclasses.replace(e2e_config, test_timeout_secs=2)
    url = tasks.task(tests={"a_slow.sh": "sleep 30\n", "b_after.sh": "true\n"})
    evaluation = evaluate(url, SOLVER, config=config, sandbox=sandbox)
    slow, after = evaluation.test_results.all()
    assert slow.timed_out and not slow.passed and slow.exit_code is None
    assert after.timed_out and "not run" in after.output
    assert (evaluation.status, evaluation.error_kind) == ("failed", "tests_failed")  # a test over time failed


def test_the_tests_share_one_sandbox_and_nothing_a_test_leaves_reaches_the_next(tasks, e2e_config, sandbox):
    """SPEC §25: the tests' commands are execs in one sandbox (each sees the markers of those before
    it in its /dev/shm, a tmpfs of each sandbox's own); a daemon a test leaves is gone before the
    next starts, as when each had a sandbox of its own. The install commands share one too."""
    count = "echo $(ls /dev/shm | grep -c '^seen-') >> {log}; touch /dev/shm/seen-$RANDOM$RANDOM\n"
    url = tasks.task(
        install=[count.format(log="$HOME/install.log")] * 2,
        tests={
            "a_daemon.sh": count.format(log="$HOME/tests.log") + "setsid sleep 300.5 </dev/null >/dev/null 2>&1 &\n",
            "b_after.sh": count.format(log="$HOME/tests.log")
            + "! pgrep -f 'sleep 300.5' && cat $HOME/install.log $HOME/tests.log | tr '\\n' ' '\n",
        },
    )
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    daemon, after = evaluation.test_results.all()
    assert daemon.passed and after.passed, (daemon.output, after.output)
    if sandbox == "bwrap":  # without it, /dev/shm is the host's: the count says nothing
        assert after.output.split() == ["0", "1", "0", "1"]  # install: one sandbox; tests: another


def test_the_agent_never_sees_the_sandboxes_started_ahead_for_its_patch_and_the_tests(tasks, e2e_config, sandbox):
    """SPEC §25: the patch's and the tests' sandboxes start while the agent runs and while the
    patch is made; the agent cannot see them, and the tests get HOME and /tmp without what the
    agent left there, and the patch what the agent changed."""
    agent = SOLVER + (
        "import os, subprocess\n"
        "inits = subprocess.run(['pgrep', '-x', 'te-init'], capture_output=True, text=True).stdout.split()\n"
        "pathlib.Path('seen.txt').write_text(f'inits={\",\".join(inits)}\\n')\n"
        "pathlib.Path(os.environ['HOME'], 'planted-in-home').write_text('x')\n"
        "pathlib.Path('/tmp/planted-in-tmp').write_text('x')\n"
    )
    url = tasks.task(
        tests={"clean.sh": "test ! -e $HOME/planted-in-home && test ! -e /tmp/planted-in-tmp && test -e seen.txt\n"}
    )
    evaluation = evaluate(url, agent, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "completed", evaluation.error
    (clean,) = evaluation.test_results.all()
    assert clean.passed, clean.output
    assert "+inits=" in evaluation.agent_patch and "a + b" in evaluation.agent_patch
    if sandbox == "bwrap":  # without one, the agent sees the host's processes (other tests' sandboxes)
        assert re.search(r"^\+inits=\d+$", evaluation.agent_patch, re.M)  # its own sandbox's init, no other


FORK_STORM = """
import os, time
for _ in range(200):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    except OSError:
        break
time.sleep(30)
"""


@pytest.mark.parametrize(
    ("agent", "limit", "message"),
    [
        (
            "x = bytearray(400 * 1024 * 1024); import time; time.sleep(30)",
            {"memory_limit_mb": 200},
            "memory limit exceeded",
        ),
        (
            "import time\nfor i in range(6):\n    open(f'big{i}', 'wb').write(b'x' * 40 * 1024 * 1024)\ntime.sleep(30)",
            {"disk_quota_mb": 100},
            "disk quota exceeded",
        ),
        ("open('big', 'wb').write(b'x' * 300 * 1024 * 1024)", {"disk_quota_mb": 100}, "disk quota exceeded"),
        (FORK_STORM, {"max_processes": 40}, "process limit exceeded"),
    ],
)
def test_limits_fail_the_evaluation_naming_the_cause(tasks, e2e_config, sandbox, agent, limit, message):
    config = dataclasses.replace(e2e_config, **limit)
    evaluation = evaluate(tasks.task(), agent, config=config, sandbox=sandbox)
    assert evaluation.status == "failed"
    assert evaluation.error.startswith(f"running_agent: {message}"), evaluation.error
    assert evaluation.error_kind == "limit_exceeded"
    assert evaluation.test_results.count() == 0


def test_output_flood_keeps_head_and_tail_and_the_service_memory_flat(tasks, e2e_config, sandbox):
    config = dataclasses.replace(e2e_config, max_output_bytes=64 * 1024)
    agent = "import sys\nsys.stdout.write('HEAD')\nfor _ in range(200):\n    sys.stdout.write('x' * 1024 * 1024)\nsys.stdout.write('TAIL')\n"
    before = psutil.Process().memory_info().rss
    evaluation = evaluate(tasks.task(), agent, config=config, sandbox=sandbox)
    grown = psutil.Process().memory_info().rss - before
    assert evaluation.agent_output.startswith("HEAD") and evaluation.agent_output.endswith("TAIL")
    assert "bytes truncated ...]" in evaluation.agent_output
    assert grown < 50 * 1024 * 1024, f"service grew {grown / 2**20:.0f} MiB during a 200 MB flood"


# The tests' script marks its start in the repository and gives a live escapee 2 s to answer (it
# would break calc.py and say so) before it imports calc.py: the escapee acts on that event, not
# after a sleep, so a slow machine cannot make it tamper before the agent's end (CI did, once).
ESCAPEE_TEST = Exec(
    "#!/bin/bash\ntouch tests-started\n"
    "for _ in $(seq 40); do [ -e tampered ] && break; sleep 0.05; done\n"
    "python3 -c 'from calc import add; assert add(2, 3) == 5, add(2, 3)' && echo add-ok\n"
)


def test_setsid_escapee_and_term_ignorer_are_killed_before_the_tests(tasks, e2e_config, sandbox):
    escapee = "until [ -e tests-started ]; do sleep 0.05; done; echo tamper > calc.py; touch tampered"
    agent = (
        "import subprocess\n"
        f"subprocess.Popen(['setsid', 'bash', '-c', 'trap \"\" TERM; {escapee}'])\n"
        "subprocess.Popen(['bash', '-c', 'trap \"\" TERM; sleep 300 & disown; sleep 300'], start_new_session=True)\n"
        "open('calc.py', 'w').write('def add(a, b):\\n    return a + b\\n')\n"
    )
    evaluation = evaluate(
        tasks.task(tests={"fail_to_pass_add.sh": ESCAPEE_TEST}), agent, config=e2e_config, sandbox=sandbox
    )
    assert evaluation.passed, (evaluation.error, evaluation.test_output)


def test_cancel_during_the_agent_kills_it_fast(tasks, e2e_config, sandbox):
    """The cancel kills the agent where it sleeps: its processes are gone long before it would wake."""
    cancel = CancelState()
    url = tasks.task()
    holder = {}
    marker = f"te-cancel-test-{uuid.uuid4()}"  # the agent's argv, so that this test finds its own
    agent = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}])\n"

    def sleeping_agent() -> str | None:
        """The evaluation id in the environment of the agent's own process, once it runs: found in
        /proc, not the database (the in-memory test database locks whole tables between threads, and
        the pipeline's own writes would fail on this thread's reads)."""
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if marker in (proc.info["cmdline"] or ()):
                    eval_id = proc.environ().get(TAG_VAR)
                    if eval_id and tagged(eval_id):
                        return eval_id
        return None

    def cancel_when_running():
        try:
            eval_id = wait_for(sleeping_agent, 60, what="the agent to start")
        except AssertionError as e:
            holder["agent seen"] = str(e)
            return
        cancel.set(Stop.CANCELLED, "cancelled by DELETE")  # what the row watcher does on a DELETE
        # The agent would sleep till its timeout (60 s, e2e_config) ends it: gone within 30 s is the kill.
        with contextlib.suppress(AssertionError):  # still alive: said below, in the test's thread
            wait_for(lambda: not tagged(eval_id), 30, what="the agent's processes to go")
        holder["alive after the cancel"] = [describe(proc.pid) for proc in tagged(eval_id)]

    thread = threading.Thread(target=cancel_when_running)
    thread.start()
    evaluation = evaluate(url, agent, config=e2e_config, sandbox=sandbox, cancel=cancel)
    thread.join()
    assert holder == {"alive after the cancel": []}
    assert (evaluation.status, evaluation.error) == ("cancelled", "running_agent: cancelled by DELETE")
    assert evaluation.error_kind == "cancelled"


def describe(pid: int) -> str:
    """What a process that outlived its kill is: enough to tell a frozen cgroup from an escapee."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return (
                f"pid {pid} ppid {proc.ppid()} status {proc.status()} uids {tuple(proc.uids())} "
                f"cgroup {Path(f'/proc/{pid}/cgroup').read_text().split()} cmdline {proc.cmdline()}"
            )
    except (psutil.Error, OSError) as e:
        return f"pid {pid}: {e}"


def test_bad_archive_fails_the_download_step(tasks, e2e_config, sandbox, tmp_path):
    (tasks.www / "junk.tar.gz").write_bytes(b"this is not an archive")
    evaluation = evaluate(f"{tasks.base_url}/junk.tar.gz", SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed"
    assert evaluation.error == "downloading_task: task archive is not a .tar.gz, .tar or .zip file"
    assert evaluation.error_kind == "task_invalid"


def test_missing_workspace_key_is_named(tasks, e2e_config, sandbox):
    url = tasks.task(workspace="repo: https://example.com/x.git\n")
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.status == "failed" and "base_commit" in evaluation.error
    assert evaluation.error.startswith("downloading_task: workspace.yaml")
    assert evaluation.error_kind == "task_invalid"


def test_settings_are_untouched(settings_snapshot=None):
    # The e2e config is a copy; the process-wide one keeps its defaults.
    assert settings.EXECUTOR.max_processes == 512


def test_a_same_size_edit_right_after_install_imported_the_module_is_what_the_tests_run(tasks, e2e_config, sandbox):
    # The install step imports calc (a .pyc would be written); the fix keeps the file's size.
    url = tasks.task(install=["python3 -c 'import calc'"])
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox=sandbox)
    assert evaluation.passed, evaluation.test_output


@pytest.mark.skipif(not __import__("shutil").which("node"), reason="node is not installed on this host")
def test_node_agent(tasks, e2e_config, sandbox):
    agent = (
        "const fs = require('fs');\n"
        "if (process.argv[2] !== '--instruction') process.exit(9);\n"
        "fs.writeFileSync('calc.py', fs.readFileSync('calc.py', 'utf8').replace('a - b', 'a + b'));\n"
    )
    evaluation = evaluate(tasks.task(), agent, language="node", config=e2e_config, sandbox=sandbox)
    assert evaluation.passed, (evaluation.error, evaluation.agent_output)
