"""The agent against the file system, under both runtimes: the service's secrets, other
sessions, everything outside its workspace, and every path the executor writes later."""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path

import pytest

from evaluations.pipeline.session import Session
from evaluations.runtime import uids
from evaluations.safefs import remove_tree_nofollow
from tests.helpers.tasks import ADD_TEST, NOOP, SOLVER
from tests.security.support import assert_executor_entries_intact, evaluate, kept_session, still_works

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Python that tries each path of PATHS (a JSON list in the env) and prints what it got.
PROBE = """
import json, os
for path in json.loads(os.environ['PATHS']):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            print('LISTED', path, sorted(os.listdir(path)))
        else:
            with open(path, 'rb') as f:
                print('READ', path, f.read(4096))
    except OSError as exc:
        print('DENIED', path, exc.errno)
"""


def test_the_database_secret_key_and_data_dir_are_out_of_reach(tasks, e2e_config, sandbox):
    data_dir = e2e_config.data_dir
    token = uuid.uuid4().hex
    planted = data_dir / f"te-canary-{token[:8]}"
    planted.write_text(token)
    os.chmod(planted, 0o644)  # readable by anyone who can reach the folder
    try:
        paths = [str(data_dir), str(data_dir / "secret_key"), str(data_dir / "executor.sqlite3"), str(planted)]
        evaluation = evaluate(tasks.task(), PROBE, config=e2e_config, sandbox=sandbox, env={"PATHS": json.dumps(paths)})
    finally:
        planted.unlink()
    out = evaluation.agent_output
    assert "READ" not in out and "LISTED" not in out, out
    assert token not in out and (data_dir / "secret_key").read_text().strip() not in out
    assert out.count("DENIED") == len(paths)
    still_works(tasks, e2e_config, sandbox)


def test_the_service_environment_and_proc_1_environ(tasks, e2e_config, sandbox, monkeypatch):
    token = uuid.uuid4().hex
    monkeypatch.setenv("TE_SERVICE_SECRET", token)  # in the service's (this process's) environment
    agent = (
        "import os\n"
        "print('OWN', 'TE_SERVICE_SECRET' in os.environ)\n"
        "for pid in ['1', str(os.getppid())] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if b'TE_SERVICE_SECRET' in data:\n"
        "        print('LEAK', pid, data)\n"
    )
    evaluation = evaluate(tasks.task(), agent, config=e2e_config, sandbox=sandbox)
    assert "OWN False" in evaluation.agent_output
    assert "LEAK" not in evaluation.agent_output and token not in evaluation.agent_output
    still_works(tasks, e2e_config, sandbox)


def test_another_sessions_folder(tasks, e2e_config, sandbox):
    """A victim session (its own uid, as a concurrent evaluation has) with a secret everywhere."""
    token = uuid.uuid4().hex
    config = e2e_config
    with uids.acquire(config.sandbox_uid, config.sandbox_uid_count, uids.lock_dir(config.data_dir)) as lease:
        victim = Session.create(config.workspace_base, str(uuid.uuid4()), lease.uid)
        secrets = [victim.repo / "secret.py", victim.home / ".secret", victim.tmp / "secret", victim.agent / "agent.py"]
        victim.tests.mkdir(mode=0o755)
        secrets.append(victim.tests / "0000-hidden.sh")
        for path in secrets:
            path.write_text(token)
            os.chmod(path, 0o644)
        for path in secrets[:3]:
            os.chown(path, lease.uid, lease.uid)
        readable = [str(victim.root), *(str(p.parent) for p in secrets), *(str(p) for p in secrets)]
        writes = [str(victim.repo / "planted"), str(victim.home / "planted"), str(victim.tmp / "planted")]
        agent = PROBE + (
            "for path in json.loads(os.environ['WRITES']):\n"
            "    try:\n"
            "        open(path, 'w').write('x'); print('WROTE', path)\n"
            "    except OSError as exc:\n"
            "        print('DENIED', path, exc.errno)\n"
        )
        env = {"PATHS": json.dumps(readable), "WRITES": json.dumps(writes)}
        try:
            evaluation = evaluate(tasks.task(), agent, config=config, sandbox=sandbox, env=env)
            assert not any(Path(p).exists() for p in writes)
            assert all(p.read_text() == token for p in secrets)
        finally:
            victim.remove()
    out = evaluation.agent_output
    assert token not in out and "WROTE" not in out and "LISTED" not in out and "READ" not in out, out
    still_works(tasks, e2e_config, sandbox)


def test_writing_outside_the_workspace(tasks, e2e_config, sandbox, canary):
    token = uuid.uuid4().hex[:10]
    config = e2e_config
    targets = [
        f"/etc/te-{token}",
        f"/usr/lib/te-{token}",
        f"/root/te-{token}",
        str(Path(__file__).resolve().parents[2] / f"te-{token}"),  # the service's code
        str(config.data_dir / f"te-{token}"),
        str(config.workspace_base / f"te-{token}"),  # beside the sessions
        str(canary / f"te-{token}"),
        str(canary / "file"),
    ]
    agent = (
        "import json, os, sys\n"
        "session = os.path.dirname(os.environ['REPO_DIR'])\n"
        "targets = json.loads(os.environ['TARGETS']) + [\n"
        f"    session + '/te-{token}', session + '/tests', os.environ['TASK_PROMPT'], sys.argv[0]]\n"
        "for path in targets:\n"
        "    try:\n"
        "        with open(path, 'a') as f:\n"
        "            f.write('owned')\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print('DENIED', path, exc.errno)\n"
        f"open('/tmp/te-scratch-{token}', 'w').write('scratch is fine')\n" + SOLVER
    )
    kept = dataclasses.replace(config, keep_workspaces=True)
    evaluation = evaluate(tasks.task(), agent, config=kept, sandbox=sandbox, env={"TARGETS": json.dumps(targets)})
    session = kept_session(kept, evaluation)
    try:
        # Under bwrap some paths are writable inside the sandbox yet lead into its own /tmp
        # (the mount points of its binds): what matters is what appeared on the host.
        assert not any(Path(t).exists() for t in targets[:-1]) and (canary / "file").read_text() == "canary\n"
        assert not (session / f"te-{token}").exists()
        assert_executor_entries_intact(session, agent)
    finally:
        remove_tree_nofollow(session)
    lines = evaluation.agent_output.splitlines()
    assert sum(line.startswith(("WROTE", "DENIED")) for line in lines) == len(targets) + 4
    assert not Path(f"/tmp/te-scratch-{token}").exists(), "a file left in the host's /tmp outlived the evaluation"
    assert evaluation.passed, evaluation.error
    still_works(tasks, e2e_config, sandbox)


SUPPORT = {
    "fail_to_pass_add.sh": ADD_TEST,
    "data/expected.txt": "5\n",
    "check_data.sh": "grep -qx 5 data/expected.txt\n",
}


def test_link_planted_at_a_support_file(tasks, e2e_config, sandbox, canary):
    # The executor writes data/expected.txt into repo/ after the agent: it must replace the
    # link, not write through it into the canary.
    agent = (
        SOLVER + f"import os\nos.makedirs('data', exist_ok=True)\nos.symlink('{canary}/file', 'data/expected.txt')\n"
    )
    evaluation = evaluate(tasks.task(tests=SUPPORT), agent, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert (canary / "file").read_text() == "canary\n"
    still_works(tasks, e2e_config, sandbox)


def test_link_planted_at_a_support_files_folder(tasks, e2e_config, sandbox, canary):
    agent = SOLVER + f"import os\nos.symlink('{canary}', 'data')\n"
    evaluation = evaluate(tasks.task(tests=SUPPORT), agent, config=e2e_config, sandbox=sandbox)
    # The link is replaced by a real folder holding the task's file (tests/security/test_blame.py).
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert sorted(p.name for p in canary.iterdir()) == ["file"]
    still_works(tasks, e2e_config, sandbox)


def test_links_planted_where_the_test_scripts_and_prompt_go(tasks, e2e_config, sandbox, canary):
    # tests/, the scripts in it, agent/ and the prompt are root's: nothing can be planted there.
    agent = (
        "import os\n"
        "session = os.path.dirname(os.environ['REPO_DIR'])\n"
        "for link in [session + '/tests', session + '/tests/0000-fail_to_pass_add.sh',\n"
        "             os.environ['TASK_PROMPT'], session + '/agent/agent.py', session + '/saved']:\n"
        "    try:\n"
        "        if os.path.lexists(link):\n"
        "            os.replace(link, link + '.old')\n"
        f"        os.symlink('{canary}/file', link)\n"
        "        print('PLANTED', link)\n"
        "    except OSError as exc:\n"
        "        print('DENIED', link, exc.errno)\n" + SOLVER
    )
    kept = dataclasses.replace(e2e_config, keep_workspaces=True)
    evaluation = evaluate(tasks.task(), agent, config=kept, sandbox=sandbox)
    try:
        assert_executor_entries_intact(kept_session(kept, evaluation), agent)
    finally:
        remove_tree_nofollow(kept_session(kept, evaluation))
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    assert (canary / "file").read_text() == "canary\n"
    if sandbox == "none":  # under bwrap these paths lead into the sandbox's own /tmp
        assert "PLANTED" not in evaluation.agent_output and evaluation.agent_output.count("DENIED") == 5
    still_works(tasks, e2e_config, sandbox)


HOME_TEST = (
    "#!/bin/bash\n"
    "test \"$(cat ~/.config/installed)\" = by-install || { echo 'install HOME lost'; exit 1; }\n"
    "test ! -e ~/agent-was-here || { echo 'agent HOME leaked into the tests'; exit 1; }\n"
    "python3 -c 'from calc import add; assert add(2, 3) == 5'\n"
)


def test_home_is_given_back_as_the_install_step_left_it(tasks, e2e_config, sandbox, canary):
    # The agent sees (a copy of) what install put in HOME, and plants links there; the tests
    # get the install step's HOME back, and removing the agent's links follows none of them.
    agent = (
        "import os\n"
        "home = os.environ['HOME']\n"
        "print('SEES', open(home + '/.config/installed').read())\n"
        "open(home + '/agent-was-here', 'w').write('x')\n"
        f"os.symlink('{canary}', home + '/link-to-canary')\n"
        "os.replace(home + '/.config', home + '/.config-moved')\n"
        f"os.symlink('{canary}', home + '/.config')\n" + SOLVER
    )
    url = tasks.task(
        install=["mkdir -p ~/.config && echo by-install > ~/.config/installed"], tests={"home.sh": HOME_TEST}
    )
    evaluation = evaluate(url, agent, config=e2e_config, sandbox=sandbox)
    assert "SEES by-install" in evaluation.agent_output, evaluation.agent_output
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert sorted(p.name for p in canary.iterdir()) == ["file"] and (canary / "file").read_text() == "canary\n"
    still_works(tasks, e2e_config, sandbox)


# Hooks that would make every Python test pass: exit status 0 whatever happened.
FAKE_PASS = "import atexit, os\natexit.register(os._exit, 0)\n"


def test_python_hooks_planted_in_home_do_not_fake_the_results(tasks, e2e_config, sandbox):
    agent = (
        "import os, site, subprocess, sys\n"
        "user_site = site.getusersitepackages()\n"
        "os.makedirs(user_site, exist_ok=True)\n"
        f"open(user_site + '/usercustomize.py', 'w').write({FAKE_PASS!r})\n"
        "open(user_site + '/zz-fake.pth', 'w').write('import atexit, os; atexit.register(os._exit, 0)\\n')\n"
        "home = os.environ['HOME']\n"
        "open(home + '/.gitconfig', 'w').write('[core]\\n\\tfsmonitor = true\\n')\n"
        "for rc in ('.bashrc', '.bash_profile', '.profile', '.bash_logout'):\n"
        "    open(f'{home}/{rc}', 'w').write('exit 0\\n')\n"
        # The hook works where it was planted: a failing assert exits 0 in the agent's HOME.
        "print('HOOKED', subprocess.run([sys.executable, '-c', 'assert False']).returncode)\n"
    )
    evaluation = evaluate(tasks.task(), agent, config=e2e_config, sandbox=sandbox)
    assert "HOOKED 0" in evaluation.agent_output, evaluation.agent_output
    assert (evaluation.status, evaluation.passed) == ("failed", False), evaluation.test_output
    assert evaluation.error == "running_tests: 1 of 1 tests failed (fail_to_pass_add)"
    still_works(tasks, e2e_config, sandbox)


def test_shims_in_the_repository_and_home_do_not_fake_the_results(tasks, e2e_config, sandbox):
    # Tests run with a fixed PATH no repository or home folder is on, from repo/ with
    # `python3 -c`, which does not import sitecustomize/usercustomize from the working folder.
    shim = "#!/bin/sh\\necho add-ok\\nexit 0\\n"
    agent = (
        "import os\n"
        "home = os.environ['HOME']\n"
        "for folder in ['.', 'bin', '.venv/bin', 'node_modules/.bin', home + '/.local/bin', home + '/bin']:\n"
        "    os.makedirs(folder, exist_ok=True)\n"
        "    for name in ('bash', 'sh', 'python3', 'python', 'env', 'test', '['):\n"
        f"        path = os.path.join(folder, name); open(path, 'w').write('{shim}'); os.chmod(path, 0o755)\n"
        f"for name in ('sitecustomize.py', 'usercustomize.py'):\n"
        f"    open(name, 'w').write({FAKE_PASS!r})\n"
    )
    evaluation = evaluate(tasks.task(), agent, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("failed", False), evaluation.test_output
    assert "add-ok" not in evaluation.test_output
    still_works(tasks, e2e_config, sandbox)


def test_git_hooks_and_config_do_not_run_when_the_patch_is_made(tasks, e2e_config, sandbox):
    agent = SOLVER + (
        "import os, stat\n"
        "repo = os.environ['REPO_DIR']\n"
        "hook = repo + '/.git/evil.sh'\n"
        "marker = f'#!/bin/sh\\ntouch {repo}/.hook-ran\\nexit 0\\n'\n"
        "open(hook, 'w').write(marker); os.chmod(hook, 0o755)\n"
        "os.makedirs('.git/hooks', exist_ok=True)\n"
        "for name in ('pre-commit', 'post-checkout', 'post-index-change', 'pre-auto-gc', 'reference-transaction',\n"
        "             'fsmonitor-watchman', 'post-rewrite', 'pre-push'):\n"
        "    open('.git/hooks/' + name, 'w').write(marker); os.chmod('.git/hooks/' + name, 0o755)\n"
        "config = f'[core]\\n\\tfsmonitor = {hook}\\n\\thooksPath = .git/hooks\\n\\tpager = {hook}\\n'\n"
        "config += f'[diff]\\n\\texternal = {hook}\\n[filter \"x\"]\\n\\tclean = {hook}\\n\\tsmudge = {hook}\\n'\n"
        "open('.git/config', 'a').write(config)\n"
        "open(os.environ['HOME'] + '/.gitconfig', 'w').write(config)\n"
        "open('.gitattributes', 'w').write('* filter=x diff=x\\n')\n"
    )
    hook_test = "#!/bin/bash\ntest ! -e .hook-ran || { echo 'a planted git hook ran'; exit 1; }\n"
    url = tasks.task(tests={"fail_to_pass_add.sh": ADD_TEST, "no_hook.sh": hook_test})
    evaluation = evaluate(url, agent, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert "+    return a + b" in evaluation.agent_patch, evaluation.agent_patch
    still_works(tasks, e2e_config, sandbox)


def test_files_the_agent_leaves_in_tmp_are_gone_before_the_tests(tasks, e2e_config, sandbox):
    token = uuid.uuid4().hex[:10]
    agent = SOLVER + (
        "import os\n"
        f"open('/tmp/te-planted-{token}', 'w').write('x')\n"
        f"open('/dev/shm/te-planted-{token}', 'w').write('x')\n"
        f"open(os.environ['TMPDIR'] + '/te-planted-{token}', 'w').write('x')\n"
    )
    test = (
        f'#!/bin/bash\nfor f in /tmp/te-planted-{token} /dev/shm/te-planted-{token} "$TMPDIR/te-planted-{token}"; do\n'
        '  [ -e "$f" ] && { echo "left for the tests: $f"; exit 1; }\ndone\n'
        "python3 -c 'from calc import add; assert add(2, 3) == 5'\n"
    )
    evaluation = evaluate(tasks.task(tests={"clean_tmp.sh": test}), agent, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert not Path(f"/tmp/te-planted-{token}").exists() and not Path(f"/dev/shm/te-planted-{token}").exists()
    still_works(tasks, e2e_config, sandbox)


def test_a_noop_agent_still_fails_after_all_this(tasks, e2e_config, sandbox):
    """The control: the hooks above fail the tests because the tests are honest, not broken."""
    evaluation = evaluate(tasks.task(), NOOP, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("failed", False)
    still_works(tasks, e2e_config, sandbox)
