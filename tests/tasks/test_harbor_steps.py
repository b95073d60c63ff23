"""A Harbor task's [[steps]] read into TaskSpec.steps (SPEC §23), as Harbor 0.25's StepConfig and TaskPaths
read them; each bad value one TaskError naming the step (its number and name) and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import AGENT, VERIFIER, Collect, ImageEnvironment, NetworkRequest, SupportFile, TaskError
from tests.tasks.test_workspace import make_task

TOML = """\
multi_step_reward_strategy = "final"

[agent]
timeout_sec = 300

[verifier]
timeout_sec = 90

[verifier.env]
MODE = "strict"
LEVEL = "1"

[environment]
network_mode = "no-network"

[[steps]]
name = "write"
min_reward = 1
colour = "blue"

[steps.agent]
timeout_sec = 30
network_mode = "public"

[[steps]]
name = "check"
min_reward = { reward = 0.5, style = 1 }

[steps.verifier]
timeout_sec = 45
network_mode = "allowlist"
allowed_hosts = ["PyPI.org"]

[steps.verifier.env]
LEVEL = "2"
"""


def task(tmp_path: Path, toml: str = TOML, **extra: str | bytes | None) -> Path:
    files = {
        "task.toml": toml,
        "environment/Dockerfile": "FROM debian:bookworm\n",
        "tests/test.sh": "#!/bin/bash\necho shared\n",
        "tests/helper.py": "print('shared')\n",
        "steps/write/instruction.md": "Write 1 to /app/a.\n",
        "steps/write/solution/solve.sh": "#!/bin/bash\necho 1 > /app/a\n",
        "steps/write/solution/data.txt": "x\n",
        "steps/check/instruction.md": "Write 2 to /app/b.\n",
        "steps/check/tests/test.sh": "#!/bin/bash\necho own\n",
        "steps/check/tests/helper.py": "print('own')\n",
        "solution/solve.sh": "#!/bin/bash\necho shared solution\n",
    }
    files.update(extra)
    kept = {path: text for path, text in files.items() if text is not None}
    return make_task(tmp_path / "steps-task", kept, executable=tuple(p for p in kept if p.endswith(".sh")))


def error(root: Path) -> str:
    with pytest.raises(TaskError) as info:
        load_task(root)
    return str(info.value)


def test_each_step_has_its_prompt_tests_solution_timeouts_env_and_network(tmp_path):
    spec = load_task(task(tmp_path))
    assert spec.format == "harbor" and spec.reward_strategy == "final"
    write, check = spec.steps
    assert (write.name, write.prompt, check.name, check.prompt) == (
        "write", "Write 1 to /app/a.\n", "check", "Write 2 to /app/b.\n")  # fmt: skip
    assert spec.prompt == write.prompt and spec.verifier == write.verifier  # what the task shows: its first step
    # /tests: tests/, then the step's tests/ over it; the script the step's, else the task's
    assert write.verifier.files == [
        SupportFile("helper.py", b"print('shared')\n", 0o644), SupportFile("test.sh", b"#!/bin/bash\necho shared\n", 0o755)]  # fmt: skip
    assert check.verifier.files == [
        SupportFile("helper.py", b"print('own')\n", 0o644), SupportFile("test.sh", b"#!/bin/bash\necho own\n", 0o755)]  # fmt: skip
    assert write.verifier.script == check.verifier.script == "test.sh"
    assert write.verifier.env == {"MODE": "strict", "LEVEL": "1"}
    assert check.verifier.env == {"MODE": "strict", "LEVEL": "2"}
    # Timeouts: the step's agent's, else [agent]'s; the step's verifier's, else Harbor's default 600 s.
    assert (write.request.agent_timeout_secs, write.request.verifier_timeout_secs) == (30.0, 600.0)
    assert (check.request.agent_timeout_secs, check.request.verifier_timeout_secs) == (300.0, 45.0)
    assert write.request.phase_network(AGENT) == NetworkRequest("public")
    assert write.request.phase_network(VERIFIER) == NetworkRequest("no-network")
    assert check.request.phase_network(AGENT) == NetworkRequest("no-network")
    assert check.request.phase_network(VERIFIER) == NetworkRequest("allowlist", ("pypi.org",))
    assert (write.min_reward, check.min_reward) == (1.0, {"reward": 0.5, "style": 1.0})
    # The step's own solution/, else the task's.
    assert write.solution == "#!/bin/bash\necho 1 > /app/a\n"
    assert [f.relpath for f in write.solution_files] == ["data.txt", "solve.sh"]
    assert check.solution == "#!/bin/bash\necho shared solution\n"
    assert spec.metadata["steps"] == [{"colour": "blue"}, {}]  # a step's keys not read are kept


def test_a_task_of_steps_needs_no_instruction_md_nor_shared_tests(tmp_path):
    root = task(tmp_path, '[[steps]]\nname = "check"\n', **{"tests/test.sh": None, "tests/helper.py": None})
    spec = load_task(root)
    assert [step.name for step in spec.steps] == ["check"] and spec.reward_strategy == "mean"
    assert spec.steps[0].min_reward is None
    assert spec.steps[0].request.verifier_timeout_secs == 600.0


def test_a_single_step_task_is_as_before(tmp_path):
    root = task(tmp_path, "steps = []\n", **{"instruction.md": "Do it.\n"})
    spec = load_task(root)
    assert spec.steps == () and spec.prompt == "Do it.\n"


STEP = '[[steps]]\nname = "write"\n'


@pytest.mark.parametrize(
    ("toml", "files", "message"),
    [
        (
            'multi_step_reward_strategy = "max"\n' + STEP,
            {},
            "task.toml: multi_step_reward_strategy must be mean or final, got 'max'",
        ),
        ("steps = [1]\n", {}, "task.toml: [[steps]] must be an array of tables, got a list"),
        ("steps = 3\n", {}, "task.toml: [[steps]] must be an array of tables, got a number"),
        (
            "[[steps]]\nmin_reward = 1\n",
            {},
            "task.toml: [[steps]] #1: [steps] name is required (the step's folder under steps/)",
        ),
        ("[[steps]]\nname = 7\n", {}, "task.toml: [[steps]] #1: [steps] name must be a string, got a number"),
        (
            '[[steps]]\nname = "a/b"\n',
            {},
            "task.toml: [[steps]] #1 ('a/b'): [steps] name 'a/b' is not a portable folder name (no path separators, "
            "control or reserved characters, device names or trailing dots and spaces; at most 255 bytes)",
        ),
        (
            '[[steps]]\nname = ".."\n',
            {},
            "task.toml: [[steps]] #1 ('..'): [steps] name '..' is not a portable folder "
            "name (no path separators, control or reserved characters, device names or trailing dots and spaces; at "
            "most 255 bytes)",
        ),
        (
            STEP + '[[steps]]\nname = "Write"\n',
            {"steps/Write/instruction.md": "x\n"},
            "task.toml: [[steps]] #2 ('Write'): name is another step's too (names are compared case- and form-blind, "
            "as Harbor does)",
        ),
        (
            STEP + '[[steps]]\nname = "gone"\n',
            {},
            "task.toml: [[steps]] #2 ('gone'): name: there is no steps/gone/ "
            "folder (its instruction.md, tests/ and solution/)",
        ),
        (
            STEP + "[steps.agent]\ntimeout_sec = -1\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.agent] timeout_sec must be a positive number, got -1",
        ),
        (
            STEP + '[steps.verifier]\ntimeout_sec = "1"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier] timeout_sec must be a positive number, got a string",
        ),
        (
            STEP + '[steps.agent]\nnetwork_mode = "open"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.agent] network_mode must be one of no-network, public, "
            "allowlist, got 'open'",
        ),
        (
            STEP + '[steps.verifier]\nallowed_hosts = ["a.org"]\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier] allowed_hosts goes with network_mode = 'allowlist', "
            "and [steps.verifier] sets no network_mode (without one the phase has [environment]'s network)",
        ),
        (
            STEP + '[steps.verifier.env]\nKEY = "${KEY}"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier.env] KEY takes its value from the host's environment "
            "(${KEY}); this executor passes nothing of its own environment to a task",
        ),
        (
            STEP + 'min_reward = "1"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] min_reward must be a number, got a string",
        ),
        (
            STEP + "min_reward = nan\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] min_reward must be a finite number, got nan",
        ),
        (
            STEP + "min_reward = {}\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] min_reward is an empty table: give a number, or thresholds by reward key",
        ),
        (
            STEP + "min_reward = { style = true }\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] min_reward.style must be a number, got a boolean",
        ),
        (
            STEP + '[steps.agent]\nuser = "dev"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.agent] user = 'dev': a step's agent user other than the task's "
            "(the image's User) is not supported here: the agent's user is the evaluation's uid in the image's id "
            "map, fixed when the root is mounted before the first step",
        ),
        (
            '[agent]\nuser = "dev"\n' + STEP + "[steps.agent]\nuser = 0\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.agent] user = '0': a step's agent user other than the task's "
            "([agent] user 'dev') is not supported here: the agent's user is the evaluation's uid in the image's id "
            "map, fixed when the root is mounted before the first step",
        ),
        (
            STEP + "[steps.verifier]\nuser = 70000\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier] user must be a uid from 0 to 65535, got 70000",
        ),
        (
            STEP + '[steps.verifier]\nuser = "a b"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier] user must be a user name or uid, optionally ':group' "
            "(as Docker's --user), got 'a b'",
        ),
        (
            STEP + "[steps.verifier]\nuser = true\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier] user must be a user name or a uid, got a boolean",
        ),
        (
            STEP + '[steps.healthcheck]\ncommand = " "\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.healthcheck] command must be a non-empty command (a string "
            "run with bash -c)",
        ),
        (
            STEP + '[steps.healthcheck]\ncommand = "true"\nretries = 1.5\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.healthcheck] retries must be a positive whole number, got 1.5",
        ),
        (
            STEP + '[steps.healthcheck]\ncommand = "true"\nstart_period_sec = -1\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.healthcheck] start_period_sec must be a number of seconds, "
            "0 or more, got -1",
        ),
        (
            STEP + "healthcheck = 1\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.healthcheck] must be a table, got a number",
        ),
        (
            STEP + 'artifacts = "/app/out"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] artifacts must be a list of paths or {source, destination} "
            "tables, got a string",
        ),
        (
            STEP + 'artifacts = ["/app/../etc"]\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] artifacts[0] source must not contain '..' components, "
            "got '/app/../etc'",
        ),
        (
            STEP + 'artifacts = [{ source = "/app/x", destination = "/abs" }]\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] artifacts[0] destination must be a relative path, got '/abs'",
        ),
        (
            STEP + 'artifacts = ["/logs/verifier/x"]\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps] artifacts[0] source '/logs/verifier/x' is the verifier's own "
            "folder, not the agent's",
        ),
        (
            STEP + '[steps.verifier]\nenvironment_mode = "apart"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier] environment_mode must be 'shared' or 'separate', "
            "got 'apart'",
        ),
        (
            STEP + '[steps.verifier]\nenvironment_mode = "shared"\n[steps.verifier.environment]\ndocker_image = "x"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier] environment_mode = 'shared' goes with no "
            "[steps.verifier.environment] (the verifier runs in the agent's environment); remove the table or set "
            "environment_mode = 'separate'",
        ),
        (
            STEP + '[steps.verifier]\nenvironment_mode = "separate"\n',
            {"steps/write/tests/docker-compose.yaml": "services: {}\n"},
            "task.toml: [[steps]] #1 ('write'): steps/write/tests/docker-compose.yaml: a verifier of several compose "
            "services is not supported here",
        ),
        (
            STEP + "[steps.verifier.environment]\nos = 'windows'\n",
            {},
            "task.toml: [[steps]] #1 ('write'): [steps.verifier.environment] os = 'windows': Windows tasks cannot run "
            "here (Linux only)",
        ),
        (
            '[verifier]\nenvironment_mode = "separate"\n' + STEP,
            {"tests/docker-compose.yaml": "services: {}\n"},
            "tests/docker-compose.yaml: a verifier of several compose services is not supported here",
        ),
        (
            STEP + '[[steps.verifier.collect]]\nservice = "main"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [[steps.verifier.collect]] 1: 'command' must be a shell command (a "
            "non-empty string)",
        ),
        (
            STEP + '[[steps.verifier.collect]]\ncommand = "true"\nservice = "db"\n',
            {},
            "task.toml: [[steps]] #1 ('write'): [[steps.verifier.collect]] 1: 'service' 'db' is not a service of "
            "environment/docker-compose.yaml (main)",
        ),
        (
            STEP,
            {"steps/write/instruction.md": None},
            "task.toml: [[steps]] #1 ('write'): task has no steps/write/instruction.md (required)",
        ),
        (
            STEP,
            {"tests/test.sh": None},
            "task.toml: [[steps]] #1 ('write'): the step has no test script: neither "
            "steps/write/tests/test.sh nor tests/test.sh exists",
        ),
        (
            STEP,
            {"steps/write/solution/solve.sh": None},
            "task.toml: [[steps]] #1 ('write'): task has no steps/write/solution/solve.sh (required)",
        ),
        (
            STEP,
            {"steps/write/tests/helper.py/x": "x\n"},
            "task.toml: [[steps]] #1 ('write'): steps/write/tests/"
            "helper.py/x and tests/helper.py: a file where the other has a folder",
        ),
        (
            '[verifier]\ngrader = "pytest"\n' + STEP,
            {},
            "task.toml: [verifier] grader = 'pytest' with [[steps]]: a step is graded by its reward file",
        ),
        (
            "[verifier]\nisolated = true\n" + STEP,
            {},
            "task.toml: [verifier] isolated = true with [[steps]]: every step's verifier shares the environment",
        ),
    ],
)
def test_a_bad_step_is_named_by_its_number_name_and_key(tmp_path, toml, files, message):
    assert error(task(tmp_path, toml, **files)) == message


def test_steps_are_bounded(tmp_path):
    toml = "".join(f'[[steps]]\nname = "s{n}"\n' for n in range(101))
    assert error(task(tmp_path, toml)) == "task.toml: [[steps]] has 101 steps, over the 100 this executor runs"


def test_a_task_with_steps_but_no_steps_folder_is_refused(tmp_path):
    root = make_task(
        tmp_path / "t", {"task.toml": STEP, "environment/Dockerfile": "FROM x\n", "tests/test.sh": "true\n"}
    )
    assert error(root) == "task.toml has [[steps]] but the task has no steps/ folder (steps/<name>/instruction.md)"


def test_a_steps_own_user_healthcheck_artifacts_and_workdir(tmp_path):
    """[steps.verifier] user over [verifier] user; [steps.agent] user the task's own is no change; a step's
    healthcheck with Harbor's defaults; its artifacts read as the top-level ones; steps/<name>/workdir/'s files."""
    toml = (
        'artifacts = ["/app/all.log"]\n[agent]\nuser = "dev"\n[verifier]\nuser = "root"\n'
        '[[steps]]\nname = "write"\nartifacts = ["/app/out", { source = "/app/x", destination = "x.txt" }, '
        '"/logs/artifacts/seen"]\n[steps.agent]\nuser = "dev"\n[steps.verifier]\nuser = 1000\n'
        '[steps.healthcheck]\ncommand = "test -e ready"\nstart_period_sec = 2\n'
        '[[steps]]\nname = "check"\n'
    )
    root = task(
        tmp_path,
        toml,
        **{"steps/write/workdir/setup.sh": "touch ready\n", "steps/write/workdir/data/in.txt": "in\n"},
    )
    spec = load_task(root)
    write, check = spec.steps
    assert (write.request.agent_user, write.request.verifier_user) == ("dev", "1000")
    assert (check.request.agent_user, check.request.verifier_user) == ("dev", "root")  # the task's
    assert write.healthcheck.command == "test -e ready" and write.healthcheck.start_period_sec == 2.0
    assert (write.healthcheck.interval_sec, write.healthcheck.retries) == (5.0, 3)  # Harbor's defaults
    assert check.healthcheck is None and check.artifacts == () and check.workdir_files == []
    # /logs/artifacts/... with no destination: collected with /logs/artifacts already, as at the top level
    assert [(a.source, a.listed) for a in write.artifacts] == [
        ("/app/out", "artifacts/app/out"), ("/app/x", "artifacts/x.txt")]  # fmt: skip
    assert [a.source for a in spec.artifacts] == ["/app/all.log"]  # the task's stay the task's
    assert [(f.relpath, f.data) for f in write.workdir_files] == [
        ("data/in.txt", b"in\n"), ("setup.sh", b"touch ready\n")]  # fmt: skip
    assert write.setup and not check.setup


def test_collect_hooks_the_tasks_and_each_steps_own(tmp_path):
    """Harbor's ``_collect_hooks_for``: the task's [[verifier.collect]] for every step, a step's own after them."""
    toml = (
        '[[verifier.collect]]\ncommand = "echo task"\n'
        '[[steps]]\nname = "write"\n[[steps.verifier.collect]]\ncommand = "echo write"\ntimeout_sec = 5\nuser = 0\n'
        '[[steps]]\nname = "check"\n'
    )
    spec = load_task(task(tmp_path, toml))
    write, check = spec.steps
    assert spec.collect == (Collect(command="echo task", service="main", timeout_secs=60.0),)
    assert write.collect == (Collect(command="echo write", service="main", timeout_secs=5.0, user="0"),)
    assert check.collect == ()


SEPARATE_STEPS = (
    '[environment]\nworkdir = "/app"\nmemory_mb = 2048\n[environment.env]\nA = "1"\n'
    '[[steps]]\nname = "write"\n'
    '[[steps]]\nname = "check"\n[steps.verifier.environment]\ndocker_image = "grader:1"\nworkdir = "/grade"\n'
    'memory_mb = 512\nhealthcheck = { command = "true" }\n[steps.verifier.environment.env]\nB = "2"\n'
    '[[steps]]\nname = "third"\n[steps.verifier]\nenvironment_mode = "separate"\n'
    '[[steps]]\nname = "last"\n[steps.verifier]\nenvironment_mode = "separate"\nnetwork_mode = "no-network"\n'
)
STEP_FILES = {
    "steps/third/instruction.md": "Third.\n",
    "steps/third/tests/Dockerfile": "FROM debian:bookworm\nCOPY . /tests/\n",
    "steps/last/instruction.md": "Last.\n",
}


def test_a_steps_verifier_is_separate_by_its_own_table_else_shared(tmp_path):
    """Harbor's ``resolve_step_verifier_mode`` and ``resolve_verifier_environment_definition`` for a task
    whose [verifier] says nothing: a step's environment table implies separate, its image that table's
    docker_image, else steps/<name>/tests/Dockerfile, else the task's environment afresh; its
    environment that table's, else a copy of [environment]."""
    spec = load_task(task(tmp_path, SEPARATE_STEPS, **STEP_FILES))
    write, check, third, last = spec.steps
    assert write.verifier.separate is None and spec.verifier.separate is None  # shared: the default
    assert write.request.phase_network(VERIFIER) == NetworkRequest("public")  # [environment]'s
    separate = check.verifier.separate
    assert separate.environment == ImageEnvironment(image="grader:1", workdir="/grade")
    assert (separate.bundled, separate.env, separate.memory_mb) == (True, {"B": "2"}, 512)
    assert check.request.phase_network(VERIFIER) == NetworkRequest("public")  # its table's: public by default
    assert check.verifier.env == {}  # [verifier.env]: the test's variables, not its environment's
    separate = third.verifier.separate
    assert separate.environment == ImageEnvironment(dockerfile="steps/third/tests/Dockerfile",
                                                    context="steps/third/tests")  # fmt: skip
    assert (separate.bundled, separate.env, separate.memory_mb) == (True, {"A": "1"}, 2048)  # [environment]'s
    separate = last.verifier.separate
    assert separate.environment == ImageEnvironment(dockerfile="environment/Dockerfile", context="environment",
                                                    workdir="/app")  # fmt: skip
    assert (separate.bundled, separate.env, separate.memory_mb) == (False, {"A": "1"}, 2048)
    assert [f.relpath for f in last.verifier.files] == ["helper.py", "test.sh"]  # its /tests uploaded
    assert last.request.phase_network(VERIFIER) == NetworkRequest("no-network")  # [steps.verifier]'s own
    # What was read is not kept; the environment table's other keys are, under the step
    assert spec.metadata["steps"] == [{}, {"verifier": {"environment": {"healthcheck": {"command": "true"}}}}, {}, {}]


def test_a_tasks_separate_verifier_is_every_steps_unless_a_step_says(tmp_path):
    """[verifier.environment] (separate for every step, its image and environment inherited); a step's
    environment_mode = "shared" over it; a step's own table over the task's, the task's docker_image
    its image when the step names none; a step's tests/Dockerfile before the task's image."""
    toml = (
        '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
        '[verifier.environment]\ndocker_image = "task-grader:1"\nworkdir = "/grade"\nmcp = 1\n'
        '[verifier.environment.env]\nB = "2"\n'
        '[[steps]]\nname = "write"\n'
        '[[steps]]\nname = "check"\n[steps.verifier]\nenvironment_mode = "shared"\n'
        '[[steps]]\nname = "third"\n'
        '[[steps]]\nname = "last"\n[steps.verifier.environment]\nworkdir = "/w"\nnetwork_mode = "no-network"\n'
    )
    spec = load_task(task(tmp_path, toml, **STEP_FILES))
    write, check, third, last = spec.steps
    inherited = write.verifier.separate
    assert inherited.environment == ImageEnvironment(image="task-grader:1", workdir="/grade")
    assert (inherited.bundled, inherited.env) == (True, {"B": "2"})
    assert spec.verifier == write.verifier
    assert check.verifier.separate is None
    assert third.verifier.separate.environment == ImageEnvironment(
        dockerfile="steps/third/tests/Dockerfile", context="steps/third/tests", workdir="/grade")  # fmt: skip
    own = last.verifier.separate
    assert own.environment == ImageEnvironment(image="task-grader:1", workdir="/w")
    assert (own.bundled, own.env) == (True, {})
    # [verifier]'s network is every step's verifier's, over its environment's
    assert {step.request.phase_network(VERIFIER) for step in spec.steps} == {NetworkRequest("allowlist", ("pypi.org",))}
    assert spec.metadata["verifier"] == {"environment": {"mcp": 1}}
    assert "steps" not in spec.metadata
    # Without [verifier.environment]: the task's environment afresh for each step, its tests uploaded
    plain = load_task(task(tmp_path / "plain", '[verifier]\nenvironment_mode = "separate"\n' + STEP))
    separate = plain.steps[0].verifier.separate
    assert (separate.environment, separate.bundled) == (
        ImageEnvironment(dockerfile="environment/Dockerfile", context="environment"), False)  # fmt: skip


def test_a_step_workdir_of_a_link_is_refused(tmp_path):
    root = task(tmp_path, STEP, **{"steps/write/workdir/setup.sh": "true\n"})
    (root / "steps/write/workdir/link").symlink_to("/etc/passwd")
    assert error(root) == "task.toml: [[steps]] #1 ('write'): steps/write/workdir/link is a symbolic link"
