"""Real Harbor 0.25 runs trials on live sandboxes through ``term_executor_client.harbor`` (SPEC §24).

``harbor run -p TASK -a AGENT -e term_executor_client.harbor:TermExecutorEnvironment --ek url=...
--ek token=...`` in the Python 3.12 venv of tests/helpers/harbor_venv.py (Harbor 0.25.0 and this
checkout's client, installed with pip as a user would), against a live service and worker on
127.0.0.1. The tasks are written here in Harbor's layout; their Dockerfile starts ``FROM`` the suite's
Debian image in the suite's registry, so the build context (``COPY``) travels as Harbor's backends
send it. What Harbor wrote (each trial's result.json, the verifier's reward) is read back, and the
service must hold no live sandbox afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import harbor_venv
from tests.sandboxes.conftest import TOKEN, Api

pytestmark = pytest.mark.database  # sandbox_service builds its LiveService itself: no fixture shows it

ENVIRONMENT = "term_executor_client.harbor:TermExecutorEnvironment"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"

TASK_TOML = """\
schema_version = "1.4"

[metadata]
difficulty = "easy"

[agent]
timeout_sec = 300.0

[verifier]
timeout_sec = 300.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 1024
"""

# The oracle upper-cases the greeting the Dockerfile copied in; the test checks the answer, that the
# task's env reached the verifier, and writes the reward Harbor reads.
SOLVE_SH = """\
#!/bin/bash
set -euo pipefail
tr a-z A-Z < /app/greeting.txt > /app/answer.txt
echo "solved as $(id -un) in $(pwd)"
"""

TEST_SH = """\
#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "HELLO FROM {upper}" ] && [ "$TASK_MARK" = "{name}" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
echo "verifier ran in $(pwd)"
"""


def write_task(folder: Path, name: str, base_ref: str) -> Path:
    task = folder / name
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {base_ref}\nWORKDIR /app\nCOPY greeting.txt /app/greeting.txt\nENV TASK_MARK={name}\n"
    )
    (task / "environment" / "greeting.txt").write_text(f"hello from {name}\n")
    (task / "instruction.md").write_text("Write /app/greeting.txt in upper case to /app/answer.txt.\n")
    (task / "task.toml").write_text(TASK_TOML)
    for folder_name, script, text in (("solution", "solve.sh", SOLVE_SH), ("tests", "test.sh", TEST_SH)):
        (task / folder_name).mkdir()
        (task / folder_name / script).write_text(text.format(name=name, upper=name.upper()))
    return task


@pytest.fixture(scope="module")
def harbor() -> Path:
    """The venv's ``harbor`` command (the venv made on the first run, reused after)."""
    return harbor_venv.ensure() / "bin" / "harbor"


@pytest.fixture
def base_ref(base_image) -> str:
    return base_image[1]


def harbor_run(harbor: Path, service, tmp_path: Path, path: Path, agent: str, *, concurrent: int = 1) -> list[dict]:
    """``harbor run`` of ``path`` (a task, or a folder of tasks) with ``agent``: each trial's result.json."""
    jobs = tmp_path / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith(("TERM_EXECUTOR_", "PYTEST_"))},
        "HOME": str(tmp_path / "home"),  # Harbor's own caches and settings stay in the test's folder
        "HARBOR_TELEMETRY": "0",
    }
    argv = [str(harbor), "run", "-p", str(path), "-a", agent, "-e", ENVIRONMENT]
    argv += ["--ek", f"url={service.base_url}", "--ek", f"token={TOKEN}"]
    argv += ["-o", str(jobs), "--job-name", agent, "-n", str(concurrent), "-y", "-q"]
    ran = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    results = [json.loads(found.read_text()) for found in sorted((jobs / agent).glob("*/result.json"))]
    assert results, f"no trial results under {jobs / agent}: {ran.stdout[-2000:]}"
    return results


def reward(result: dict) -> float:
    assert result.get("exception_info") is None, result["exception_info"]
    return result["verifier_result"]["rewards"]["reward"]


def live_sandboxes(api: Api) -> list[dict]:
    status, sandboxes = api.json("GET", "/sandboxes")
    assert status == 200, sandboxes
    return [sandbox for sandbox in sandboxes if sandbox["status"] in ("starting", "ready")]


# Harbor's own start-up costs seconds: the tasks run as two datasets, one per agent, two at a time.


def write_phases_task(dataset: Path, base_ref: str, registry: str) -> Path:
    """A task whose agent may reach only the registry (allowlist) and whose verifier nothing: each
    phase probes the registry and the verifier rewards the expected pair."""
    task = write_task(dataset, "phases", base_ref)
    (task / "task.toml").write_text(
        TASK_TOML.replace(
            "[agent]\n", f'[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["{registry.split(":")[0]}"]\n'
        ).replace("[verifier]\n", '[verifier]\nnetwork_mode = "no-network"\n')
    )
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + PROBE.format(out="/app/agent.txt", registry=registry))
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        + PROBE.format(out="/logs/verifier/probe.txt", registry=registry)
        + "cp /app/agent.txt /logs/verifier/agent.txt\n"
        + "if grep -q ^reached /app/agent.txt && grep -q ^refused /logs/verifier/probe.txt; then r=1; else r=0; fi\n"
        + "echo $r > /logs/verifier/reward.txt\n"
    )
    return task


def test_the_oracle_solves_each_task_two_at_a_time(harbor, sandbox_service, api, base_ref, hub_mirror, tmp_path):
    """Two tasks of the suite's, one whose agent and verifier phases get their own network policy
    (the environment starts public; Harbor switches to the agent's allowlist and back, then to the
    verifier's no-network: PUT /network each time), and examples/harbor/fix-greeting (``FROM
    debian:bookworm`` through the mirror, ``RUN useradd``, ``USER dev``, no-network: Harbor uploads
    /solution and /tests as root, makes them executable as root, runs them as the image's user)."""
    dataset = tmp_path / "dataset"
    for name in ("first", "second"):
        write_task(dataset, name, base_ref)
    write_phases_task(dataset, base_ref, hub_mirror.host)
    shutil.copytree(EXAMPLES / "fix-greeting", dataset / "fix-greeting")
    results = harbor_run(harbor, sandbox_service, tmp_path, dataset, "oracle", concurrent=2)
    by_task = {result["task_name"]: result for result in results}
    assert len(results) == 4 and {"first", "second", "phases"} <= set(by_task), sorted(by_task)
    trials = tmp_path / "jobs" / "oracle"
    seen = (trials / by_task["phases"]["trial_name"] / "verifier").glob("*.txt")
    assert [reward(result) for result in results] == [1.0] * 4, {path.name: path.read_text() for path in seen}
    first = trials / by_task["first"]["trial_name"]
    assert (first / "verifier" / "reward.txt").read_text().strip() == "1"  # download_dir of /logs/verifier
    oracle_log = (first / "agent" / "oracle.txt").read_text()  # download_file of /logs/agent/oracle.txt
    assert "solved as root in /app" in oracle_log  # the image's user and WORKDIR
    assert "verifier ran in /app" in (first / "verifier" / "test-stdout.txt").read_text()
    assert live_sandboxes(api) == []


def test_the_nop_agent_leaves_each_task_unsolved(harbor, sandbox_service, api, base_ref, tmp_path):
    dataset = tmp_path / "dataset"
    write_task(dataset, "greet", base_ref)
    shutil.copytree(EXAMPLES / "fix-greeting", dataset / "fix-greeting")
    results = harbor_run(harbor, sandbox_service, tmp_path, dataset, "nop", concurrent=2)
    assert len(results) == 2 and [reward(result) for result in results] == [0.0, 0.0]
    assert live_sandboxes(api) == []


# Each phase asks the registry for /v2/ through the sandbox's proxy (the relay's variables, without
# NO_PROXY, which names 127.0.0.1) and writes what happened.
PROBE = """\
env -u no_proxy -u NO_PROXY python3 - <<'PY' > {out} 2>&1 || true
import urllib.request
try:
    urllib.request.urlopen("http://{registry}/v2/", timeout=20)
    print("reached")
except Exception as error:
    print("refused", error)
PY
"""


# -- the schema's other shapes (SPEC §23) through the backend (SPEC §24) ---------------------------

STEP_TOML = """\
schema_version = "1.4"
multi_step_reward_strategy = "mean"

[environment]
build_timeout_sec = 600.0

[[steps]]
name = "create"

[[steps]]
name = "append"
"""


def write_steps_task(dataset: Path, base_ref: str) -> Path:
    """Two steps on one environment: the second's verifier sees what the first's agent left."""
    task = dataset / "steps"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(f"FROM {base_ref}\nWORKDIR /app\n")
    (task / "task.toml").write_text(STEP_TOML)
    checks = {"create": "one", "append": "one two"}
    for name, line in (("create", "echo one > /app/log.txt"), ("append", "echo two >> /app/log.txt")):
        step = task / "steps" / name
        for folder in ("solution", "tests"):
            (step / folder).mkdir(parents=True)
        (step / "instruction.md").write_text(f"Step {name}: run `{line}`.\n")
        (step / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{line}\n")
        (step / "tests" / "test.sh").write_text(
            "#!/bin/bash\n"
            f'if [ "$(tr "\\n" " " < /app/log.txt 2>/dev/null | sed "s/ $//")" = "{checks[name]}" ]; '
            "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        )
    return task


def write_separate_task(dataset: Path, base_ref: str) -> Path:
    """The verifier in an environment of its own (tests/Dockerfile, the tests baked in, as Harbor
    builds it), with only the declared artifact copied in at its path."""
    task = write_task(dataset, "separate", base_ref)
    separate = TASK_TOML.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    (task / "task.toml").write_text('artifacts = ["/app/answer.txt"]\n' + separate)
    (task / "tests" / "Dockerfile").write_text(f"FROM {base_ref}\nCOPY test.sh /tests/test.sh\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        '[ "$(cat /app/answer.txt 2>/dev/null)" = "HELLO FROM SEPARATE" ] && [ ! -e /app/greeting.txt ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    return task


def write_healthcheck_task(dataset: Path, base_ref: str) -> Path:
    """[environment.healthcheck] that passes at its third try: Harbor runs it through the backend's
    exec before the agent, and the verifier finds the count it left."""
    task = write_task(dataset, "healthy", base_ref)
    (task / "task.toml").write_text(
        TASK_TOML
        + "\n[environment.healthcheck]\n"
        + "command = 'n=$(cat /tmp/hc 2>/dev/null || echo 0); echo $((n + 1)) > /tmp/hc; [ \"$n\" -ge 2 ]'\n"
        + "interval_sec = 0.1\nstart_interval_sec = 0.1\nstart_period_sec = 0.0\nretries = 5\n"
    )
    test = (task / "tests" / "test.sh").read_text()
    (task / "tests" / "test.sh").write_text(test.replace("] && [", '] && [ "$(cat /tmp/hc)" = 3 ] && ['))
    return task


def write_ipv6_task(dataset: Path, base_ref: str, web6) -> Path:
    """An agent allowlist of one IPv6 literal: the solution fetches from the host's ::1 through the
    sandbox's proxy, and the verifier (no-network) cannot."""
    task = write_task(dataset, "ipv6", base_ref)
    (task / "task.toml").write_text(
        TASK_TOML.replace("[agent]\n", '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["::1"]\n').replace(
            "[verifier]\n", '[verifier]\nnetwork_mode = "no-network"\n'
        )
    )
    fetch = FETCH6.format(port=web6.port)
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{fetch.format(out='/app/agent.txt')}")
    (task / "tests" / "test.sh").write_text(
        f"#!/bin/bash\n{fetch.format(out='/tmp/verifier.txt')}"
        "if grep -q '^hello from ::1' /app/agent.txt && ! grep -q '^hello' /tmp/verifier.txt; then r=1; else r=0; fi\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    return task


FETCH6 = """\
env -u no_proxy -u NO_PROXY python3 - <<'PY' > {{out}} 2>&1 || true
import urllib.request
try:
    print(urllib.request.urlopen("http://[::1]:{port}/hello.txt", timeout=20).read().decode())
except Exception as error:
    print("refused", error)
PY
"""


def test_multi_step_separate_verifier_healthcheck_and_ipv6_tasks(
    harbor, sandbox_service, api, base_ref, web6, tmp_path
):
    """Harbor drives the schema's other shapes through the backend (SPEC §23-24): a multi-step task
    (each step's solution, then its verifier, on one sandbox), a separate verifier (a second
    sandbox from tests/Dockerfile with only the artifact), a healthcheck, an IPv6 allowlist. The
    oracle solves each; the nop agent solves none."""
    dataset = tmp_path / "dataset"
    write_steps_task(dataset, base_ref)
    write_separate_task(dataset, base_ref)
    write_healthcheck_task(dataset, base_ref)
    write_ipv6_task(dataset, base_ref, web6)
    solved = {
        result["task_name"]: result
        for result in harbor_run(harbor, sandbox_service, tmp_path, dataset, "oracle", concurrent=2)
    }
    assert sorted(solved) == ["healthy", "ipv6", "separate", "steps"]
    assert {name: reward(result) for name, result in solved.items()} == dict.fromkeys(solved, 1.0)
    assert [step["verifier_result"]["rewards"]["reward"] for step in solved["steps"]["step_results"]] == [1.0, 1.0]
    unsolved = harbor_run(harbor, sandbox_service, tmp_path, dataset, "nop", concurrent=2)
    assert {result["task_name"]: reward(result) for result in unsolved} == dict.fromkeys(solved, 0.0)
    assert live_sandboxes(api) == []


# -- docker-compose services beside main (SPEC §23-24) ----------------------------------------------

COMPOSE_YAML = """\
services:
  api:
    build:
      context: api
    command: ["sh", "-c", "python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv 2> /srv/access.log; :"]
    environment:
      API_MARK: from-compose
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/')"]
      interval: 0.5s
      retries: 60
"""

COMPOSE_TOML = (
    'artifacts = [{ source = "/srv/evidence.txt", service = "api" }]\n'
    + TASK_TOML
    + """
[[verifier.collect]]
service = "api"
command = "echo \\"$API_MARK $(grep -c 'GET /key.txt' /srv/access.log)\\" > /srv/evidence.txt"
"""
)


def write_compose_task(dataset: Path, base_ref: str) -> Path:
    """main (environment/Dockerfile) and ``api``, a sidecar built from environment/api/ serving a key
    on main's loopback: the solution fetches it by the service's name, the verifier checks it, and
    a collect hook in the sidecar writes what its log saw, which Harbor downloads as an artifact."""
    task = dataset / "sidecar"
    (task / "environment" / "api").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(f"FROM {base_ref}\nWORKDIR /app\n")
    (task / "environment" / "docker-compose.yaml").write_text(COMPOSE_YAML)
    (task / "environment" / "api" / "Dockerfile").write_text(f"FROM {base_ref}\nCOPY key.txt /srv/key.txt\n")
    (task / "environment" / "api" / "key.txt").write_text("sidecar-key-42\n")
    (task / "instruction.md").write_text("Fetch http://api:8080/key.txt into /app/answer.txt.\n")
    (task / "task.toml").write_text(COMPOSE_TOML)
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://api:8080/key.txt').read().decode(), end='')\""
        " > /app/answer.txt\n"
    )
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        '[ "$(cat /app/answer.txt)" = sidecar-key-42 ] && echo 1 > /logs/verifier/reward.txt '
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )
    return task


def test_a_task_with_a_compose_sidecar(harbor, sandbox_service, api, base_ref, tmp_path):
    """Harbor 0.25 runs a task whose environment/docker-compose.yaml has a service besides main:
    the backend sends the compose file with the context, main reaches the sidecar by name, and
    Harbor's sidecar operations (the collect hook: service_exec; the artifact: service_download_*)
    reach its own files."""
    dataset = tmp_path / "dataset"
    write_compose_task(dataset, base_ref)
    (result,) = harbor_run(harbor, sandbox_service, tmp_path, dataset, "oracle")
    assert reward(result) == 1.0
    trial = tmp_path / "jobs" / "oracle" / result["trial_name"]
    evidence = [path for path in (trial / "artifacts").rglob("evidence.txt")]
    assert len(evidence) == 1, sorted(str(path) for path in trial.rglob("*"))
    assert evidence[0].read_text() == "from-compose 1\n"  # the sidecar's variables, its own log: one fetch
    assert live_sandboxes(api) == []


# -- a sidecar's artifacts through the compose file's volumes (SPEC §23-24) -------------------------

# Harbor's examples/tasks/sidecar-artifacts, in its shape: a sidecar binding Harbor's artifacts folder
# (what it writes there is in main's /logs/artifacts) and a named volume it shares with main; a collect
# hook in the sidecar copies what the agent left in the volume to a file of its own, which the task's
# ``artifacts`` entry takes from the sidecar.
SIDECAR_ARTIFACTS_YAML = """\
services:
  main:
    volumes:
      - exchange:/exchange
  recorder:
    image: {image}
    command: ["sh", "-c", "echo recorded-by-sidecar > /logs/artifacts/sidecar.txt; exec sleep infinity"]
    volumes:
      - ${{HOST_ARTIFACTS_PATH}}:${{ENV_ARTIFACTS_PATH}}
      - exchange:/exchange
volumes:
  exchange: {{}}
"""

SIDECAR_ARTIFACTS_TOML = (
    'artifacts = [{ source = "/srv/evidence.txt", service = "recorder" }]\n'
    + TASK_TOML
    + """
[[verifier.collect]]
service = "recorder"
command = "cp /exchange/answer.txt /srv/evidence.txt"
"""
)

SIDECAR_ARTIFACTS_TEST = """\
#!/bin/bash
side=$(cat /logs/artifacts/sidecar.txt 2>/dev/null); evidence=$(cat /srv/evidence.txt 2>/dev/null)
echo "sidecar=$side evidence=$evidence"
if [ "$side" = recorded-by-sidecar ] && [ "$evidence" = solved ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""


def write_sidecar_artifacts_task(dataset: Path, name: str, base_ref: str, *, separate: bool) -> Path:
    """The task. Shared: the verifier runs in main, which has the sidecar's artifacts folder and the
    volume. Separate: the verifier runs in an image of its own (tests/Dockerfile), into which Harbor
    copies the artifacts (main's /logs/artifacts, the sidecar's evidence) after it stopped main."""
    task = dataset / name
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(f"FROM {base_ref}\nWORKDIR /app\n")
    (task / "environment" / "docker-compose.yaml").write_text(SIDECAR_ARTIFACTS_YAML.format(image=base_ref))
    (task / "instruction.md").write_text("Write 'solved' to /exchange/answer.txt.\n")
    toml = SIDECAR_ARTIFACTS_TOML
    if separate:
        toml = toml.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    (task / "task.toml").write_text(toml)
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho solved > /exchange/answer.txt\n")
    (task / "tests").mkdir()
    test = SIDECAR_ARTIFACTS_TEST
    if not separate:  # main has the volume, not the sidecar's own /srv
        test = test.replace("/srv/evidence.txt", "/exchange/answer.txt")
    (task / "tests" / "test.sh").write_text(test)
    if separate:
        (task / "tests" / "Dockerfile").write_text(f"FROM {base_ref}\nCOPY test.sh /tests/test.sh\n")
    return task


def test_a_sidecar_writes_artifacts_through_compose_volumes(harbor, sandbox_service, api, base_ref, tmp_path):
    """Harbor 0.25 runs two tasks shaped like its sidecar-artifacts example: a sidecar writes its
    /logs/artifacts (``${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}``), which is main's, and reads what
    the agent wrote in a named volume they share. With a shared verifier, the verifier reads both in
    main; with a separate one, Harbor stops main (``stop_service``) before it collects the sidecar's
    evidence, then copies the artifacts into the verifier's own sandbox."""
    dataset = tmp_path / "dataset"
    write_sidecar_artifacts_task(dataset, "sidecar-shared", base_ref, separate=False)
    write_sidecar_artifacts_task(dataset, "sidecar-separate", base_ref, separate=True)
    started = api.json("GET", "/sandboxes")[1]
    results = harbor_run(harbor, sandbox_service, tmp_path, dataset, "oracle", concurrent=2)
    trials = tmp_path / "jobs" / "oracle"
    outputs = {result["task_name"]: list((trials / result["trial_name"]).rglob("*.txt")) for result in results}
    outputs = {name: {path.name: path.read_text()[-500:] for path in paths} for name, paths in outputs.items()}
    assert {result["task_name"]: reward(result) for result in results} == {
        "sidecar-shared": 1.0,
        "sidecar-separate": 1.0,
    }, outputs
    for result in results:  # Harbor downloaded main's /logs/artifacts: the sidecar's file is in it
        found = list((trials / result["trial_name"] / "artifacts").rglob("sidecar.txt"))
        assert [path.read_text() for path in found] == ["recorded-by-sidecar\n"], result["task_name"]
    # the separate task's agent sandbox had main stopped by Harbor before its sidecar's evidence was taken
    seen = {sandbox["sandbox_id"] for sandbox in started}
    made = [sandbox for sandbox in api.json("GET", "/sandboxes")[1] if sandbox["sandbox_id"] not in seen]
    with_sidecars = [sandbox["environment"] for sandbox in made if (sandbox["environment"] or {}).get("services")]
    assert sorted(environment.get("state", "running") for environment in with_sidecars) == ["running", "stopped"]
    assert live_sandboxes(api) == []
