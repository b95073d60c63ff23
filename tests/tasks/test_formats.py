"""Harbor and Terminal-Bench 1.x task folders read into a TaskSpec (SPEC §17), and workspace.yaml's grader."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import (
    AGENT,
    ENVIRONMENT,
    VERIFIER,
    ArtifactEntry,
    Collect,
    Healthcheck,
    ImageEnvironment,
    NetworkRequest,
    Service,
    SupportFile,
    TaskError,
    TaskRequest,
    Verifier,
)
from tests.tasks.test_workspace import make_task

HARBOR_TOML = """\
version = "1.0"

[metadata]
difficulty = "easy"
created = 2025-01-02

[agent]
timeout_sec = 300
user = "root"

[verifier]
timeout_sec = 60.5
isolated = true

[verifier.env]
MODE = "strict"

[environment]
cpus = 2
memory = "2G"
storage_mb = 4096
build_timeout_sec = 900
network_mode = "allowlist"
allowed_hosts = ["PyPI.org.", "*.pythonhosted.org", "10.0.0.0/8"]
mcp_servers = []

[environment.env]
LANG = "C.UTF-8"
"""

TB_YAML = """\
instruction: |
  Create hello.txt saying hello.
author_name: someone
difficulty: easy
tags: [file, beginner]
parser_name: pytest
max_agent_timeout_sec: 120
max_test_timeout_sec: 30
run_tests_in_same_shell: false
"""

TB_COMPOSE = """\
services:
  client:
    build:
      dockerfile: Dockerfile
    image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
    container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
    command: [ "sh", "-c", "sleep infinity" ]
    environment:
      - TEST_DIR=${T_BENCH_TEST_DIR}
    volumes:
      - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}
"""


write = make_task  # a task folder from {path: content} (tests/tasks/test_workspace.py)


def harbor(tmp_path, toml: str = HARBOR_TOML, **extra: str | None) -> Path:
    files = {
        "task.toml": toml,
        "instruction.md": "Make the tests pass.\n",
        "environment/Dockerfile": "FROM debian:bookworm\nRUN apt-get install -y python3\n",
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        "tests/data/expected.json": '{"a": 1}\n',
        "solution/solve.sh": "#!/bin/bash\ncp /solution/answer.txt .\n",
        "solution/answer.txt": "42\n",
    }
    files.update(extra)
    root = write(
        tmp_path / "harbor-task", {k: v for k, v in files.items() if v is not None}, executable=("tests/test.sh",)
    )
    return root


def terminal_bench(tmp_path, task_yaml: str = TB_YAML, **extra: str | None) -> Path:
    files = {
        "task.yaml": task_yaml,
        "Dockerfile": "FROM python:3.12-slim\nWORKDIR /app\n",
        "docker-compose.yaml": TB_COMPOSE,
        "run-tests.sh": "#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n",
        "tests/test_outputs.py": "def test_hello():\n    assert open('/app/hello.txt').read() == 'hello\\n'\n",
        "solution.sh": "#!/bin/bash\necho hello > hello.txt\n",
    }
    files.update(extra)
    return write(tmp_path / "tb-task", {k: v for k, v in files.items() if v is not None}, executable=("run-tests.sh",))


def error(root: Path, **kwargs) -> str:
    with pytest.raises(TaskError) as info:
        load_task(root, **kwargs)
    return str(info.value)


# -- Harbor ------------------------------------------------------------------------------------


def test_a_full_harbor_task(tmp_path):
    spec = load_task(harbor(tmp_path))
    assert (spec.format, spec.grader, spec.repo, spec.base_commit, spec.cache) == (
        "harbor",
        "reward_file",
        None,
        None,
        False,
    )
    assert spec.tests == [] and spec.support_files == []
    assert spec.prompt == "Make the tests pass.\n"
    assert spec.environment == ImageEnvironment(dockerfile="environment/Dockerfile", context="environment")
    assert spec.env == {"LANG": "C.UTF-8"}
    assert spec.verifier == Verifier(
        script="test.sh",
        files=[
            SupportFile("data/expected.json", b'{"a": 1}\n', 0o644),
            SupportFile("test.sh", b"#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n", 0o755),
        ],
        env={"MODE": "strict"},
        isolated=True,
    )
    assert spec.request == TaskRequest(
        agent_timeout_secs=300.0,
        verifier_timeout_secs=60.5,
        build_timeout_secs=900.0,
        cpus=2.0,
        memory_mb=2048,
        storage_mb=4096,
        network=NetworkRequest("allowlist", ("pypi.org", "*.pythonhosted.org", "10.0.0.0/8")),
        agent_user="root",
    )
    # [metadata] and what was not read, in task.toml's own shape; a TOML date as ISO text.
    assert spec.metadata == {
        "version": "1.0",
        "metadata": {"difficulty": "easy", "created": "2025-01-02"},
        "environment": {"mcp_servers": []},
    }
    assert spec.solution == "#!/bin/bash\ncp /solution/answer.txt .\n"
    assert [f.relpath for f in spec.solution_files] == ["answer.txt", "solve.sh"]


def test_a_minimal_harbor_task_asks_for_nothing(tmp_path):
    root = harbor(tmp_path, "", **{"solution/solve.sh": None, "solution/answer.txt": None})
    spec = load_task(root)
    assert spec.request == TaskRequest()
    assert spec.metadata == {} and spec.env == {} and spec.verifier.env == {} and not spec.verifier.isolated
    assert spec.solution is None and spec.solution_files == []


PACKAGE = """\
schema_version = "1.4"

[task]
name = "acme/fix-greeting"
version = "2.1.0-rc1"
description = "Fix the greeting."
keywords = ["shell"]
authors = [{ name = "Ada", email = "ada@example.com" }, { name = "Bo" }]
"""


def test_task_name_and_version_are_checked_and_kept_in_the_metadata(tmp_path):
    spec = load_task(harbor(tmp_path, PACKAGE))
    assert spec.metadata == {
        "schema_version": "1.4",
        "task": {
            "name": "acme/fix-greeting",
            "version": "2.1.0-rc1",
            "description": "Fix the greeting.",
            "keywords": ["shell"],
            "authors": [{"name": "Ada", "email": "ada@example.com"}, {"name": "Bo"}],
        },
    }
    assert load_task(harbor(tmp_path / "b", '[task]\nname = "a.b/c_d-1"\n')).metadata == {"task": {"name": "a.b/c_d-1"}}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("task = 1\n", "task.toml: [task] must be a table, got a number"),
        ('[task]\nversion = "1"\n', "task.toml: [task] name is required in [task] (the package's name, as in 'org/name')"),
        ("[task]\nname = 7\n", "task.toml: [task] name must be a string such as 'org/name', got a number"),
        *(
            (
                f"[task]\nname = {name!r}\n",
                "task.toml: [task] name must be 'org/name' (letters, digits, '.', '_' and '-', each part starting "
                f"with a letter or digit, no '..'), got {name!r}",
            )
            for name in ("hello", "a/b/c", "/b", "a/.b", "a/b..c", "a b/c", "a/", "")
        ),
        ('[task]\nname = "a/b"\nversion = 1\n', "task.toml: [task] version must be a string, got a number"),
        ('[task]\nname = "a/b"\nversion = ""\n', "task.toml: [task] version must not be empty"),
        ('[task]\nname = "a/b"\ndescription = []\n', "task.toml: [task] description must be a string, got a list"),
        ('[task]\nname = "a/b"\nkeywords = "x"\n', "task.toml: [task] keywords must be a list of strings, got a string"),
        ('[task]\nname = "a/b"\nkeywords = ["x", 2]\n', "task.toml: [task] keywords[1] must be a string, got a number"),
        ('[task]\nname = "a/b"\nauthors = "Ada"\n',
         "task.toml: [task] authors must be a list of {name, email} tables, got a string"),
        ('[task]\nname = "a/b"\nauthors = [{ email = "a@b" }]\n',
         "task.toml: [task] authors[0] must be a table with a name (a string) and an optional email"),
        ('[task]\nname = "a/b"\nauthors = ["Ada"]\n',
         "task.toml: [task] authors[0] must be a table with a name (a string) and an optional email"),
        ('[task]\nname = "a/b"\nauthors = [{ name = "A", email = 1 }]\n',
         "task.toml: [task] authors[0] email must be a string, got a number"),
        ("schema_version = 1.4\n", "task.toml: schema_version must be a string, got a number"),
    ],
)  # fmt: skip
def test_a_bad_task_table_is_named(tmp_path, toml, message):
    assert error(harbor(tmp_path, toml)) == message


def test_solution_env_is_the_solutions_and_not_the_metadatas(tmp_path):
    toml = '[solution]\nnote = "kept"\n[solution.env]\nANSWER = "42"\nEMPTY = ""\n'
    spec = load_task(harbor(tmp_path, toml))
    assert spec.solution_env == {"ANSWER": "42", "EMPTY": ""} and spec.env == {}
    assert spec.metadata == {"solution": {"note": "kept"}}
    assert load_task(harbor(tmp_path / "b", "")).solution_env == {}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("solution = 1\n", "task.toml: [solution] must be a table, got a number"),
        ('[solution]\nenv = "A=1"\n', "task.toml: [solution.env] must be a table, got a string"),
        ("[solution.env]\nA = 1\n", "task.toml: [solution.env] A must be a string, got a number"),
        (
            '[solution.env]\n"a-b" = "1"\n',
            "task.toml: [solution.env] a-b is not a valid variable name ([A-Z_][A-Z0-9_]*)",
        ),
        (
            '[solution.env]\nKEY = "${KEY:-x}"\n',
            "task.toml: [solution.env] KEY takes its value from the host's environment (${KEY:-x}); "
            "this executor passes nothing of its own environment to a task",
        ),
    ],
)
def test_a_bad_solution_env_is_named(tmp_path, toml, message):
    assert error(harbor(tmp_path, toml)) == message


def test_workdir_overrides_the_images(tmp_path):
    spec = load_task(harbor(tmp_path, '[environment]\nworkdir = "/app//src/"\n'))
    assert spec.environment == ImageEnvironment(
        dockerfile="environment/Dockerfile", context="environment", workdir="/app/src"
    )


def test_docker_image_wins_over_the_dockerfile(tmp_path):
    spec = load_task(harbor(tmp_path, '[environment]\ndocker_image = "ghcr.io/org/task:1"\n'))
    assert spec.environment == ImageEnvironment(image="ghcr.io/org/task:1")
    root = harbor(
        tmp_path / "b", '[environment]\ndocker_image = "python:3.12-slim"\n', **{"environment/Dockerfile": None}
    )
    assert load_task(root).environment == ImageEnvironment(image="python:3.12-slim")


N = NetworkRequest


@pytest.mark.parametrize(
    ("toml", "environment", "agent", "verifier"),
    [
        ("", N(), N(), N()),  # nothing said: public
        ("[environment]\nallow_internet = false\n", N("no-network"), N("no-network"), N("no-network")),
        ("[environment]\nallow_internet = true\n", N(), N(), N()),
        ('[environment]\nallow_internet = false\nnetwork_mode = "public"\n', N(), N(), N()),  # network_mode wins
        # Harbor's quirk, kept: allowed_hosts (even empty) set, the older allow_internet is not read.
        ("[environment]\nallow_internet = false\nallowed_hosts = []\n", N(), N(), N()),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org"]\n[agent]\nnetwork_mode = "public"\n',
            N("allowlist", ("a.org",)), N(), N("allowlist", ("a.org",)),
        ),  # the agent's phase overrides; the verifier's has the environment's
        (
            '[agent]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["::1", "2001:DB8::/32", "10.0.0.0/8", "192.0.2.7", "*.Example.org.", "a.org", "A.org"]\n',
            N(), N("no-network"), N("allowlist", ("::1", "2001:db8::/32", "10.0.0.0/8", "192.0.2.7", "*.example.org", "a.org")),
        ),
        (  # an override replaces the environment's whole policy: its hosts are not added to
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org"]\n'
            '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["b.org"]\n',
            N("allowlist", ("a.org",)), N("allowlist", ("b.org",)), N("allowlist", ("a.org",)),
        ),
        (  # a phase may have the network the environment has not, and an allowlist of nothing
            '[environment]\nnetwork_mode = "no-network"\n[agent]\nnetwork_mode = "allowlist"\n'
            '[verifier]\nnetwork_mode = "public"\nallowed_hosts = []\n',
            N("no-network"), N("allowlist"), N(),
        ),
    ],
)  # fmt: skip
def test_each_phase_has_its_network(tmp_path, toml, environment, agent, verifier):
    request = load_task(harbor(tmp_path, toml)).request
    assert [request.phase_network(phase) for phase in (ENVIRONMENT, AGENT, VERIFIER)] == [environment, agent, verifier]


def test_allow_internet_is_environments_alone(tmp_path):
    """Harbor reads allow_internet in [environment] only: in [agent] it is a key Harbor does not know."""
    spec = load_task(harbor(tmp_path, "[agent]\nallow_internet = false\n"))
    assert spec.request.phase_network(AGENT) == N() and spec.metadata == {"agent": {"allow_internet": False}}


@pytest.mark.parametrize(
    ("environment", "memory", "storage"),
    [
        ('memory = "512M"\nstorage = "1G"', 512, 1024),
        ('memory = "2048K"', 2, None),
        ('memory = "1G"\nmemory_mb = 1024', 1024, None),
    ],
)
def test_harbor_sizes(tmp_path, environment, memory, storage):
    spec = load_task(harbor(tmp_path, f"[environment]\n{environment}\n"))
    assert (spec.request.memory_mb, spec.request.storage_mb) == (memory, storage)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[agent]\ntimeout_sec = "300"\n', "task.toml: [agent] timeout_sec must be a positive number, got a string"),
        ("[agent]\ntimeout_sec = 0\n", "task.toml: [agent] timeout_sec must be a positive number, got 0"),
        ("[agent]\ntimeout_sec = -5.5\n", "task.toml: [agent] timeout_sec must be a positive number, got -5.5"),
        ("[agent]\ntimeout_sec = nan\n", "task.toml: [agent] timeout_sec must be a positive number, got nan"),
        (
            "[verifier]\ntimeout_sec = true\n",
            "task.toml: [verifier] timeout_sec must be a positive number, got a boolean",
        ),
        ("[environment]\ncpus = [2]\n", "task.toml: [environment] cpus must be a positive number, got a list"),
        (
            "[environment]\nmemory_mb = 1.5\n",
            "task.toml: [environment] memory_mb must be a positive whole number, got 1.5",
        ),
        (
            "[environment]\nstorage_mb = 0\n",
            "task.toml: [environment] storage_mb must be a positive whole number, got 0",
        ),
        (
            '[environment]\nmemory = "lots"\n',
            "task.toml: [environment] memory must be a size such as '2G', '512M' or '1024K', got 'lots'",
        ),
        ('[environment]\nmemory = "0M"\n', "task.toml: [environment] memory must be at least 1M, got '0M'"),
        (
            '[environment]\nmemory = "1G"\nmemory_mb = 512\n',
            "task.toml: [environment] memory = '1G' (1024 MB) disagrees with memory_mb = 512",
        ),
        (
            "[environment]\nbuild_timeout_sec = {}\n",
            "task.toml: [environment] build_timeout_sec must be a positive number, got dict",
        ),
        ('agent = "fast"\n', "task.toml: [agent] must be a table, got a string"),
        ("metadata = 3\n", "task.toml: [metadata] must be a table, got a number"),
        ("[verifier]\nenv = []\n", "task.toml: [verifier.env] must be a table, got a list"),
        ("version = 2\n", "task.toml: version must be a string, got a number"),
        ("[verifier]\nisolated = 1\n", "task.toml: [verifier] isolated must be true or false, got a number"),
        (
            '[environment]\nallow_internet = "no"\n',
            "task.toml: [environment] allow_internet must be true or false, got a string",
        ),
        (
            '[environment]\nnetwork_mode = "host"\n',
            "task.toml: [environment] network_mode must be one of no-network, public, allowlist, got 'host'",
        ),
        (
            "[agent]\nnetwork_mode = 1\n",
            "task.toml: [agent] network_mode must be one of no-network, public, allowlist, got a number",
        ),
        (
            '[environment]\nnetwork_mode = "public"\nallowed_hosts = ["a.org"]\n',
            "task.toml: [environment] allowed_hosts goes with network_mode = 'allowlist', not 'public'",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = "a.org"\n',
            "task.toml: [environment] allowed_hosts must be a list of host names, addresses or CIDRs, got a string",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://a.org/x"]\n',
            "task.toml: [environment] allowed_hosts: 'https://a.org/x' is a URL; give a host name, an address or a CIDR",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org:443"]\n',
            "task.toml: [environment] allowed_hosts: 'a.org:443' names a port; give a host name, an address or a "
            "CIDR (every port is allowed)",
        ),
        (
            '[environment]\nos = "windows"\n',
            "task.toml: [environment] os = 'windows': Windows tasks cannot run here (Linux only)",
        ),
        (
            '[environment]\nos = "Windows"\n',
            "task.toml: [environment] os = 'windows': Windows tasks cannot run here (Linux only)",
        ),
        ('[environment]\nos = "macos"\n', "task.toml: [environment] os must be linux or windows, got 'macos'"),
        ("[environment]\ngpus = 1\n", "task.toml: [environment] gpus = 1: this executor has no GPUs"),
        ('[environment]\ngpus = "1"\n', "task.toml: [environment] gpus must be a whole number, got a string"),
        ('[environment.tpu]\ntype = "v6e"\n', "task.toml: [environment] tpu: this executor has no TPUs"),
        (
            '[environment]\nworkdir = "app"\n',
            "task.toml: [environment] workdir must be an absolute path without '..' or control characters, got 'app'",
        ),
        (
            '[environment]\nworkdir = "/app/../etc"\n',
            "task.toml: [environment] workdir must be an absolute path without '..' or control characters, "
            "got '/app/../etc'",
        ),
        ("[environment]\nworkdir = 1\n", "task.toml: [environment] workdir must be a string, got a number"),
        (
            '[[steps]]\nname = "one"\n',
            "task.toml has [[steps]] but the task has no steps/ folder (steps/<name>/instruction.md)",
        ),
        (
            '[verifier.env]\nOPENAI_API_KEY = "${OPENAI_API_KEY}"\n',
            "task.toml: [verifier.env] OPENAI_API_KEY takes its value from the host's environment "
            "(${OPENAI_API_KEY}); this executor passes nothing of its own environment to a task",
        ),
        (
            '[environment.env]\nlower = "x"\n',
            "task.toml: [environment.env] lower is not a valid variable name ([A-Z_][A-Z0-9_]*)",
        ),
        ("[environment.env]\nN = 1\n", "task.toml: [environment.env] N must be a string, got a number"),
        (
            '[verifier]\ngrader = "exit_code"\n',
            "task.toml: [verifier] grader must be one of reward_file, pytest, swebench, got 'exit_code'",
        ),
        (
            '[environment]\ndocker_image = "Python:3"\n',
            "task.toml: [environment] docker_image: The image reference 'Python:3' must be lower case in its "
            "repository name.",
        ),
        (
            '[environment]\ndocker_image = ""\n',
            "task.toml: [environment] docker_image must be an image reference such as python:3.12-slim",
        ),
        (
            "[agent\n",
            "task.toml is not valid TOML (Expected ']' at the end of a table declaration (at line 1, column 7))",
        ),
        ("[agent]\nuser = true\n", "task.toml: [agent] user must be a user name or a uid, got a boolean"),
        ("[agent]\nuser = -1\n", "task.toml: [agent] user must be a uid from 0 to 65535, got -1"),
        ("[verifier]\nuser = 65536\n", "task.toml: [verifier] user must be a uid from 0 to 65535, got 65536"),
        ("[verifier]\nuser = 1.5\n", "task.toml: [verifier] user must be a user name or a uid, got a number"),
        *(
            (
                f"[agent]\nuser = {value!r}\n",
                f"task.toml: [agent] user must be a user name or uid, optionally ':group' (as Docker's --user), "
                f"got {value!r}",
            )
            for value in ("", "a b", "dev:", ":dev", "../root", "x" * 33, "dev/x")
        ),
    ],
)
def test_bad_task_toml_is_named(tmp_path, toml, message):
    assert error(harbor(tmp_path, toml)) == message


ALLOWLIST_IN = '[{}]\nnetwork_mode = "allowlist"\nallowed_hosts = {}\n'
NOT_A_NAME = "is not a host name (letters, digits and hyphens between dots), an address or a CIDR"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            ALLOWLIST_IN.format("verifier", '["10.0.0.1/8"]'),
            "task.toml: [verifier] allowed_hosts: '10.0.0.1/8' has host bits set; did you mean 10.0.0.0/8?",
        ),
        (
            ALLOWLIST_IN.format("agent", '["10.0.0.0/33"]'),
            "task.toml: [agent] allowed_hosts: '10.0.0.0/33' is not a valid IP address or network "
            "('10.0.0.0/33' does not appear to be an IPv4 or IPv6 network)",
        ),
        (
            ALLOWLIST_IN.format("verifier", '["2001:db8::1/32"]'),
            "task.toml: [verifier] allowed_hosts: '2001:db8::1/32' has host bits set; did you mean 2001:db8::/32?",
        ),
        (
            '[agent]\nallowed_hosts = ["a.org"]\n',
            "task.toml: [agent] allowed_hosts goes with network_mode = 'allowlist', and [agent] sets no "
            "network_mode (without one the phase has [environment]'s network)",
        ),
        (
            "[verifier]\nallowed_hosts = []\n",
            "task.toml: [verifier] allowed_hosts goes with network_mode = 'allowlist', and [verifier] sets no "
            "network_mode (without one the phase has [environment]'s network)",
        ),
        (
            '[environment]\nallowed_hosts = ["example.com"]\n',
            "task.toml: [environment] allowed_hosts goes with network_mode = 'allowlist', and [environment] sets "
            "no network_mode (public by default)",
        ),
        (
            '[verifier]\nnetwork_mode = "no-network"\nallowed_hosts = ["a.org"]\n',
            "task.toml: [verifier] allowed_hosts goes with network_mode = 'allowlist', not 'no-network'",
        ),
        (
            "[verifier]\nnetwork_mode = true\n",
            "task.toml: [verifier] network_mode must be one of no-network, public, allowlist, got a boolean",
        ),
        (
            '[verifier]\nnetwork_mode = "Allowlist"\n',
            "task.toml: [verifier] network_mode must be one of no-network, public, allowlist, got 'Allowlist'",
        ),
        (
            ALLOWLIST_IN.format("verifier", "[1]"),
            "task.toml: [verifier] allowed_hosts[0] must be a string, got a number",
        ),
        (
            ALLOWLIST_IN.format("agent", '{a = "b"}'),
            "task.toml: [agent] allowed_hosts must be a list of host names, addresses or CIDRs, got dict",
        ),
        (
            ALLOWLIST_IN.format("agent", '["a.org", " "]'),
            "task.toml: [agent] allowed_hosts: an entry is empty; give a host name, an address or a CIDR",
        ),
        (
            ALLOWLIST_IN.format("verifier", '["[::1]"]'),
            "task.toml: [verifier] allowed_hosts: '[::1]' has brackets; give the address alone (as in ::1), "
            "without a port",
        ),
        (
            ALLOWLIST_IN.format("verifier", '["[::1]:443"]'),
            "task.toml: [verifier] allowed_hosts: '[::1]:443' has brackets; give the address alone (as in ::1), "
            "without a port",
        ),
        (
            ALLOWLIST_IN.format("agent", '["192.0.2.1:80"]'),
            "task.toml: [agent] allowed_hosts: '192.0.2.1:80' names a port; give a host name, an address or a "
            "CIDR (every port is allowed)",
        ),
        (
            ALLOWLIST_IN.format("agent", '["fe80::1%eth0"]'),
            "task.toml: [agent] allowed_hosts: 'fe80::1%eth0' has an IPv6 zone ('%...'); give the address without it",
        ),
        (
            ALLOWLIST_IN.format("agent", '["*"]'),
            "task.toml: [agent] allowed_hosts: '*' has a wildcard other than a leading '*.' (as in *.example.com)",
        ),
        (
            ALLOWLIST_IN.format("agent", '["a.*.org"]'),
            "task.toml: [agent] allowed_hosts: 'a.*.org' has a wildcard other than a leading '*.' (as in "
            "*.example.com)",
        ),
        (
            ALLOWLIST_IN.format("agent", '["*.192.0.2.1"]'),
            "task.toml: [agent] allowed_hosts: '*.192.0.2.1' is neither an IP address, a CIDR network nor a host name",
        ),
        (ALLOWLIST_IN.format("verifier", '["a_b.example"]'), f"task.toml: [verifier] allowed_hosts: 'a_b.example' {NOT_A_NAME}"),
        (ALLOWLIST_IN.format("verifier", '["*.bücher.de"]'), f"task.toml: [verifier] allowed_hosts: '*.bücher.de' {NOT_A_NAME}"),
        (ALLOWLIST_IN.format("verifier", '["bücher.de"]'), f"task.toml: [verifier] allowed_hosts: 'bücher.de' {NOT_A_NAME}"),
        (ALLOWLIST_IN.format("verifier", '["a.org/x"]'),
         "task.toml: [verifier] allowed_hosts: 'a.org/x' is not a valid IP address or network ('a.org/x' does not "
         "appear to be an IPv4 or IPv6 network)"),
    ],
)  # fmt: skip
def test_a_bad_network_is_named_by_its_table_and_key(tmp_path, toml, message):
    assert error(harbor(tmp_path, toml)) == message


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("instruction.md", "task has no instruction.md (required)"),
        ("tests/test.sh", "task has no tests/test.sh (required)"),
        (
            "environment/Dockerfile",
            "task has neither environment/Dockerfile nor task.toml [environment] docker_image: it has no environment",
        ),
    ],
)
def test_a_missing_harbor_file_is_named(tmp_path, missing, message):
    assert error(harbor(tmp_path, **{missing: None})) == message


def test_a_harbor_task_without_tests_is_refused(tmp_path):
    root = harbor(tmp_path)
    shutil.rmtree(root / "tests")
    assert error(root) == "task has no tests/test.sh (required)"
    (root / "tests").write_text("not a folder")
    assert error(root) == "tests is not a folder"


SERVICES = """services:
  main:
    build: .
    depends_on: {web: {condition: service_healthy}}
  web:
    image: registry.example/web:1
    command: python3 -m http.server 8000
    environment: {MODE: fast, COUNT: 2, ENABLED: true, PRICE: "$$5"}
    healthcheck: {test: [CMD-SHELL, "curl -f localhost:8000"], interval: 1m30s, timeout: 500ms, retries: 5,
                  start_period: 0s, start_interval: 2s}
    depends_on: [db]
    ports: ["8000:8000"]
    x-note: ignored
  db:
    build: {context: db, dockerfile: Dockerfile.db, args: [VERSION=16], target: run}
    entrypoint: [docker-entrypoint.sh]
    environment: [POSTGRES_PASSWORD=secret]
    user: "999"
    working_dir: /var/lib/db
"""


def test_several_compose_services_main_and_the_others_in_start_order(tmp_path):
    toml = (  # artifacts is a top-level key: before [[verifier.collect]]'s table
        'artifacts = [{source = "/dump.sql", service = "db"}, "/app/out.txt"]\n'
        + HARBOR_TOML
        + '[[verifier.collect]]\nservice = "db"\ncommand = "pg_dump > /dump.sql"\ntimeout_sec = 5\n'
    )
    root = harbor(tmp_path, toml=toml, **{"environment/docker-compose.yaml": SERVICES,
                                           "environment/db/Dockerfile.db": "FROM postgres\n"})  # fmt: skip
    spec = load_task(root)
    db, web = spec.services  # db first: web depends on it
    assert db == Service(
        name="db",
        environment=ImageEnvironment(
            dockerfile="environment/db/Dockerfile.db",
            context="environment/db",
            build_args={"VERSION": "16"},
            target="run",
        ),  # fmt: skip
        entrypoint=("docker-entrypoint.sh",),
        env={"POSTGRES_PASSWORD": "secret"},
        user="999",
        workdir="/var/lib/db",
    )
    assert web.environment == ImageEnvironment(image="registry.example/web:1")
    assert web.command == ("python3", "-m", "http.server", "8000") and web.depends_on == {"db": "service_started"}
    assert web.env == {"MODE": "fast", "COUNT": "2", "ENABLED": "true", "PRICE": "$5"}  # $$: a literal $
    assert web.healthcheck == Healthcheck(command="/bin/sh -c 'curl -f localhost:8000'",
                                          argv=("/bin/sh", "-c", "curl -f localhost:8000"), interval_sec=90.0,
                                          timeout_sec=0.5, retries=5, start_period_sec=0.0,
                                          start_interval_sec=2.0)  # fmt: skip
    assert spec.collect == (Collect(command="pg_dump > /dump.sql", service="db", timeout_secs=5.0),)
    assert spec.artifacts == (ArtifactEntry(source="/dump.sql", service="db"), ArtifactEntry(source="/app/out.txt"))
    assert spec.artifacts[0].listed == "artifacts/dump.sql"  # as Harbor's: every service's under artifacts/
    relative = 'artifacts = [{source = "dump.sql", service = "db"}]\n' + HARBOR_TOML
    root = harbor(tmp_path / "relative", toml=relative, **{"environment/docker-compose.yaml": SERVICES,
                                                          "environment/db/Dockerfile.db": "FROM postgres\n"})  # fmt: skip
    assert error(root) == "task.toml: artifacts[0] source must be an absolute path in service 'db', got 'dump.sql'"
    one = harbor(tmp_path / "one", **{"environment/docker-compose.yaml": "services:\n  main: {build: .}\n"})
    assert load_task(one).services == ()


@pytest.mark.parametrize(
    ("compose", "names"),
    [
        ("services:\n  helper:\n    image: python:3.12-slim\n    command: [sleep, infinity]\n", ["helper"]),
        ("services:\n  app: {build: .}\n  db: {image: postgres}\n", ["app", "db"]),
    ],
)
def test_a_compose_file_without_main_has_only_services_beside_the_tasks_environment(tmp_path, compose, names):
    """Harbor lays the task's file over its own, whose main is the task's environment/Dockerfile (or
    docker_image): a file naming no main, even of one service, adds services and leaves main alone (its
    Harbor example network-policy-matrix/static/compose-sidecar-controlled has a lone ``helper``)."""
    spec = load_task(harbor(tmp_path / "task", **{"environment/docker-compose.yaml": compose}))
    assert sorted(service.name for service in spec.services) == names
    plain = load_task(harbor(tmp_path / "plain"))  # main as a task without a compose file has it
    assert spec.first_process == plain.first_process, spec.first_process  # not a service's command
    assert spec.environment.dockerfile == "environment/Dockerfile"


@pytest.mark.parametrize(
    ("compose", "message"),
    [
        ("services:\n  main: {}\n  db: {image: postgres, privileged: true}\n",
         "environment/docker-compose.yaml: service 'db': key 'privileged' is not supported here (a service may say "
         "image, build, command, entrypoint, environment, healthcheck, depends_on, working_dir, user, ports, expose, "
         "volumes)"),
        ("services:\n  main: {}\n  db: {command: run}\n",
         "environment/docker-compose.yaml: service 'db' has neither 'image' nor 'build': it has nothing to run"),
        ("services:\n  main: {}\n  db: {image: postgres, environment: {PASSWORD: '${PASSWORD}'}}\n",
         "environment/docker-compose.yaml: service 'db': 'environment': PASSWORD takes a value from the host's "
         "environment (${PASSWORD}); this executor passes nothing of its own environment to a task"),
        ("services:\n  main: {}\n  db: {image: postgres, environment: [PASSWORD]}\n",
         "environment/docker-compose.yaml: service 'db': 'environment' 'PASSWORD' takes its value from the host's "
         "environment; this executor passes nothing of its own environment to a task"),
        ("services:\n  main: {}\n  db: {image: postgres, command: 'run --home $HOME'}\n",
         "environment/docker-compose.yaml: service 'db': 'command' takes a value from the host's environment "
         "(run --home $HOME); this executor passes nothing of its own environment to a task"),
        ("services:\n  main: {}\n  db: {image: postgres, command: {run: 1}}\n",
         "environment/docker-compose.yaml: service 'db': 'command' must be a string or a list of strings, got dict"),
        ("services:\n  main: {}\n  db: {image: postgres, healthcheck: {test: [CMD, pg_isready], interval: 10}}\n",
         "environment/docker-compose.yaml: service 'db': 'healthcheck' 'interval' must be a duration such as 10s, "
         "500ms or 1m30s, got 10"),
        ("services:\n  main: {}\n  db: {image: postgres, healthcheck: {test: [RUN, pg_isready]}}\n",
         "environment/docker-compose.yaml: service 'db': 'healthcheck' 'test' must start with CMD (an argv) or "
         "CMD-SHELL (one command), got ['RUN', 'pg_isready']"),
        ("services:\n  main: {}\n  db: {image: postgres, healthcheck: {test: true}}\n",
         "environment/docker-compose.yaml: service 'db': 'healthcheck' 'test' must be a command (a string, or a list "
         "starting with CMD or CMD-SHELL)"),
        ("services:\n  main: {}\n  db: {image: postgres, healthcheck: {test: 'true', retries: 0}}\n",
         "environment/docker-compose.yaml: service 'db': 'healthcheck' 'retries' must be a whole number of at least 1, "
         "got 0"),
        ("services:\n  main: {depends_on: [cache]}\n  db: {image: postgres}\n",
         "environment/docker-compose.yaml: service 'main': 'depends_on' names 'cache', which is not a service of "
         "environment/docker-compose.yaml"),
        ("services:\n  main: {depends_on: {db: {condition: service_healthy}}}\n  db: {image: postgres}\n",
         "environment/docker-compose.yaml: service 'main': 'depends_on': 'db' condition service_healthy, and 'db' has "
         "no healthcheck"),
        ("services:\n  main: {}\n  db: {image: postgres, depends_on: {a: {condition: service_completed_successfully}}}\n",
         "environment/docker-compose.yaml: service 'db': 'depends_on': 'a' condition 'service_completed_successfully' "
         "is not supported here (only service_started, service_healthy)"),
        ("services:\n  main: {}\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [a]}\n",
         "environment/docker-compose.yaml: 'depends_on' makes a cycle (a -> b -> a)"),
        ("services:\n  main: {}\n  a: {image: x, depends_on: [a]}\n",
         "environment/docker-compose.yaml: service 'a': 'depends_on' names the service itself"),
        ("services:\n  main: {}\n  a: {image: x, depends_on: {main: {condition: service_healthy}}}\n",
         "environment/docker-compose.yaml: service 'a': 'depends_on': 'main' can only be waited for as "
         "service_started (it is the agent's)"),
        ("services:\n  main: {}\n  db: {build: ../..}\n",
         "environment/docker-compose.yaml: service 'db': 'build' 'context' '../..' must be a relative path inside the "
         "task, without '..'"),
        ("services:\n  main: {}\n  db: {build: {context: ., dockerfile: Missing}}\n",
         "environment/docker-compose.yaml: service 'db': 'build' 'dockerfile' 'Missing' is not a file of the task"),
        ("services:\n  main: {}\n  db: {build: {context: ., network: host}}\n",
         "environment/docker-compose.yaml: service 'db': 'build' key 'network' is not supported here (only context, "
         "dockerfile, args, target)"),
        ("services:\n  main: {}\n  'bad name': {image: x}\n",
         "environment/docker-compose.yaml: service name 'bad name' must start with a letter or digit and hold only "
         "letters, digits, '_', '.' and '-'"),
    ],
)  # fmt: skip
def test_bad_compose_services_are_refused_naming_service_and_key(tmp_path, compose, message):
    root = harbor(tmp_path, **{"environment/docker-compose.yaml": compose})
    assert error(root) == message


@pytest.mark.parametrize(
    ("collect", "message"),
    [
        ('service = "db"\n', "task.toml: [[verifier.collect]] 1: 'command' must be a shell command (a non-empty string)"),
        ('command = "x"\nservice = "cache"\n',
         "task.toml: [[verifier.collect]] 1: 'service' 'cache' is not a service of environment/docker-compose.yaml "
         "(db, main)"),
        ('command = "x"\ntimeout_sec = 0\n', "task.toml: [[verifier.collect]] 1: 'timeout_sec' must be a positive number, got 0"),
        ('command = "x"\nshell = "bash"\n',
         "task.toml: [[verifier.collect]] 1: key 'shell' is not one of command, service, timeout_sec, user"),
    ],
)  # fmt: skip
def test_bad_collect_commands_are_refused(tmp_path, collect, message):
    compose = "services:\n  main: {build: .}\n  db: {image: postgres}\n"
    root = harbor(tmp_path, toml=HARBOR_TOML + "[[verifier.collect]]\n" + collect,
                  **{"environment/docker-compose.yaml": compose})  # fmt: skip
    assert error(root) == message


def test_harbor_files_are_held_to_the_caps_and_rules(tmp_path):
    root = harbor(tmp_path, **{"instruction.md": "x" * 101})
    assert error(root, max_prompt_bytes=100) == "instruction.md is larger than 100 bytes (MAX_PROMPT_BYTES)"
    root = harbor(tmp_path / "b", **{"instruction.md": b"\xff\xfe"})
    assert error(root) == "instruction.md is not valid UTF-8 text"
    root = harbor(tmp_path / "c")
    os.symlink("/etc/passwd", root / "tests" / "passwd")
    assert error(root) == "tests/passwd is a symbolic link"
    root = harbor(tmp_path / "d")
    os.symlink("/etc/passwd", root / "solution" / "passwd")
    assert error(root) == "solution/passwd is a symbolic link"
    root = harbor(tmp_path / "e", **{"task.toml": b"version = \xff"})
    assert error(root) == "task.toml is not valid UTF-8 text"


def test_task_toml_beside_task_yaml_is_harbor(tmp_path):
    root = harbor(tmp_path, **{"task.yaml": "instruction: ignored\n"})
    assert load_task(root).format == "harbor"


# -- Terminal-Bench 1.x --------------------------------------------------------------------------------


def test_a_full_terminal_bench_task(tmp_path):
    spec = load_task(terminal_bench(tmp_path))
    assert (spec.format, spec.grader, spec.repo, spec.cache) == ("terminal-bench", "pytest", None, False)
    assert spec.prompt == "Create hello.txt saying hello.\n"
    assert spec.environment == ImageEnvironment(dockerfile="Dockerfile", context=".")
    assert spec.env == {"TEST_DIR": "/tests"}  # the compose service's environment, ${T_BENCH_TEST_DIR} set
    assert spec.verifier == Verifier(
        script="run-tests.sh",
        files=[
            SupportFile("run-tests.sh", b"#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n", 0o755),
            SupportFile(
                "test_outputs.py", b"def test_hello():\n    assert open('/app/hello.txt').read() == 'hello\\n'\n", 0o644
            ),
        ],
        env={"TEST_DIR": "/tests", "T_BENCH_TEST_DIR": "/tests"},
    )
    assert spec.request == TaskRequest(agent_timeout_secs=120.0, verifier_timeout_secs=30.0)
    assert spec.metadata == {
        "author_name": "someone",
        "difficulty": "easy",
        "tags": ["file", "beginner"],
        "run_tests_in_same_shell": False,
    }
    assert spec.solution == "#!/bin/bash\necho hello > hello.txt\n" and spec.solution_files == []


def test_terminal_bench_without_compose_builds_the_root(tmp_path):
    spec = load_task(
        terminal_bench(
            tmp_path, "instruction: Do it.\n", **{"docker-compose.yaml": None, "tests/test_outputs.py": None}
        )
    )
    assert spec.environment == ImageEnvironment(dockerfile="Dockerfile", context=".")
    assert spec.env == {} and spec.metadata == {} and spec.request == TaskRequest()
    assert [f.relpath for f in spec.verifier.files] == ["run-tests.sh"]


def test_compose_build_context_image_and_environment(tmp_path):
    compose = (
        "services:\n  client:\n    build:\n      context: docker\n      dockerfile: Dockerfile.client\n"
        "      args: {PY: 3.12}\n    environment:\n      DATA: $${T_BENCH_TEST_DIR}/data\n      LEVEL: 3\n"
    )
    root = terminal_bench(tmp_path, **{"docker-compose.yaml": compose, "docker/Dockerfile.client": "FROM scratch\n"})
    spec = load_task(root)
    assert spec.environment == ImageEnvironment(
        dockerfile="docker/Dockerfile.client", context="docker", build_args={"PY": "3.12"}
    )
    assert spec.env == {"DATA": "${T_BENCH_TEST_DIR}/data", "LEVEL": "3"}  # $$ is a literal $
    compose = "services:\n  client:\n    image: ghcr.io/org/tb-task:2\n"
    spec = load_task(terminal_bench(tmp_path / "b", **{"docker-compose.yaml": compose, "Dockerfile": None}))
    assert spec.environment == ImageEnvironment(image="ghcr.io/org/tb-task:2")


def test_solution_yaml_is_converted_as_harbor_does(tmp_path):
    solution = "- command: echo hello > hello.txt\n- {command: cat hello.txt, min_timeout_sec: 5}\n"
    spec = load_task(terminal_bench(tmp_path, **{"solution.sh": None, "solution.yaml": solution}))
    assert spec.solution == (
        "#!/bin/bash\n# solution.yaml's commands, one a line (Terminal-Bench typed each and pressed Enter)\n"
        "echo hello > hello.txt\ncat hello.txt\n"
    )
    assert "solution_not_converted" not in spec.metadata


@pytest.mark.parametrize(
    ("solution", "why"),
    [
        (
            "- command: vim x\n- {command: ':wq', append_enter: false}\n",
            "solution.yaml entry 2 types keys without Enter, which no bash script can do",
        ),
        ("- keys: ls\n", "solution.yaml entry 1 has no 'command' string"),
        ("command: ls\n", "solution.yaml must be a list of {command: ...} entries"),
        ("", "solution.yaml must be a list of {command: ...} entries"),
        (
            "- !!python/object:os.system ls\n",
            "solution.yaml uses the YAML tag !!python/object:os.system (line 1); only plain values are allowed",
        ),
    ],
)
def test_a_solution_yaml_that_is_no_script_leaves_no_solution(tmp_path, solution, why):
    spec = load_task(terminal_bench(tmp_path, **{"solution.sh": None, "solution.yaml": solution}))
    assert spec.solution is None
    assert spec.metadata["solution_not_converted"] == why


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"task.yaml": "difficulty: easy\n"}, "task.yaml: missing required key 'instruction'"),
        ({"task.yaml": "instruction: [a]\n"}, "task.yaml: 'instruction' must be a string, got a list"),
        (
            {"task.yaml": "instruction: x\nparser_name: swebench\n"},
            "tests/config.json is missing: a task graded swebench names its SWE-bench row there",
        ),
        (
            {"task.yaml": "instruction: x\nparser_name: mlebench\n"},
            "task.yaml: 'parser_name' 'mlebench' is not supported here: MLE-bench's parser reads a verdict the "
            "task's own scripts compute in the sandbox, which the executor cannot check (pytest and swebench are)",
        ),
        (
            {"task.yaml": "instruction: x\nparser_name: junit\n"},
            "task.yaml: 'parser_name' 'junit' is not a parser this executor has (pytest, swebench)",
        ),
        (
            {"task.yaml": "instruction: x\nmax_agent_timeout_sec: soon\n"},
            "task.yaml: 'max_agent_timeout_sec' must be a positive number, got a string",
        ),
        (
            {"task.yaml": "instruction: x\nmax_test_timeout_sec: -1\n"},
            "task.yaml: 'max_test_timeout_sec' must be a positive number, got -1",
        ),
        ({"task.yaml": "- instruction: x\n"}, "task.yaml must be a mapping of keys to values, not a list"),
        (
            {"task.yaml": "a: &a [1]\nb: *a\nc: !!python/name:os.system x\n"},
            "task.yaml uses the YAML tag !!python/name:os.system (line 3); only plain values are allowed",
        ),
        ({"run-tests.sh": None}, "task has no run-tests.sh (required)"),
        ({"docker-compose.yaml": None, "Dockerfile": None}, "task has no Dockerfile (required)"),
        (
            {"docker-compose.yaml": "services:\n  client: {build: .}\n  redis: {image: redis}\n"},
            "docker-compose.yaml has 2 services (client, redis); a task runs in one container here",
        ),
        (
            {"docker-compose.yaml": "services: {}\n"},
            "docker-compose.yaml: 'services' must be a mapping of service names to services",
        ),
        (
            {"docker-compose.yaml": "services:\n  client: {build: ., working_dir: /srv, ports: ['80:80']}\n"},
            "docker-compose.yaml: service 'client': 'ports' is not supported here (a task runs in one container, "
            "as its image says)",
        ),
        (
            {"docker-compose.yaml": "services:\n  client: {build: ., volumes: ['./:/app']}\n"},
            "docker-compose.yaml: service 'client': volume ./:/app binds a folder of the task elsewhere than the "
            "service's working_dir (none given), which is not supported here",
        ),
        (
            {"docker-compose.yaml": "services:\n  client: {build: ., working_dir: /app, volumes: ['/etc:/app']}\n"},
            "docker-compose.yaml: service 'client': volume /etc:/app binds a host path or a named volume, which is "
            "not supported here",
        ),
        (
            {"docker-compose.yaml": "services:\n  client: {build: ., command: [python, server.py]}\n"},
            "docker-compose.yaml: service 'client': 'command' 'python server.py' would run beside the task, which "
            "is not supported here (only a command that keeps the container alive, such as sleep infinity)",
        ),
        (
            {"docker-compose.yaml": "services:\n  client:\n    build: .\n    environment:\n      - KEY=${API_KEY}\n"},
            "docker-compose.yaml: service 'client': 'environment' value of KEY takes ${API_KEY} from the host's "
            "environment; only ${T_BENCH_TEST_DIR} is set here",
        ),
        (
            {"docker-compose.yaml": "services:\n  client: {build: {context: ../..}}\n"},
            "docker-compose.yaml: service 'client': 'build.context' '../..' must be a relative path inside the task, without '..'",
        ),
        (
            {"docker-compose.yaml": "services:\n  client: {build: {dockerfile: Nope}}\n"},
            "docker-compose.yaml: service 'client': 'build.dockerfile' 'Nope' is not a file of the task",
        ),
    ],
)
def test_bad_terminal_bench_tasks_are_named(tmp_path, files, message):
    assert error(terminal_bench(tmp_path, **files)) == message


def test_terminal_bench_instruction_is_held_to_the_prompt_cap(tmp_path):
    root = terminal_bench(tmp_path, "instruction: " + "x" * 101 + "\n")
    assert error(root, max_prompt_bytes=100) == "task.yaml: 'instruction' is larger than 100 bytes (MAX_PROMPT_BYTES)"


def test_the_yaml_guards_are_shared(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(6)
    )
    root = terminal_bench(tmp_path, "instruction: x\n" + bomb)
    assert error(root) == "task.yaml expands to more than 100000 values (alias bomb?)"
    compose = "services:\n  client: &c {build: ., labels: [*c]}\n"
    assert error(terminal_bench(tmp_path / "b", **{"docker-compose.yaml": compose})) == (
        "docker-compose.yaml has a recursive alias (line 2)"
    )


# -- workspace.yaml's grader ----------------------------------------------------------------------------


def workspace(tmp_path, extra: str) -> Path:
    return write(
        tmp_path / "ws",
        {
            "workspace.yaml": "repo: https://github.com/org/repo.git\nbase_commit: abc123\n" + extra,
            "prompt.md": "Do it.\n",
        },
    )


@pytest.mark.parametrize(
    ("extra", "grader"),
    [
        ("", "exit_code"),
        ("grader: exit_code\n", "exit_code"),
        ("grader: reward_file\n", "reward_file"),
        ("grader: pytest\n", "pytest"),
    ],
)
def test_workspace_graders(tmp_path, extra, grader):
    spec = load_task(workspace(tmp_path, extra))
    assert (spec.format, spec.grader, spec.verifier, spec.metadata) == ("workspace", grader, None, None)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "grader: swebench\n",
            "workspace.yaml: 'grader' swebench needs a 'swebench' mapping (test_cmd, test_files, parser, "
            "fail_to_pass, pass_to_pass)",
        ),
        (
            "grader: junit\n",
            "workspace.yaml: 'grader' must be one of exit_code, reward_file, pytest, swebench, got 'junit'",
        ),
        (
            "grader: [pytest]\n",
            "workspace.yaml: 'grader' must be one of exit_code, reward_file, pytest, swebench, got a list",
        ),
    ],
)
def test_bad_workspace_graders(tmp_path, extra, message):
    assert error(workspace(tmp_path, extra)) == message
