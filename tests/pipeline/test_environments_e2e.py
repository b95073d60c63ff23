"""Tasks that run in an environment of their own (SPEC §11): a root filesystem made by make_environment.

The environment (tests/conftest.py ``debian_environment``) is Debian bookworm with python3, pip,
git and ``tree``, which the host lacks: a task's command that finds ``tree`` ran in it.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from tests.helpers.runtimes import REGISTRIES
from tests.helpers.tasks import ADD_TEST, SOLVER
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Run inside the environment: its tool, its Python (3.11.2 from Debian, whatever the host has),
# the venv made from it, and a package pip fetched from the real PyPI through the host's CA.
IN_THE_ENVIRONMENT = """\
set -e
tree -L 1 . | grep -q calc.py
python3 - <<'PY'
import os, sys, six
assert sys.base_prefix == "/usr", sys.base_prefix
assert sys.prefix == os.environ["VIRTUAL_ENV"], (sys.prefix, os.environ["VIRTUAL_ENV"])
assert six.__file__.startswith(sys.prefix + "/lib/"), six.__file__
print("environment python", sys.version.split()[0])
PY
"""


@pytest.fixture
def config(e2e_config, debian_environment):
    return dataclasses.replace(
        e2e_config,
        environments_root=debian_environment.root.parent,
        install_timeout_secs=300,
        egress_allow=REGISTRIES,  # PyPI, through the proxy: the relay is the host's socat, bound in
    )


def test_the_tasks_commands_run_in_the_environment_it_names(tasks, config, debian_environment):
    assert shutil.which("tree") is None, "the host must lack the environment's tool for this test to mean anything"
    url = tasks.task(
        environment=debian_environment.name,
        install=["pip install six", "tree --version"],
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_environment.sh": IN_THE_ENVIRONMENT},
    )
    evaluation = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert "environment python 3.11" in evaluation.test_output
    assert "+    return a + b" in evaluation.agent_patch  # the executor's own git work ran on the host's tools


def test_an_unknown_environment_fails_the_environment_step(tasks, config, sandbox, debian_environment):
    evaluation = evaluate(tasks.task(environment="nope"), SOLVER, config=config, sandbox=sandbox)
    assert evaluation.status == "failed"
    assert (
        evaluation.error == f"preparing_environment: unknown environment: nope (available: {debian_environment.name})"
    )
    assert evaluation.error_kind == "task_invalid"
    assert [t.step for t in evaluation.transitions.all()][-3:] == ["preparing_environment", "cleanup", "done"]


def test_an_agent_interpreter_missing_from_the_environment_is_named(tasks, config, debian_environment):
    if debian_environment.node is not None:
        pytest.skip("the environment has node")
    url = tasks.task(environment=debian_environment.name)
    evaluation = evaluate(url, "console.log('hi')", language="node", config=config, sandbox="bwrap")
    assert evaluation.status == "failed"
    assert evaluation.error == (
        f"preparing_environment: environment {debian_environment.name} has no node (the node agent's interpreter)"
    )


def test_an_environment_without_the_sandbox_is_refused(tasks, config, debian_environment):
    evaluation = evaluate(tasks.task(environment=debian_environment.name), SOLVER, config=config, sandbox="none")
    assert evaluation.status == "failed"
    assert evaluation.error == (
        f"preparing_environment: environment {debian_environment.name} needs the sandbox, and this executor runs without one"
    )
