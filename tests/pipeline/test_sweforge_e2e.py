"""SWE-Forge task folders through the whole pipeline (SPEC §19): no tests/ and no prompt.md, the tests and
the prompt in workspace.yaml, the reference patch beside them and never within the agent's reach; a task's
language choosing where its commands run (LANGUAGE_ENVIRONMENTS, else the host's toolchain)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid

import pytest

from evaluations.importers.verify import gold_agent
from evaluations.runtime.sandbox import SYSTEM_PATH
from tests.helpers.archives import write_archive
from tests.helpers.gitrepos import git
from tests.helpers.runtimes import runtime_named
from tests.helpers.tasks import BUGGY, FIXED
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MARKER = "FORGE-FIX-5d41402a"  # only in the fix commit, hence in the patch: the agent must never find it
ADD_WORKS = "python3 -c 'from calc import add; assert add(2, 3) == 5, add(2, 3)'"
NOOP = "#!/bin/bash\necho doing nothing\n"


def forge_task(tasks, *, language: str = "python", fail_to_pass: list[str] | None = None,
               pass_to_pass: list[str] | None = None) -> tuple[str, str]:  # fmt: skip
    """(the task URL, its patch): a SWE-Forge folder as the upstream executor writes it."""
    fixed = FIXED + f"# {MARKER}\n"
    repo_url, shas = tasks.repo([{"calc.py": BUGGY}, {"calc.py": fixed}])
    work = tasks.www.parent / "work" / repo_url.rsplit("/", 1)[-1].removesuffix(".git")
    patch = git(work, "diff", shas[0], shas[1]) + "\n"
    workspace = {
        "repo": repo_url,
        "base_commit": shas[0],
        "language": language,
        "fail_to_pass": fail_to_pass or [ADD_WORKS],
        "pass_to_pass": pass_to_pass or ["test -f calc.py", "test -f $HOME/installed.txt"],
        "install_config": {"install": "echo ok > $HOME/installed.txt", "python": "3.11"},
        "difficulty": "medium",
        "difficulty_score": 2,
        "prompt": "Make add() add.\n",
        "patch": patch,
    }
    name = f"forge-{uuid.uuid4().hex[:8]}.tar.gz"
    write_archive(tasks.www / name, {"workspace.yaml": json.dumps(workspace, indent=1)}, top="task")
    return f"{tasks.base_url}/{name}", patch


def test_a_swe_forge_task_passes_with_its_patch_and_fails_without(tasks, e2e_config, sandbox):
    url, patch = forge_task(tasks)
    solved = evaluate(url, gold_agent("forge", patch), language="bash", config=e2e_config, sandbox=sandbox)
    assert (solved.status, solved.passed, solved.error) == ("completed", True, ""), (solved.error, solved.log[-3000:])
    results = list(solved.test_results.values_list("name", "kind", "passed"))
    assert results == [
        ("fail_to_pass_1", "fail_to_pass", True),
        ("pass_to_pass_1", "pass_to_pass", True),
        ("pass_to_pass_2", "pass_to_pass", True),  # install_config's install ran, its HOME given to the tests
    ]
    assert solved.task_prompt == "Make add() add.\n"
    assert solved.task_format == "workspace"
    assert solved.task_metadata == {
        "difficulty": "medium",
        "difficulty_score": 2,
        "install_config": {"install": "echo ok > $HOME/installed.txt", "python": "3.11"},
    }
    assert MARKER in solved.agent_patch  # what the agent did, as any agent patch

    failed = evaluate(url, NOOP, language="bash", config=e2e_config, sandbox=sandbox)
    assert (failed.status, failed.passed, failed.error_kind) == ("failed", False, "tests_failed")
    assert failed.error == "running_tests: 1 of 3 tests failed (fail_to_pass_1)"


def test_the_agent_can_neither_read_nor_be_told_the_patch(tasks, e2e_config, sandbox):
    url, _patch = forge_task(tasks)
    snoop = f"""#!/bin/bash
session=$(dirname "$REPO_DIR")
echo "prompt: $2"
ls -la "$session" "$session/task" 2>&1 | sed 's/^/ls: /'
for file in "$session"/task/*/workspace.yaml "$session"/task/workspace.yaml; do
    cat "$file" 2>/dev/null && echo "READ $file"
done
marker={MARKER[:10]}; marker="${{marker}}{MARKER[10:]}"  # not written whole: this script is in the session too
echo "$marker" > "$HOME/control.txt"  # what the search finds when it can read a file
grep -rIl "$marker" "$REPO_DIR" "$HOME" "${{TMPDIR:-/tmp}}" "$session" 2>/dev/null | sort -u | sed "s/^/SAW /"
git -C "$REPO_DIR" log --all --format=%H%n%B 2>/dev/null | grep -q "$marker" && echo "SAW it in git"
sed -i 's/a - b/a + b/' calc.py
"""
    evaluation = evaluate(url, snoop, language="bash", config=e2e_config, sandbox=sandbox)
    output = evaluation.agent_output
    assert "prompt: Make add() add." in output, output
    assert "READ /" not in output, output
    assert [line for line in output.splitlines() if "SAW" in line or MARKER in line] == [
        f"SAW {e2e_config.workspace_base}/{evaluation.id}/home/control.txt"
    ], output
    assert MARKER not in evaluation.task_prompt and MARKER not in json.dumps(evaluation.task_metadata)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.log[-3000:])


def test_a_javascript_task_runs_with_the_hosts_node(tasks, e2e_config, sandbox):
    if shutil.which("node", path=runtime_named(sandbox).command_path()) is None:
        pytest.skip("this host has no node on the commands' PATH (.ci/run installs npm, which brings it)")
    check = (
        "node -e \"const s = require('fs').readFileSync('calc.py', 'utf8'); process.exit(s.includes('a + b') ? 0 : 1)\""
    )
    url, patch = forge_task(tasks, language="javascript", fail_to_pass=[check], pass_to_pass=["node --version"])
    solved = evaluate(url, gold_agent("js", patch), language="bash", config=e2e_config, sandbox=sandbox)
    assert (solved.status, solved.passed) == ("completed", True), (solved.error, solved.test_output[-2000:])
    assert solved.environment["kind"] == "host"
    failed = evaluate(url, NOOP, language="bash", config=e2e_config, sandbox=sandbox)
    assert failed.error == "running_tests: 1 of 2 tests failed (fail_to_pass_1)"


def test_a_language_without_a_toolchain_fails_at_downloading_task_naming_it(tasks, e2e_config):
    path = runtime_named("none").command_path()
    if shutil.which("cargo", path=path) is not None:
        pytest.skip("this host has cargo on the commands' PATH: a rust task runs here")
    url, patch = forge_task(tasks, language="rust")
    evaluation = evaluate(url, gold_agent("rust", patch), language="bash", config=e2e_config, sandbox="none")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "infrastructure")
    assert evaluation.error == (
        "downloading_task: the task's language is rust and this executor has no toolchain for it: "
        f"LANGUAGE_ENVIRONMENTS maps no environment to rust, and the host has no cargo on the commands' PATH ({path})"
    )
    assert [t.step for t in evaluation.transitions.all()] == ["queued", "downloading_task", "cleanup", "done"]
    assert evaluation.task_metadata["difficulty"] == "medium"  # recorded before the check


def test_a_go_task_runs_in_the_environment_its_language_is_mapped_to(tasks, e2e_config, debian_environment):
    assert shutil.which("tree", path=SYSTEM_PATH) is None, "the host must lack the environment's tool"
    config = dataclasses.replace(
        e2e_config,
        environments_root=debian_environment.root.parent,
        language_environments=(("go", debian_environment.name),),
    )
    url, patch = forge_task(tasks, language="go", pass_to_pass=["tree -L 1 . | grep -q calc.py"])
    solved = evaluate(url, gold_agent("go", patch), language="bash", config=config, sandbox="bwrap")
    assert (solved.status, solved.passed) == ("completed", True), (solved.error, solved.test_output[-2000:])
    assert solved.environment == {"kind": "name", "ref": debian_environment.name, "digest": None, "cached": True}
