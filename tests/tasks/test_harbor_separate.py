"""task.toml's separate verifier and artifacts (SPEC §23), read as Harbor 0.25 reads them
(``VerifierConfig``, ``resolve_verifier_environment_definition``, ``ArtifactConfig``): each bad value one
TaskError naming the key."""

from __future__ import annotations

import pytest

from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import ArtifactEntry, ImageEnvironment, NetworkRequest
from tests.tasks.test_formats import error, harbor

DOCKERFILE = ImageEnvironment(dockerfile="environment/Dockerfile", context="environment")


def test_separate_without_a_table_is_the_tasks_environment_afresh_with_its_tests_bound(tmp_path):
    toml = '[environment]\nworkdir = "/app"\nnetwork_mode = "no-network"\n[environment.env]\nA = "1"\n' \
           '[verifier]\nenvironment_mode = "separate"\n'  # fmt: skip
    task = load_task(harbor(tmp_path, toml))
    separate = task.verifier.separate
    assert separate.environment == ImageEnvironment(dockerfile="environment/Dockerfile", context="environment",
                                                    workdir="/app")  # fmt: skip
    assert (separate.bundled, separate.env) == (False, {"A": "1"})
    assert task.request.phase_network("verifier") == NetworkRequest("no-network")  # [environment]'s copy
    assert task.verifier.files  # the task's tests/, bound at /tests as for a shared verifier


def test_tests_dockerfile_is_the_verifiers_image_with_its_own_tests(tmp_path):
    task = load_task(harbor(tmp_path, '[verifier]\nenvironment_mode = "separate"\n',
                            **{"tests/Dockerfile": "FROM debian:bookworm\nCOPY . /tests/\n"}))  # fmt: skip
    separate = task.verifier.separate
    assert separate.environment == ImageEnvironment(dockerfile="tests/Dockerfile", context="tests")
    assert separate.bundled


def test_a_verifier_environment_table_implies_separate_and_brings_its_own_everything(tmp_path):
    toml = (
        '[environment]\nnetwork_mode = "no-network"\nworkdir = "/app"\n[environment.env]\nA = "1"\n'
        '[verifier.environment]\ndocker_image = "python:3.12-slim"\nworkdir = "/grade"\nmemory_mb = 512\n'
        'build_timeout_sec = 60\nhealthcheck = { command = "true" }\n[verifier.environment.env]\nB = "2"\n'
    )
    task = load_task(harbor(tmp_path, toml))
    separate = task.verifier.separate
    assert separate.environment == ImageEnvironment(image="python:3.12-slim", workdir="/grade")
    assert (separate.bundled, separate.env, separate.memory_mb, separate.build_timeout_secs) == (
        True, {"B": "2"}, 512, 60.0)  # fmt: skip
    # Its network is its own table's: public by default (Harbor's), not [environment]'s no-network
    assert task.request.phase_network("verifier") == NetworkRequest("public")
    assert task.request.phase_network("agent") == NetworkRequest("no-network")
    assert task.metadata == {"verifier": {"environment": {"healthcheck": {"command": "true"}}}}


def test_the_verifier_tables_own_network_wins_over_its_environments(tmp_path):
    toml = '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n' \
           '[verifier.environment]\nnetwork_mode = "no-network"\n'  # fmt: skip
    task = load_task(harbor(tmp_path, toml))
    assert task.request.phase_network("verifier") == NetworkRequest("allowlist", ("pypi.org",))
    legacy = load_task(harbor(tmp_path / "legacy", "[verifier.environment]\nallow_internet = false\n"))
    assert legacy.request.phase_network("verifier") == NetworkRequest("no-network")


def test_shared_is_as_before(tmp_path):
    assert load_task(harbor(tmp_path, '[verifier]\nenvironment_mode = "shared"\n')).verifier.separate is None
    assert load_task(harbor(tmp_path / "none", "")).verifier.separate is None


def test_artifacts_paths_and_tables(tmp_path):
    toml = (
        'artifacts = ["/app/out.txt", "app/results", {source = "/srv/data", destination = "data/x"},\n'
        '  "/logs/artifacts/sub", {source = "/logs/artifacts/y", destination = "y"}, "/app/out.txt",\n'
        '  {source = "/logs/agent/trajectory.json", service = "main"}]\n'
    )
    task = load_task(harbor(tmp_path, toml))
    assert task.artifacts == (
        ArtifactEntry("/app/out.txt"),
        ArtifactEntry("/app/results"),
        ArtifactEntry("/srv/data", "data/x"),
        ArtifactEntry("/logs/artifacts/y", "y"),  # /logs/artifacts/sub: collected with /logs/artifacts already
        ArtifactEntry("/logs/agent/trajectory.json"),
    )
    assert [entry.listed for entry in task.artifacts] == [
        "artifacts/app/out.txt", "artifacts/app/results", "artifacts/data/x", "artifacts/y",
        "artifacts/logs/agent/trajectory.json"]  # fmt: skip
    assert "artifacts" not in (task.metadata or {})


def test_an_artifacts_exclude_patterns_are_kept_as_tar_reads_them(tmp_path):
    toml = 'artifacts = [{source = "/app", exclude = ["*.pyc", "node_modules/", "my dir", "*.pyc"]}, "/out.txt"]\n'
    task = load_task(harbor(tmp_path, toml))
    assert task.artifacts == (
        ArtifactEntry("/app", exclude=("*.pyc", "node_modules", "my dir")),  # the trailing / dropped, once each
        ArtifactEntry("/out.txt"),
    )


@pytest.mark.parametrize(
    ("toml", "extra", "message"),
    [
        (
            '[verifier]\nenvironment_mode = "apart"\n',
            {},
            "task.toml: [verifier] environment_mode must be 'shared' or 'separate', got 'apart'",
        ),
        (
            "[verifier]\nenvironment_mode = 1\n",
            {},
            "task.toml: [verifier] environment_mode must be 'shared' or 'separate', got a number",
        ),
        (
            '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ndocker_image = "x"\n',
            {},
            "task.toml: [verifier] environment_mode = 'shared' goes with no [verifier.environment] (the verifier "
            "runs in the agent's environment); remove the table or set environment_mode = 'separate'",
        ),
        ('[verifier]\nenvironment = "x"\n', {}, "task.toml: [verifier.environment] must be a table, got a string"),
        (
            '[verifier]\nisolated = true\nenvironment_mode = "separate"\n',
            {},
            "task.toml: [verifier] isolated = true goes with a verifier on the agent's file system, not with "
            "environment_mode = 'separate' (which sees only the artifacts already)",
        ),
        (
            '[verifier.environment]\ndocker_image = "Python:3"\n',
            {},
            "task.toml: [verifier.environment] docker_image: The image reference 'Python:3' must be lower case in "
            "its repository name.",
        ),
        (
            "[verifier.environment]\nmemory_mb = -1\n",
            {},
            "task.toml: [verifier.environment] memory_mb must be a positive whole number, got -1",
        ),
        (
            '[verifier.environment]\nnetwork_mode = "open"\n',
            {},
            "task.toml: [verifier.environment] network_mode must be one of no-network, public, allowlist, got 'open'",
        ),
        (
            '[verifier.environment]\nos = "windows"\n',
            {},
            "task.toml: [verifier.environment] os = 'windows': Windows tasks cannot run here (Linux only)",
        ),
        (
            '[verifier.environment]\nworkdir = "grade"\n',
            {},
            "task.toml: [verifier.environment] workdir must be an absolute path without '..' or control characters, "
            "got 'grade'",
        ),
        (
            '[verifier.environment.env]\nX = "${HOME}"\n',
            {},
            "task.toml: [verifier.environment.env] X takes its value from the host's environment (${HOME}); this "
            "executor passes nothing of its own environment to a task",
        ),
        (
            '[verifier]\nenvironment_mode = "separate"\n',
            {"tests/docker-compose.yaml": "services: {}\n"},
            "tests/docker-compose.yaml: a verifier of several compose services is not supported here",
        ),
        (
            'artifacts = "/app"\n',
            {},
            "task.toml: artifacts must be a list of paths or {source, destination} tables, got a string",
        ),
        ("artifacts = [1]\n", {}, "task.toml: artifacts[0] must be a path or a table with a source, got a number"),
        (
            'artifacts = [{destination = "x"}]\n',
            {},
            "task.toml: artifacts[0] needs a source: a path in the agent's environment (as /app/out.txt)",
        ),
        (
            'artifacts = ["/"]\n',
            {},
            "task.toml: artifacts[0] source must be a path in the agent's environment (as /app/out.txt), got '/'",
        ),
        (
            'artifacts = ["/app/../etc"]\n',
            {},
            "task.toml: artifacts[0] source must not contain '..' components, got '/app/../etc'",
        ),
        (
            'artifacts = ["/app/a\\nb"]\n',
            {},
            "task.toml: artifacts[0] source '/app/a\\nb' has a control character or a backslash",
        ),
        (
            'artifacts = ["/logs/verifier/reward.txt"]\n',
            {},
            "task.toml: artifacts[0] source '/logs/verifier/reward.txt' is the verifier's own folder, not the agent's",
        ),
        (
            'artifacts = ["tests/test.sh"]\n',
            {},
            "task.toml: artifacts[0] source '/tests/test.sh' is the verifier's own folder, not the agent's",
        ),
        (
            'artifacts = [{source = "/app", destination = "/abs"}]\n',
            {},
            "task.toml: artifacts[0] destination must be a relative path, got '/abs'",
        ),
        (
            'artifacts = [{source = "/app", destination = "a/../../b"}]\n',
            {},
            "task.toml: artifacts[0] destination must not contain '..' components, got 'a/../../b'",
        ),
        (
            'artifacts = [{source = "/app", destination = "manifest.json"}]\n',
            {},
            "task.toml: artifacts[0] destination 'manifest.json' names no file, or the reserved manifest.json",
        ),
        (
            'artifacts = [{source = "/app", destination = 3}]\n',
            {},
            "task.toml: artifacts[0] destination must be a relative path, got a number",
        ),
        (
            'artifacts = [{source = "/var/lib/db", service = "db"}]\n',
            {},
            "task.toml: artifacts[0] service = 'db' is not a service of environment/docker-compose.yaml (main)",
        ),
        (
            'artifacts = [{source = "/app", exclude = ".git"}]\n',
            {},
            "task.toml: artifacts[0] exclude must be a list of patterns, got a string",
        ),
        (
            'artifacts = [{source = "/app", exclude = [".git", 3]}]\n',
            {},
            "task.toml: artifacts[0] exclude must be a list of patterns, got a list",
        ),
        (
            'artifacts = [{source = "/app", exclude = ["/"]}]\n',
            {},
            "task.toml: artifacts[0] exclude: '/' must be a pattern of 1 to 256 characters, no control characters "
            "(spaces are fine)",
        ),
        (
            'artifacts = [{source = "/app", exclude = ["a\\tb"]}]\n',
            {},
            "task.toml: artifacts[0] exclude: 'a\\tb' must be a pattern of 1 to 256 characters, no control "
            "characters (spaces are fine)",
        ),
        (
            f'artifacts = [{{source = "/app", exclude = ["{"x" * 257}"]}}]\n',
            {},
            f"task.toml: artifacts[0] exclude: '{'x' * 100}' must be a pattern of 1 to 256 characters, no control "
            "characters (spaces are fine)",
        ),
        (
            "artifacts = [{source = '/app', exclude = [" + ", ".join(f"'p{i}'" for i in range(65)) + "]}]\n",
            {},
            "task.toml: artifacts[0] exclude has 65 patterns, over the 64 this executor takes",
        ),
        (
            f'artifacts = ["/{"d/" * 16}f"]\n',
            {},
            "task.toml: artifacts[0] cannot be listed as 'artifacts/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/f': the path is "
            "more than 16 names deep",
        ),
    ],
)
def test_bad_values_are_named(tmp_path, toml, extra, message):
    assert error(harbor(tmp_path, toml, **extra)) == message
