"""Harbor tasks of [[steps]] of the suite's own (SPEC §23) through the whole pipeline, on the suite's Debian
image: one environment, each step's agent then its verifier, in order; the evaluation's steps, its reward
by the task's strategy, and a step stopping the rest as Harbor's MultiStepTrial stops them."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluations import artifacts
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Each step's test: its own file holds its word; step two's "style" says whether step one's file is still
# there (one environment). Step one writes no reward when the agent left no-reward saying yes.
ONE_TEST = (
    "#!/bin/bash\n"
    'test "$(cat one.txt 2>/dev/null)" = one && r=1 || r=0\n'
    "ls /tests > /logs/verifier/tests-seen.txt\n"
    '[ "$(cat no-reward 2>/dev/null)" = yes ] || echo $r > /logs/verifier/reward.txt\n'
)
SHARED_TEST = (
    "#!/bin/bash\n"
    'test "$(cat two.txt 2>/dev/null)" = two && r=1 || r=0\n'
    "test -e /logs/verifier/tests-seen.txt && r=0  # step one's /logs/verifier is gone\n"
    "test -f one.txt && kept=1 || kept=0\n"
    'echo "{\\"reward\\": $r, \\"style\\": $kept}" > /logs/verifier/reward.json\n'
)
# The agent: the step it runs for from TASK_STEP, its prompt from TASK_PROMPT; what it saw of /logs/agent
# (empty for every step, as Harbor empties it) and of /tests (nothing: an empty folder once a verifier ran,
# as Harbor's /tests is between steps).
AGENT = (
    'cd "$REPO_DIR"\n'
    'echo "step=$TASK_STEP prompt=$(cat "$TASK_PROMPT")"\n'
    'echo "logs-agent-entries=$(ls -A /logs/agent | wc -l)"\n'
    'test -n "$(ls -A /tests 2>/dev/null)" && echo SAW-TESTS\n'
    'echo "$TASK_STEP" > /logs/agent/trace.txt\n'
)
SOLVE_BOTH = AGENT + 'echo "$TASK_STEP" > "$TASK_STEP.txt"\n'
SOLVE_TWO_ONLY = AGENT + '[ "$TASK_STEP" = two ] && echo two > two.txt\ntrue\n'
REFUSE_ONE_REWARD = AGENT + '[ "$TASK_STEP" = one ] && echo yes > no-reward\ntrue\n'


def steps_task(root: Path, image: str, toml: str = "", one: str = "") -> Path:
    """Two steps: one (its own tests/test.sh; ``one``: more of its table), two (the task's tests/test.sh)."""
    files = {
        "task.toml": f'{toml}\n[environment]\ndocker_image = "{image}"\n'
        f'[[steps]]\nname = "one"\n{one}[steps.agent]\ntimeout_sec = 120\n'
        '[[steps]]\nname = "two"\n',
        "steps/one/instruction.md": "Write one to one.txt.",
        "steps/one/tests/test.sh": ONE_TEST,
        "steps/two/instruction.md": "Write two to two.txt.",
        "tests/test.sh": SHARED_TEST,
    }
    for relpath, text in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(text)
    return root


def run(tasks, config, tmp_path, base_image, agent: str, toml: str = "", one: str = ""):
    _registry, image, _digest = base_image
    url = serve(tasks, steps_task(tmp_path / "task", image, toml, one))
    return evaluate(url, agent, config=config, sandbox="bwrap", language="bash")


def shown(evaluation) -> list[tuple]:
    return [(s["name"], s["reward"], s["rewards"], s["passed"]) for s in evaluation.steps]


def transitions(evaluation) -> list[str]:
    return [t.step for t in evaluation.transitions.all()][5:]  # from installing_agent on


def test_the_solution_passes_both_steps_in_one_environment(tasks, image_task_config, tmp_path, base_image):
    evaluation = run(tasks, image_task_config, tmp_path, base_image, SOLVE_BOTH)
    assert (evaluation.status, evaluation.passed, evaluation.reward) == ("completed", True, 1.0), (
        evaluation.error, evaluation.log[-3000:])  # fmt: skip
    assert evaluation.rewards == {"reward": 1.0, "style": 0.5}  # per key; a key a step lacks counts 0
    assert shown(evaluation) == [
        ("one", 1.0, {"reward": 1.0}, True), ("two", 1.0, {"reward": 1.0, "style": 1.0}, True)]  # fmt: skip
    assert all(isinstance(s["duration_ms"], int) and s["duration_ms"] >= 0 for s in evaluation.steps)
    assert transitions(evaluation) == ["installing_agent", "running_agent", "running_tests", "running_agent",
                                       "running_tests", "cleanup", "done"]  # fmt: skip
    output = evaluation.agent_output
    assert "=== step one ===\nstep=one prompt=Write one to one.txt." in output, output
    assert "=== step two ===\nstep=two prompt=Write two to two.txt." in output, output
    assert output.count("logs-agent-entries=0") == 2 and "SAW-TESTS" not in output, output
    assert [r.name for r in evaluation.test_results.all()] == ["one/test.sh", "two/test.sh"]
    assert "=== step one ===" in evaluation.test_output and "=== step two ===" in evaluation.test_output
    assert sorted(a["path"] for a in evaluation.artifacts) == ["one/trace.txt", "two/trace.txt"]
    assert evaluation.limits_applied["agent_timeout_secs"] == image_task_config.agent_timeout_secs
    assert evaluation.signature is not None and "steps" in evaluation.signature["fields"]


def test_a_no_op_agent_gets_reward_0(tasks, image_task_config, tmp_path, base_image):
    evaluation = run(tasks, image_task_config, tmp_path, base_image, AGENT)
    assert (evaluation.status, evaluation.passed, evaluation.reward) == ("failed", False, 0.0), evaluation.error
    assert evaluation.error_kind == "tests_failed"
    assert evaluation.error == "running_tests: reward 0 < 1 (mean of the steps' rewards)"
    assert shown(evaluation) == [
        ("one", 0.0, {"reward": 0.0}, False),
        ("two", 0.0, {"reward": 0.0, "style": 0.0}, False),
    ]


@pytest.mark.parametrize(
    ("toml", "one", "status", "reward", "ran", "error"),
    [
        # No min_reward: a failed step stops nothing; the mean of 0 and 1.
        ("", "", "failed", 0.5, ["one", "two"], "running_tests: reward 0.5 < 1 (mean of the steps' rewards)"),
        # final: the last step's reward, as it is.
        ('multi_step_reward_strategy = "final"', "", "completed", 1.0, ["one", "two"], ""),
        # min_reward on step one: its reward 0 stops the rest; the mean is over the step run.
        (
            "",
            "min_reward = 1\n",
            "failed",
            0.0,
            ["one"],
            "running_tests: reward 0 < 1 (mean of the steps' rewards); step 'one' reward=0 below min_reward 1: 'two' "
            "did not run",
        ),
        # A key gated that the reward lacks counts -inf: stopped too.
        (
            "",
            "min_reward = { style = 0 }\n",
            "failed",
            0.0,
            ["one"],
            "running_tests: reward 0 < 1 (mean of the steps' rewards); step 'one' style=-inf below min_reward 0: 'two' "
            "did not run",
        ),
    ],
)
def test_a_failing_step_stops_the_rest_only_as_harbor_does(
    tasks, image_task_config, tmp_path, base_image, toml, one, status, reward, ran, error
):
    evaluation = run(tasks, image_task_config, tmp_path, base_image, SOLVE_TWO_ONLY, toml, one)
    assert (evaluation.status, evaluation.reward, evaluation.error) == (status, reward, error), evaluation.log[-3000:]
    assert [s["name"] for s in evaluation.steps] == ran
    assert transitions(evaluation).count("running_agent") == len(ran)


def test_a_step_whose_verifier_gives_no_reward_stops_the_rest_and_fails(tasks, image_task_config, tmp_path, base_image):
    evaluation = run(tasks, image_task_config, tmp_path, base_image, REFUSE_ONE_REWARD)
    assert (evaluation.status, evaluation.error_kind, evaluation.reward) == ("failed", "tests_failed", None)
    assert evaluation.error == (
        "running_tests: step 'one': the verifier wrote no reward: neither /logs/verifier/reward.json nor "
        "/logs/verifier/reward.txt exists; step 'one' gave no reward: 'two' did not run"
    ), evaluation.log[-3000:]
    assert shown(evaluation) == [("one", None, None, False)]


def test_each_steps_own_timeouts_apply(tasks, image_task_config, tmp_path, base_image):
    """Step one's verifier has 1 s ([steps.verifier] timeout_sec) and sleeps: no reward, the rest stop. With
    step two's agent given 1 s ([steps.agent] timeout_sec) instead, its agent's sleep ends the evaluation."""
    sleepy = ONE_TEST.replace("#!/bin/bash\n", "#!/bin/bash\nsleep 60\n", 1)
    _registry, image, _digest = base_image
    root = steps_task(tmp_path / "verifier", image, one="[steps.verifier]\ntimeout_sec = 1\n")
    (root / "steps/one/tests/test.sh").write_text(sleepy)
    evaluation = evaluate(serve(tasks, root), SOLVE_BOTH, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "tests_failed"), evaluation.log[-3000:]
    assert evaluation.error == (
        "running_tests: step 'one': the verifier test.sh timed out; step 'one' gave no reward: 'two' did not run"
    )
    assert shown(evaluation) == [("one", None, None, False)]

    root = steps_task(tmp_path / "agent", image)
    toml = (root / "task.toml").read_text() + "[steps.agent]\ntimeout_sec = 1\n"  # step two's
    (root / "task.toml").write_text(toml)
    agent = SOLVE_BOTH + '[ "$TASK_STEP" = two ] && sleep 60\ntrue\n'
    evaluation = evaluate(serve(tasks, root), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.error_kind) == ("cancelled", "agent_timeout"), evaluation.log[-3000:]
    assert evaluation.error == "running_agent: agent timed out after 1 s"
    assert shown(evaluation) == [("one", 1.0, {"reward": 1.0}, True)] and evaluation.reward is None


# -- a step's own workdir/ and setup.sh, healthcheck, artifacts and verifier user (Harbor 0.25) -------------

STAGED_AGENT = (
    AGENT + 'echo "ready=$(cat ready 2>/dev/null) listing=$(cat listing 2>/dev/null)"\n'
    'echo "artifacts-entries=$(ls -A /logs/artifacts | wc -l)"\n'
    'echo "$TASK_STEP" > /logs/artifacts/conv.txt; echo "$TASK_STEP" > "$TASK_STEP.txt"; echo all > all.txt\n'
)


def staged_task(root: Path, image: str, one: str = "", two: str = "", files: dict | None = None) -> Path:
    """steps_task in WorkingDir /app, a task-level artifact (/app/all.txt), ``one``/``two``: more of each
    step's table, ``files``: more files (None removes one)."""
    steps_task(root, image, 'artifacts = ["/app/all.txt"]', one)
    toml = (
        (root / "task.toml")
        .read_text()
        .replace(f'docker_image = "{image}"\n', f'docker_image = "{image}"\nworkdir = "/app"\n')
    )
    (root / "task.toml").write_text(toml + two)
    for relpath, text in (files or {}).items():
        if text is None:
            (root / relpath).unlink()
            continue
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(text)
    return root


SETUP = 'echo "set-up-by-$(id -un)-in-$(pwd)" > ready\nls data > listing\n'


def test_a_steps_workdir_setup_healthcheck_and_artifacts(tasks, image_task_config, tmp_path, base_image):
    """Step one: its workdir/ copied into /app (root's, as docker cp leaves it), its setup.sh run there as the
    agent's user, its healthcheck passing once setup is done, then its agent. Each step's artifacts (the task's
    /app/all.txt, step one's own /app/one.txt, its /logs/artifacts, new for each step) under its name."""
    _registry, image, _digest = base_image
    one = (
        'artifacts = ["/app/one.txt"]\n[steps.healthcheck]\ncommand = "test -s /app/ready"\n'
        "interval_sec = 0.2\nstart_interval_sec = 0.2\n"
    )
    files = {"steps/one/workdir/setup.sh": SETUP, "steps/one/workdir/data/in.txt": "in\n"}
    root = staged_task(tmp_path / "task", image, one=one, files=files)
    evaluation = evaluate(serve(tasks, root), STAGED_AGENT, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    output = evaluation.agent_output
    assert "ready=set-up-by-root-in-/app listing=in.txt" in output, output
    assert output.count("artifacts-entries=0") == 2, output  # /logs/artifacts: empty for each step's agent
    assert "healthcheck of the step's environment: healthy" in evaluation.log
    assert sorted(a["path"] for a in evaluation.artifacts) == [
        "one/artifacts/app/all.txt",  # the task's entry, in each step's collection
        "one/artifacts/app/one.txt",  # step one's own
        "one/artifacts/logs/artifacts/conv.txt",
        "one/trace.txt",
        "two/artifacts/app/all.txt",
        "two/artifacts/logs/artifacts/conv.txt",
        "two/trace.txt",
    ]
    with artifacts.open_artifact(evaluation.id, "one/artifacts/logs/artifacts/conv.txt", image_task_config) as kept:
        assert kept.read() == b"one\n"  # step one's, kept as it was after step one
    with artifacts.open_artifact(evaluation.id, "two/artifacts/logs/artifacts/conv.txt", image_task_config) as kept:
        assert kept.read() == b"two\n"


@pytest.mark.parametrize(
    ("one", "two", "files", "error", "ran"),
    [
        (
            "",
            "",
            {"steps/one/workdir/setup.sh": "echo broken >&2; exit 3\n"},
            "running_agent: step 'one': setup.sh exited with code 3: broken; step 'one' gave no reward: 'two' did "
            "not run",
            [],
        ),
        (
            "",
            '[steps.healthcheck]\ncommand = "test -e /app/never"\nretries = 2\ninterval_sec = 0.1\n',
            {},
            "running_agent: step 'two': the step's environment never became healthy: 'test -e /app/never' exited 1 "
            "2 time(s) in a row: no output",
            ["one"],
        ),
    ],
)
def test_a_failing_setup_or_healthcheck_fails_its_step_before_its_agent(
    tasks, image_task_config, tmp_path, base_image, one, two, files, error, ran
):
    """Harbor's step exception before the agent: the step gives no reward, neither its agent nor its verifier
    runs, and the rest do not run."""
    _registry, image, _digest = base_image
    root = staged_task(tmp_path / "task", image, one=one, two=two, files=files)
    evaluation = evaluate(serve(tasks, root), SOLVE_BOTH, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "tests_failed"), evaluation.log[-3000:]
    assert evaluation.error == error, evaluation.log[-3000:]
    failed = "two" if ran else "one"
    assert [s["name"] for s in evaluation.steps] == [*ran, failed]
    assert evaluation.steps[-1]["reward"] is None and evaluation.steps[-1]["passed"] is False
    assert f"step={failed}" not in evaluation.agent_output  # its agent never ran
    assert [r.name for r in evaluation.test_results.all()] == [f"{name}/test.sh" for name in ran]


USER_TEST = '#!/bin/bash\necho "verifier=$(id -un)"\necho 1 > /logs/verifier/reward.txt\n'


def test_each_steps_verifier_runs_as_its_own_user(tasks, image_task_config, tmp_path, base_image):
    """[steps.verifier] user = "nobody" on step one; step two's verifier the image's User (root), as Harbor's."""
    _registry, image, _digest = base_image
    files = {"steps/one/tests/test.sh": USER_TEST, "tests/test.sh": USER_TEST}
    root = staged_task(tmp_path / "task", image, one='[steps.verifier]\nuser = "nobody"\n', files=files)
    evaluation = evaluate(serve(tasks, root), SOLVE_BOTH, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    one, two = evaluation.test_output.split("=== step two ===")
    assert "verifier=nobody" in one and "verifier=root" in two, evaluation.test_output

    root = staged_task(tmp_path / "ghost", image, one='[steps.verifier]\nuser = "ghost"\n', files=files)
    evaluation = evaluate(serve(tasks, root), SOLVE_BOTH, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.log[-3000:]
    assert evaluation.error.startswith(
        "preparing_environment: task.toml: [[steps]] #1 ('one'): [steps.verifier] user 'ghost' cannot run in the "
        "image: "
    ), evaluation.error
    assert evaluation.steps in (None, [])


def test_setup_runs_as_the_agents_user_over_files_root_owns(tasks, image_task_config, tmp_path, base_image):
    """[agent] user = "nobody" (and [steps.agent] user the same, accepted): setup.sh runs as nobody over the
    staged files, which are root's, as docker cp leaves them; the step's healthcheck runs as nobody too."""
    _registry, image, _digest = base_image
    one = "[steps.healthcheck]\ncommand = 'test \"$(id -un)\" = nobody'\n"
    setup = 'echo "$(id -un) $(stat -c %U /app/data/in.txt) $(stat -c %U /app/setup.sh)" > /tmp/who\n'
    files = {"steps/one/workdir/setup.sh": setup, "steps/one/workdir/data/in.txt": "in\n"}
    root = staged_task(tmp_path / "task", image, one=one, files=files)
    toml = (root / "task.toml").read_text()
    toml = toml.replace('artifacts = ["/app/all.txt"]', "").replace(
        "timeout_sec = 120\n", 'timeout_sec = 120\nuser = "nobody"\n'
    )
    (root / "task.toml").write_text('[agent]\nuser = "nobody"\n' + toml)
    agent = 'echo "who=$(cat /tmp/who)"\n' + AGENT + 'echo "$TASK_STEP" > "/tmp/$TASK_STEP.txt"\n'
    evaluation = evaluate(serve(tasks, root), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert "who=nobody root root" in evaluation.agent_output, (evaluation.agent_output, evaluation.log[-3000:])
    assert "healthcheck of the step's environment: healthy" in evaluation.log
    assert [s["name"] for s in evaluation.steps] == ["one", "two"]


def test_a_workdir_file_that_cannot_be_placed_fails_the_evaluation(tasks, image_task_config, tmp_path, base_image):
    """Step one's agent leaves a file at /app/data; step two's workdir/data/in.txt needs a folder there: the
    copy fails as Harbor's docker cp does (the task's, named), before step two's agent."""
    _registry, image, _digest = base_image
    root = staged_task(tmp_path / "task", image, files={"steps/two/workdir/data/in.txt": "in\n"})
    agent = SOLVE_BOTH + "echo file > /app/data\n"
    evaluation = evaluate(serve(tasks, root), agent, config=image_task_config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.log[-3000:]
    assert evaluation.error == (
        "running_agent: step 'two': could not copy steps/two/workdir/ into /app: a part of /app/data is in the "
        "image, and not a folder"
    )
    assert "step=two" not in evaluation.agent_output


def test_collect_hooks_run_after_each_steps_agent_the_tasks_then_its_own(
    tasks, image_task_config, tmp_path, base_image
):
    """Harbor's ``_collect_hooks_for``: after each step's agent, the task's [[verifier.collect]], then the
    step's own [[steps.verifier.collect]], before that step's artifacts are read."""
    toml = 'artifacts = ["/hooks.txt"]\n[[verifier.collect]]\ncommand = "echo task-$(id -un) >> /hooks.txt"\n'
    one = '[[steps.verifier.collect]]\ncommand = "echo one >> /hooks.txt"\n'
    evaluation = run(tasks, image_task_config, tmp_path, base_image, SOLVE_BOTH, toml=toml, one=one)
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    with artifacts.open_artifact(evaluation.id, "one/artifacts/hooks.txt", image_task_config) as kept:
        assert kept.read() == b"task-root\none\n"
    with artifacts.open_artifact(evaluation.id, "two/artifacts/hooks.txt", image_task_config) as kept:
        assert kept.read() == b"task-root\none\ntask-root\n"


# -- a step's separate verifier (Harbor 0.25's resolve_step_verifier_mode, MultiStepTrial._run_step) ---------

# A separate verifier's test: only the artifacts it is given (the task's /app/all.txt, the step's own, its
# /logs/artifacts), none of the agent's other files, nor an earlier verifier's; $1 the step's own artifact.
SEPARATE_TEST = (
    "#!/bin/bash\nok=1\n"
    'test "$(cat /app/all.txt)" = all || { echo no all; ok=0; }\n'
    'test "$(cat /logs/artifacts/conv.txt)" = "$STEP" || { echo no conv; ok=0; }\n'
    'test -z "$OWN" || test "$(cat "$OWN")" = "$STEP" || { echo "no $OWN"; ok=0; }\n'
    "for other in $ABSENT /app/secret.txt /app/left-by-verifier /logs/agent/trace.txt; do\n"
    '  test ! -e "$other" || { echo "sees $other"; ok=0; }\ndone\n'
    "echo left > /app/left-by-verifier\n"
    "echo $ok > /logs/verifier/reward.txt\n"
)
SEPARATE_AGENT = (
    STAGED_AGENT + 'echo "$TASK_STEP saw-one=$(cat one.txt 2>/dev/null) saw-verifier=$(ls left-by-verifier 2>&1 '
    '| grep -c "No such")"\necho secret > secret.txt\n'
)


def separate_task(root: Path, image: str, toml: str = "", one: str = "", two: str = "", files=None) -> Path:
    """staged_task with ``toml`` after its top-level keys (a [verifier] table)."""
    root = staged_task(root, image, one=one, two=two, files=files)
    text = (
        (root / "task.toml")
        .read_text()
        .replace('artifacts = ["/app/all.txt"]', f'artifacts = ["/app/all.txt"]\n{toml}')
    )
    (root / "task.toml").write_text(text)
    return root


def _both_steps_pass(tasks, root, config):
    """The separate-verifier task run with SEPARATE_AGENT: both steps rewarded, step two's agent having
    seen step one's work."""
    evaluation = evaluate(serve(tasks, root), SEPARATE_AGENT, config=config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (
        evaluation.error, evaluation.test_output, evaluation.log[-3000:])  # fmt: skip
    assert shown(evaluation) == [("one", 1.0, {"reward": 1.0}, True), ("two", 1.0, {"reward": 1.0}, True)]
    assert "two saw-one=one saw-verifier=1" in evaluation.agent_output, evaluation.agent_output
    return evaluation


def test_a_steps_separate_verifier_sees_only_its_artifacts_and_the_next_agent_the_agents_root(
    tasks, image_task_config, tmp_path, base_image
):
    """Step one's verifier shares the agent's environment; step two's (environment_mode = "separate") runs in
    the task's image afresh, /tests its step's, with only the task's and its step's artifacts copied in: not
    /app/one.txt nor /app/secret.txt the agent left. Step two's agent still sees step one's work."""
    _registry, image, _digest = base_image
    two = 'artifacts = ["/app/two.txt"]\n[steps.verifier]\nenvironment_mode = "separate"\n[steps.verifier.env]\n' \
          'STEP = "two"\nOWN = "/app/two.txt"\nABSENT = "/app/one.txt"\n'  # fmt: skip
    root = separate_task(tmp_path / "task", image, two=two, files={"tests/test.sh": SEPARATE_TEST})
    evaluation = _both_steps_pass(tasks, root, image_task_config)
    environment = evaluation.environment
    assert "verifier" not in environment and list(environment["verifiers"]) == ["two"]
    assert (environment["verifiers"]["two"]["ref"], environment["verifiers"]["two"]["digest"]) == (
        image, environment["digest"])  # fmt: skip
    assert "artifacts: copied 3 files into the verifier's environment" in evaluation.log
    # The same task, its agent leaving nothing for step two: step two's verifier finds nothing of it
    nothing = evaluate(serve(tasks, root), STAGED_AGENT.replace('"$TASK_STEP.txt"', "/dev/null"),
                       config=image_task_config, sandbox="bwrap", language="bash")  # fmt: skip
    assert shown(nothing) == [("one", 0.0, {"reward": 0.0}, False), ("two", 0.0, {"reward": 0.0}, False)], (
        nothing.error, nothing.log[-3000:])  # fmt: skip
    assert "no /app/two.txt" in nothing.test_output


BUNDLED_TEST = (
    "#!/bin/bash\nok=1\n"
    'test "$(cat /tests/marker)" = baked || { echo "no marker: $(ls /tests)"; ok=0; }\n'
    "test ! -e /tests/shared.txt || { echo sees the task tests; ok=0; }\n"
    'test "$(cat /logs/artifacts/conv.txt)" = two || { echo no conv; ok=0; }\n'
    "test ! -e /app/secret.txt || { echo sees secret; ok=0; }\n"
    "echo $ok > /logs/verifier/reward.txt\n"
)


def test_a_steps_own_tests_dockerfile_is_its_separate_verifiers_image_with_its_own_tests(
    tasks, image_task_config, tmp_path, base_image
):
    """Harbor's resolve_verifier_environment_definition: a separate step whose steps/<name>/tests/ holds a
    Dockerfile runs its verifier in that image, built from that folder, with the image's own /tests (nothing
    of the task's tests/ uploaded: ``bundled_tests``); only the artifacts are copied in."""
    _registry, image, _digest = base_image
    two = '[steps.verifier]\nenvironment_mode = "separate"\n'
    files = {
        "tests/test.sh": SEPARATE_TEST,
        "tests/shared.txt": "the task's\n",
        "steps/two/tests/Dockerfile": f"FROM {image}\nCOPY bundled.sh /tests/test.sh\nCOPY marker /tests/marker\n",
        "steps/two/tests/bundled.sh": BUNDLED_TEST,
        "steps/two/tests/marker": "baked\n",
    }
    root = separate_task(tmp_path / "task", image, two=two, files=files)
    evaluation = evaluate(serve(tasks, root), SEPARATE_AGENT, config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (
        evaluation.error, evaluation.test_output, evaluation.log[-3000:])  # fmt: skip
    assert shown(evaluation) == [("one", 1.0, {"reward": 1.0}, True), ("two", 1.0, {"reward": 1.0}, True)]
    assert evaluation.environment["verifiers"]["two"]["ref"] == "steps/two/tests/Dockerfile", evaluation.environment


def test_a_tasks_separate_verifier_is_every_steps_each_in_a_fresh_root(tasks, image_task_config, tmp_path, base_image):
    """[verifier] environment_mode = "separate" with [[steps]]: each step's verifier in a root of its own, fresh:
    step one's leaves /app/left-by-verifier there, which step two's does not see (nor step one's artifact
    /app/one.txt); the agent's root has neither, and step two's agent has step one's work."""
    _registry, image, _digest = base_image
    one = 'artifacts = ["/app/one.txt"]\n[steps.verifier.env]\nSTEP = "one"\nOWN = "/app/one.txt"\n'
    two = '[steps.verifier.env]\nSTEP = "two"\nABSENT = "/app/one.txt"\n'
    files = {"tests/test.sh": SEPARATE_TEST, "steps/one/tests/test.sh": SEPARATE_TEST}
    root = separate_task(tmp_path / "task", image, '[verifier]\nenvironment_mode = "separate"\n', one, two, files)
    evaluation = _both_steps_pass(tasks, root, image_task_config)
    assert sorted(evaluation.environment["verifiers"]) == ["one", "two"]


def test_a_steps_verifier_image_that_cannot_be_had_fails_before_the_first_agent(
    tasks, image_task_config, tmp_path, base_image
):
    registry, image, _digest = base_image
    two = f'[steps.verifier.environment]\ndocker_image = "{registry.host}/nowhere/grader:1"\n'
    root = separate_task(tmp_path / "task", image, two=two, files={"tests/test.sh": SEPARATE_TEST})
    evaluation = evaluate(serve(tasks, root), SEPARATE_AGENT, config=image_task_config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.agent_output) == ("failed", ""), evaluation.log[-3000:]
    assert evaluation.error.startswith("preparing_environment: step 'two': the verifier's image: "), evaluation.error
    assert evaluation.steps in (None, [])
