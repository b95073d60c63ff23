"""Static assets through whole evaluations (SPEC section 6): real repositories, archives served on
127.0.0.1, real commands, with and without bubblewrap."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from assets import resolve
from evaluations import lifecycle
from evaluations.models import Evaluation, Status
from evaluations.runtime.killer import tagged
from tests.helpers.archives import Exec, write_archive
from tests.helpers.runtimes import run_evaluation
from tests.helpers.service import PROJECT
from tests.helpers.tasks import ADD_TEST, BUGGY, FIXED, SOLVER

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def static_root():
    """STATIC_ASSETS_ROOT, where the sandbox uid can read it (pytest's tmp_path is root-only)."""
    root = Path(tempfile.mkdtemp(prefix="te-assets-", dir="/tmp"))
    os.chmod(root, 0o755)
    (root / "corpora" / "en").mkdir(parents=True)
    (root / "corpora" / "en" / "words.txt").write_text("alpha\nbeta\n")
    (root / "override").mkdir()
    (root / "override" / "expected.txt").write_text("99\n")
    (root / "escape").symlink_to("/etc/hostname")
    for path in root.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def config(e2e_config, static_root):
    """The executor group: a corpus folder at data/corpus."""
    executor = resolve({"corpus": {"path": "corpora/en", "save_path": "data/corpus"}}, static_root,
                       base_label="STATIC_ASSETS_ROOT", origin="executor")  # fmt: skip
    return dataclasses.replace(e2e_config, static_assets_root=static_root, static_assets=tuple(executor.values()))


def asset_task(tasks, *, yaml="", tests=None, checks=None, files=None) -> str:
    """A calc task whose workspace.yaml ends with ``yaml`` and whose archive holds ``fixtures/expected.txt``."""
    repo_url, shas = tasks.repo([{"calc.py": BUGGY}, {"calc.py": FIXED}])
    archive = {
        "workspace.yaml": f"repo: {repo_url}\nbase_commit: {shas[0]}\n{yaml}",
        "prompt.md": "Make add() add.\n",
        "fixtures/expected.txt": "42\n",
        **{f"tests/{name}": body for name, body in (tests or {"fail_to_pass_add.sh": ADD_TEST}).items()},
        **(files or {}),
    }
    if checks is not None:
        archive["checks.txt"] = checks
    name = f"task-{uuid.uuid4().hex[:8]}.tar.gz"
    write_archive(tasks.www / name, archive, "tar.gz", top="task")
    return f"{tasks.base_url}/{name}"


def evaluate(task_url, agent_code, *, config, sandbox, static_assets=None):
    """Run one evaluation in this process; the row is made as the API stores it."""
    evaluation = Evaluation.objects.create(
        task_url=task_url, agent_code=agent_code, language="python", static_assets=static_assets
    )
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(str(evaluation.id), config, sandbox)
    evaluation.refresh_from_db()
    assert not tagged(str(evaluation.id)), "a process of the evaluation outlived it"
    assert not (config.workspace_base / str(evaluation.id)).exists()
    return evaluation


TASK_ASSETS = "static_assets:\n  expected: {path: fixtures/expected.txt}\n  fixtures: {path: fixtures, save_path: fx}\n"
READ_ASSETS = Exec(
    "#!/bin/bash\nset -e\n"
    "echo corpus={{static:corpus}} expected={{static:expected}} dir=$STATIC_ASSETS_DIR\n"
    "grep -qx alpha {{static:corpus}}/words.txt\n"
    'test "$(cat {{static:expected}})" = 42\n'
    'test "$(cat {{static:fixtures}}/expected.txt)" = 42\n'
    'test "$STATIC_ASSET_CORPUS" = {{static:corpus}} && test "$STATIC_ASSET_EXPECTED" = {{static:expected}}\n'
    'test "$CORPUS" = {{static:corpus}}\n'
    "test -f $STATIC_ASSETS_DIR/data/corpus/words.txt && test -f $STATIC_ASSETS_DIR/fixtures/expected.txt\n"
    "if touch {{static:corpus}}/new 2>/dev/null; then echo corpus-writable; exit 5; fi\n"
    "if (echo 1 >{{static:expected}}) 2>/dev/null; then echo expected-writable; exit 6; fi\n"
    "echo read-ok\n"
)


def test_commands_read_assets_through_their_placeholders(tasks, config, sandbox):
    url = asset_task(
        tasks,
        yaml=TASK_ASSETS
        + "env:\n  CORPUS: '{{static:corpus}}'\ninstall:\n  - 'grep -q beta {{static:corpus}}/words.txt'\n",
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_assets.sh": READ_ASSETS},
        checks="test $(cat {{static:expected}}) = 42 && echo check-ok\n",
    )
    evaluation = evaluate(url, SOLVER, config=config, sandbox=sandbox)
    assert (evaluation.status, evaluation.error) == ("completed", ""), evaluation.test_output
    assert [(r.name, r.passed) for r in evaluation.test_results.all()] == [
        ("fail_to_pass_add", True),
        ("pass_to_pass_assets", True),
        ("check_1", True),
    ]
    assert "read-ok" in evaluation.test_output and "check-ok" in evaluation.test_output
    if sandbox == "bwrap":
        assert (
            "corpus=/static/data/corpus expected=/static/fixtures/expected.txt dir=/static\n" in evaluation.test_output
        )
    else:
        session = config.workspace_base / str(evaluation.id)
        expected = f"corpus={config.static_assets_root}/corpora/en expected={session}/static/fixtures/expected.txt "
        assert expected in evaluation.test_output, evaluation.test_output


def test_a_submission_overrides_a_task_asset(tasks, config, sandbox):
    check = Exec('#!/bin/bash\necho "expected=$(cat {{static:expected}})"\ntest "$(cat {{static:expected}})" = 99\n')
    url = asset_task(
        tasks, yaml=TASK_ASSETS, tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_override.sh": check}
    )
    submitted = {"expected": {"path": "override/expected.txt", "save_path": "fixtures/expected.txt"}}
    evaluation = evaluate(url, SOLVER, config=config, sandbox=sandbox, static_assets=submitted)
    assert evaluation.status == "completed", (evaluation.error, evaluation.test_output)
    assert "expected=99" in evaluation.test_output


AGENT = (
    "import pathlib, subprocess\n"
    "words = pathlib.Path('data/corpus/words.txt')\n"
    "print('agent read', words.read_text().split())\n"
    "words.write_text(words.read_text() + 'changed by the agent\\n')\n"
    "pathlib.Path('data/corpus/notes.txt').write_text('mine\\n')\n"
    "print('fixture', pathlib.Path('fixtures/expected.txt').read_text().strip())\n"
    "calc = pathlib.Path('calc.py'); calc.write_text(calc.read_text().replace('a - b', 'a + b'))\n"
)


def test_the_agent_gets_its_own_copy_and_the_patch_leaves_assets_out(tasks, config, sandbox):
    pristine = Exec(
        "#!/bin/bash\nset -e\ntest $(wc -l < {{static:corpus}}/words.txt) = 2\ntest ! -e {{static:corpus}}/notes.txt\n"
    )
    url = asset_task(
        tasks, yaml=TASK_ASSETS, tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_pristine.sh": pristine}
    )
    evaluation = evaluate(url, AGENT, config=config, sandbox=sandbox)
    assert "agent read ['alpha', 'beta']" in evaluation.agent_output, evaluation.agent_output
    assert "fixture 42" in evaluation.agent_output and evaluation.agent_exit_code == 0
    assert evaluation.status == "completed", (evaluation.error, evaluation.test_output)
    assert "+    return a + b" in evaluation.agent_patch
    assert "data/corpus" not in evaluation.agent_patch and "fixtures/" not in evaluation.agent_patch
    assert "changed by the agent" not in evaluation.agent_patch


def test_a_task_asset_escaping_the_task_folder_fails_the_evaluation(tasks, config):
    url = asset_task(tasks, yaml="static_assets:\n  leak: {path: ../../../etc/hostname}\n")
    evaluation = evaluate(url, SOLVER, config=config, sandbox="none")
    assert (evaluation.status, evaluation.error) == (
        "failed",
        "downloading_task: static asset 'leak': 'path' must not contain a '..' component, got '../../../etc/hostname'",
    )
    assert evaluation.test_results.count() == 0


def test_a_submission_asset_linking_out_of_the_root_fails_the_evaluation(tasks, config):
    evaluation = evaluate(asset_task(tasks), SOLVER, config=config, sandbox="none",
                          static_assets={"leak": {"path": "escape"}})  # fmt: skip
    assert (evaluation.status, evaluation.error) == (
        "failed",
        "downloading_task: static asset 'leak': 'path' 'escape' resolves outside STATIC_ASSETS_ROOT through a symbolic link",
    )


def test_a_task_asset_taking_the_executor_assets_place_fails(tasks, config):
    url = asset_task(tasks, yaml="static_assets:\n  mine: {path: fixtures, save_path: data/corpus}\n")
    evaluation = evaluate(url, SOLVER, config=config, sandbox="none")
    assert (
        evaluation.error == "downloading_task: static assets 'corpus' and 'mine' have the same save_path 'data/corpus'"
    )


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ({"yaml": "install:\n  - 'cat {{static:nope}}'\n"}, "installing_deps: unknown static asset placeholder: nope"),
        ({"yaml": "env:\n  X: '{{static:}}'\n"}, "installing_deps: unknown static asset placeholder: {{static:}} has an empty name"),
        ({"tests": {"a.sh": "cat {{static:corpus}}/words.txt\n", "b.sh": "cat {{static:Corpus}}\n"}},
         "running_tests: unknown static asset placeholder: Corpus"),
        ({"checks": "cat {{static:typo}}\n"}, "running_tests: unknown static asset placeholder: typo"),
    ],
)  # fmt: skip
def test_an_unknown_placeholder_fails_the_step_that_met_it(tasks, config, where, error):
    evaluation = evaluate(asset_task(tasks, **where), SOLVER, config=config, sandbox="none")
    assert (evaluation.status, evaluation.error) == ("failed", error)
    assert evaluation.test_results.count() == 0  # no test ran: every placeholder is checked first


def _build_example(name: str, tasks) -> str:
    """Build examples/<name> into the served folder with examples/build.py; return its archive URL."""
    spec = importlib.util.spec_from_file_location("examples_build", Path(PROJECT) / "examples" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built = module.build(name, tasks.base_url, tasks.www)
    return f"{tasks.base_url}/{built['archive'].name}"


def test_the_lookup_example_reads_its_task_asset(tasks, e2e_config, sandbox):
    url = _build_example("lookup", tasks)
    solver = (Path(PROJECT) / "examples" / "lookup" / "solve_agent.py").read_text()
    evaluation = evaluate(url, solver, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert "word list copy: 6 lines" in evaluation.agent_output
    assert [r.name for r in evaluation.test_results.all()] == ["fail_to_pass_load", "pass_to_pass_contains", "check_1"]
    assert "lookup.py" in evaluation.agent_patch and "words.txt" not in evaluation.agent_patch
    noop = (Path(PROJECT) / "examples" / "lookup" / "noop_agent.py").read_text()
    failed = evaluate(url, noop, config=e2e_config, sandbox=sandbox)
    assert failed.error == "running_tests: 1 of 3 tests failed (fail_to_pass_load)"


def test_an_executor_asset_gone_since_start_fails_the_evaluation(tasks, config, static_root):
    shutil.rmtree(static_root / "corpora")
    evaluation = evaluate(asset_task(tasks), SOLVER, config=config, sandbox="none")
    assert evaluation.error == (
        "downloading_task: static asset 'corpus': 'path' 'corpora/en' does not exist in STATIC_ASSETS_ROOT"
    )


def test_an_asset_that_cannot_be_placed_in_the_repository_fails_the_agent_step(tasks, config):
    url = asset_task(tasks, yaml="static_assets:\n  odd: {path: fixtures/expected.txt, save_path: calc.py/expected}\n")
    evaluation = evaluate(url, SOLVER, config=config, sandbox="none")
    assert (evaluation.status, evaluation.error) == (
        "failed",
        "running_agent: static asset 'odd': cannot copy it to 'calc.py/expected': calc.py is a file",
    )
    assert evaluation.agent_output == ""  # the agent never ran
