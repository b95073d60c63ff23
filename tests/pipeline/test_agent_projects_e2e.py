"""Agent projects (SPEC §14) through the real pipeline: an archive extracted into agent/code,
its requirements.txt or package.json installed from the real registries into agent/env in the
step installing_agent, the agent run with its own interpreter, its packages unseen by the tests."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from evaluations import agents, lifecycle
from evaluations.models import Evaluation, Status
from evaluations.runtime.killer import tagged
from tests.helpers.archives import Exec, archive_bytes
from tests.helpers.runtimes import REGISTRIES, run_evaluation
from tests.helpers.tasks import ADD_TEST

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = ["queued", "downloading_task", "preparing_environment", "cloning_repo", "installing_deps", "installing_agent", "running_agent",
         "running_tests", "cleanup", "done"]  # fmt: skip

# The agent's package must not be importable by the tests: they run with the task's venv only.
NOT_VISIBLE = Exec(
    "#!/bin/bash\nif python3 -c 'import tomli_w' 2>/dev/null; then exit 1; fi\necho agent-package-hidden\n"
)

PYTHON_PROJECT = {
    "agent.py": "import argparse\nimport fixer\n\np = argparse.ArgumentParser()\np.add_argument('--instruction')\n"
    "fixer.fix(p.parse_args().instruction)\n",
    "fixer.py": "import pathlib\nimport sys\n\nimport tomli_w\n\n\ndef fix(instruction):\n"
    "    f = pathlib.Path('calc.py')\n    f.write_text(f.read_text().replace('a - b', 'a + b'))\n"
    "    print(tomli_w.dumps({'fixed': instruction.splitlines()[0]}), end='')\n"
    "    print('interpreter', sys.prefix)\n",
    "requirements.txt": "tomli-w==1.0.0\n",
}

NODE_PROJECT = {
    "package.json": json.dumps({"name": "agent", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}}),
    "index.js": "const fs = require('fs');\nconst isNumber = require('is-number');\nconst fix = require('./lib/fix');\n"
    "if (!isNumber(5) || isNumber('x')) process.exit(7);\nfix('calc.py');\nconsole.log('node agent: is-number ok');\n",
    "lib/fix.js": "const fs = require('fs');\nmodule.exports = (p) => "
    "fs.writeFileSync(p, fs.readFileSync(p, 'utf8').replace('a - b', 'a + b'));\n",
}


@pytest.fixture
def config(e2e_config):
    """The registries allowed through the egress proxy (the default rules refuse their address here)."""
    return dataclasses.replace(e2e_config, install_timeout_secs=300, egress_allow=REGISTRIES)


def evaluate_project(task_url, data: bytes, *, config, sandbox, language="python", entrypoint=""):
    fields = agents.model_fields({"agent_archive": data, "agent_entrypoint": entrypoint})
    evaluation = Evaluation.objects.create(task_url=task_url, language=language, **fields)
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(str(evaluation.id), config, sandbox)
    evaluation.refresh_from_db()
    assert not tagged(str(evaluation.id)), "a process of the evaluation outlived it"
    assert not (config.workspace_base / str(evaluation.id)).exists()
    return evaluation


def test_a_python_project_with_a_helper_module_and_a_pypi_package_solves_the_task(tasks, config, sandbox):
    url = tasks.task(tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_hidden.sh": NOT_VISIBLE})
    data = archive_bytes(PYTHON_PROJECT, "zip", top="my-agent")
    evaluation = evaluate_project(url, data, config=config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed, evaluation.error) == ("completed", True, ""), (
        evaluation.error + evaluation.log[-3000:]
    )
    assert 'fixed = "Make add() add."' in evaluation.agent_output  # tomli_w, from the agent's own venv
    assert f"interpreter {config.workspace_base / str(evaluation.id) / 'agent' / 'env'}" in evaluation.agent_output
    assert "agent-package-hidden" in evaluation.test_output
    assert [t.step for t in evaluation.transitions.all()] == STEPS
    assert evaluation.agent_sha256 == hashlib.sha256(data).hexdigest()


def test_a_node_project_with_a_package_json_dependency_solves_the_task(tasks, config, sandbox):
    url = tasks.task()
    data = archive_bytes(NODE_PROJECT)
    evaluation = evaluate_project(url, data, config=config, sandbox=sandbox, language="node")
    assert (evaluation.status, evaluation.passed, evaluation.error) == ("completed", True, ""), (
        evaluation.error + evaluation.log[-3000:]
    )
    assert "node agent: is-number ok" in evaluation.agent_output
    assert evaluation.agent_sha256 == hashlib.sha256(data).hexdigest()


def test_a_project_without_dependencies_and_a_named_entry_point(tasks, config, sandbox):
    solver = '#!/bin/bash\n[ "$1" = --instruction ] || exit 9\nsource "$(dirname "$0")/lib.sh"\nfix\n'
    files = {"bin/run.sh": Exec(solver), "bin/lib.sh": "fix() { sed -i 's/a - b/a + b/' calc.py; }\n"}
    evaluation = evaluate_project(
        tasks.task(), archive_bytes(files), config=config, sandbox=sandbox, language="bash", entrypoint="bin/run.sh"
    )
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    assert [t.step for t in evaluation.transitions.all()] == STEPS


def test_a_requirement_that_does_not_exist_fails_the_agent_install(tasks, config, sandbox):
    files = {**PYTHON_PROJECT, "requirements.txt": "te17-no-such-package-anywhere==1.0\n"}
    evaluation = evaluate_project(tasks.task(), archive_bytes(files), config=config, sandbox=sandbox)
    assert evaluation.status == "failed" and evaluation.passed is False
    assert evaluation.error.startswith("installing_agent: pip install -r requirements.txt exited with code 1: ")
    assert "te17-no-such-package-anywhere" in evaluation.error.splitlines()[-1]
    assert evaluation.agent_output == "" and evaluation.test_results.count() == 0
    assert evaluation.error_kind == "agent_invalid"
