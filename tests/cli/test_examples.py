"""Every example task, through `manage.py evaluate`: its solving agent passes, its non-solving one fails."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers.runtimes import REGISTRIES
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow

EXAMPLES = sorted(p.parent.parent.name for p in (PROJECT / "examples").glob("*/task/workspace.yaml"))
AGENT_EXTENSIONS = (".py", ".sh", ".js")
ENVIRONMENTS = {  # example -> the environment its workspace.yaml names (the debian_environment fixture's)
    name: yaml.safe_load((PROJECT / "examples" / name / "task" / "workspace.yaml").read_text()).get("environment")
    for name in EXAMPLES
}


def agent(name: str, kind: str):
    (found,) = [p for p in (PROJECT / "examples" / name).glob(f"{kind}_agent.*") if p.suffix in AGENT_EXTENSIONS]
    return found


def test_there_are_examples_of_each_kind():
    assert {"calc", "textkit", "settingsfile", "layout"} <= set(EXAMPLES)
    assert ENVIRONMENTS["layout"] == "tools"
    swe_tests = [p.name for p in (PROJECT / "examples" / "textkit" / "task" / "tests").glob("*.sh")]
    assert len([n for n in swe_tests if n.startswith("fail_to_pass_")]) >= 2
    assert len([n for n in swe_tests if n.startswith("pass_to_pass_")]) >= 2


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_solving_agent_passes_and_the_non_solving_one_fails(name, cli, built_examples, request):
    if ENVIRONMENTS[name]:
        environment = request.getfixturevalue("debian_environment")
        assert ENVIRONMENTS[name] == environment.name
        cli.env["ENVIRONMENTS_ROOT"] = str(environment.root.parent)
    # Examples that install from PyPI reach it through the egress proxy: allowed by name, as the
    # registries resolve to a TEST-NET address here that the default rules refuse.
    cli.env["EGRESS_ALLOW"] = ",".join(REGISTRIES)
    folder, archive = built_examples["dir"] / f"{name}-task", built_examples["dir"] / f"{name}-task.tar.gz"
    solved = cli.evaluate(str(folder), str(agent(name, "solve")))
    assert solved.returncode == 0, solved.stdout + solved.stderr
    assert "PASSED:" in solved.stdout
    unsolved = cli.evaluate(str(archive), str(agent(name, "noop")))
    assert unsolved.returncode == 1, unsolved.stdout + unsolved.stderr
    assert "FAILED: running_tests:" in unsolved.stdout
