"""The agent's failure stays the agent's (issue 23, item 3): whatever it leaves behind where the
executor writes or reads after it ran (the support files, HOME, the venv, /tmp, the tests'
folder, its output), the evaluation is never ``infrastructure``, the kind platforms retry.

Each test plants as a hostile agent would, through a real evaluation under both runtimes, and
checks the error_kind and that the error (when there is one) says what happened.
"""

from __future__ import annotations

import json

import pytest
import yaml

from evaluations import agents, lifecycle
from evaluations.models import ErrorKind, Evaluation, Status
from tests.helpers.archives import archive_bytes
from tests.helpers.runtimes import run_evaluation
from tests.helpers.tasks import ADD_TEST, BUGGY, FIXED, SOLVER
from tests.security.support import evaluate, still_works

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Support files the executor writes into repo/ after the agent, and a test that needs each.
SUPPORT = {
    "fail_to_pass_add.sh": ADD_TEST,
    "data/expected.txt": "5\n",
    "more/deep/value.txt": "deep\n",
    "fifo.txt": "not a fifo\n",
    "check_support.sh": (
        "grep -qx 5 data/expected.txt && grep -qx deep more/deep/value.txt && grep -qx 'not a fifo' fifo.txt\n"
    ),
}


def test_the_agent_plants_a_folder_a_link_and_a_fifo_where_support_files_go(tasks, e2e_config, sandbox, canary):
    # Was: `running_tests: could not write test support files: ...` as infrastructure.
    agent = SOLVER + (
        "import os\n"
        "os.makedirs('data/expected.txt/inside')\n"  # a folder at the file's name, with content
        "open('data/expected.txt/inside/x', 'w').write('x')\n"
        "os.chmod('data/expected.txt/inside', 0)\n"  # and a folder in it no one may list
        f"os.symlink('{canary}', 'more')\n"  # a link where a parent folder goes
        "os.mkfifo('fifo.txt')\n"  # a FIFO: opening it to read would block forever
    )
    evaluation = evaluate(tasks.task(tests=SUPPORT), agent, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.error_kind) == ("completed", True, None), (
        evaluation.error,
        evaluation.test_output,
    )
    assert sorted(p.name for p in canary.iterdir()) == ["file"]  # nothing written through the link
    still_works(tasks, e2e_config, sandbox)


def test_a_file_where_a_support_files_folder_goes(tasks, e2e_config, sandbox):
    agent = (
        SOLVER
        + "open('more', 'w').write('in the way')\nimport os\nos.makedirs('data')\nos.symlink('/', 'data/expected.txt')\n"
    )
    evaluation = evaluate(tasks.task(tests=SUPPORT), agent, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.error_kind) == ("completed", True, None), (
        evaluation.error,
        evaluation.test_output,
    )


NODE_SOLVER = (
    "const fs = require('fs');\n"
    "fs.writeFileSync('calc.py', fs.readFileSync('calc.py', 'utf8').replace('a - b', 'a + b'));\n"
)

# HOME, the venv and /tmp are put back for the tests; what the agent made there must not stop it.
MESS = (
    "import os\n"
    "for top in [os.environ['HOME'], os.environ['TMPDIR'], os.environ.get('VIRTUAL_ENV', os.environ['HOME'])]:\n"
    "    os.makedirs(top + '/locked/inner')\n"
    "    open(top + '/locked/inner/f', 'w').write('x')\n"
    "    os.chmod(top + '/locked/inner', 0)\n"
    "    os.chmod(top + '/locked', 0)\n"
    "    os.mkfifo(top + '/fifo')\n"
    "    os.symlink('/etc', top + '/etc-link')\n"
    "    os.symlink(top + '/loop', top + '/loop')\n"
    "    fd = os.open(top, os.O_RDONLY)\n"
    "    for _ in range(3000):\n"  # deeper than PATH_MAX
    "        os.mkdir('d' * 100, dir_fd=fd)\n"
    "        child = os.open('d' * 100, os.O_RDONLY, dir_fd=fd)\n"
    "        os.close(fd)\n"
    "        fd = child\n"
    "    os.close(fd)\n"
    "    os.chmod(top, 0)\n"  # the folder itself, the agent's own: unlistable
)


def test_the_agent_leaves_home_the_venv_and_tmp_unremovable(tasks, e2e_config, sandbox):
    evaluation = evaluate(tasks.task(), SOLVER + MESS, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.error_kind) == ("completed", True, None), (
        evaluation.error,
        evaluation.agent_output,
    )
    still_works(tasks, e2e_config, sandbox)


def test_the_agent_makes_the_repository_unreadable(tasks, e2e_config, sandbox):
    # The repository is the agent's: a test that cannot read it fails, and that is the agent's doing.
    agent = SOLVER + "import os\nos.chmod('.', 0)\n"
    evaluation = evaluate(tasks.task(tests=SUPPORT), agent, config=e2e_config, sandbox=sandbox)
    assert evaluation.error_kind in (None, ErrorKind.TESTS_FAILED), (evaluation.error_kind, evaluation.error)
    still_works(tasks, e2e_config, sandbox)


def test_nul_bytes_in_the_agents_and_the_tests_output(tasks, e2e_config, sandbox):
    # PostgreSQL refuses NUL in text: the agent's output, a test's output and the live log carry it.
    agent = SOLVER + (
        "import sys\n"
        "sys.stdout.write('before\\0after\\n')\n"
        "open('nul.txt', 'wb').write(b'a\\0b\\n')\n"
        "open('late.txt', 'wb').write(b'x' * 9000 + b'\\0late\\n')\n"  # git looks at 8000 bytes: a text diff
    )
    tests = {"fail_to_pass_add.sh": ADD_TEST, "check_nul.sh": "cat nul.txt\n"}
    evaluation = evaluate(tasks.task(tests=tests), agent, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.error_kind) == ("completed", True, None), evaluation.error
    assert "before\ufffdafter" in evaluation.agent_output
    assert "a\ufffdb" in evaluation.test_results.get(name="check_nul").output
    assert "\0" not in evaluation.log and "before\ufffdafter" in evaluation.log
    assert "\ufffdlate" in evaluation.agent_patch and "\0" not in evaluation.agent_patch


def test_an_agent_projects_install_plants_a_link_where_a_static_asset_goes(tasks, e2e_config, sandbox, canary):
    # The agent's install runs before running_agent copies the assets into the repository: a
    # link it left at an asset's save_path failed that copy, as infrastructure. Its install now
    # writes only its own folders (under the sandbox); without one, the repository is the task's
    # then and the collision is task_invalid.
    repo_url, shas = tasks.repo([{"calc.py": BUGGY}, {"calc.py": FIXED}])
    workspace = {
        "repo": repo_url,
        "base_commit": shas[0],
        "static_assets": {"expected": {"path": "fixtures/expected.txt", "save_path": "fx/expected.txt"}},
    }
    url = tasks.task(workspace=yaml.safe_dump(workspace), extra={"fixtures/expected.txt": "42\n"})
    package = {
        "name": "agent",
        "version": "1.0.0",
        "scripts": {"postinstall": f'ln -s {canary} "$PWD/../../repo/fx" && echo PLANTED || echo could not plant'},
    }
    project = {"package.json": json.dumps(package), "index.js": NODE_SOLVER}
    fields = agents.model_fields({"agent_archive": archive_bytes(project, "tar.gz"), "agent_entrypoint": ""})
    evaluation = Evaluation.objects.create(task_url=url, language="node", **fields)
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(str(evaluation.id), e2e_config, sandbox)
    evaluation.refresh_from_db()
    assert evaluation.error_kind != ErrorKind.INFRASTRUCTURE, evaluation.error
    if sandbox == "bwrap":
        assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.log)
    else:
        assert evaluation.error_kind in (None, ErrorKind.TASK_INVALID), evaluation.error
    assert sorted(p.name for p in canary.iterdir()) == ["file"]
