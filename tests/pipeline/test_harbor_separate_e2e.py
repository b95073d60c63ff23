"""A separate verifier and the task's artifacts (SPEC §23) through the whole pipeline, on images the suite
builds or pushes to its own registry: the verifier runs in a root of its own (the task's environment
afresh, tests/Dockerfile, or [verifier.environment] docker_image) into which only the collected artifacts
are copied, at their paths; /logs/artifacts and the task's ``artifacts`` are kept and listed as
/logs/agent's files are; a link the agent leaves among them is never followed onto the host."""

from __future__ import annotations

import pytest

from tests.helpers import images as images_helpers
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import harbor_folder, serve
from tests.pipeline.test_harbor_keys_e2e import pushed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ARTIFACTS = (
    'artifacts = ["/app/result.txt", {source = "/app/out", destination = "outputs", exclude = ["*.log", "cache"]},'
    ' "/tmp/scratch.txt"]\n'
)
# What the verifier must find (the artifacts, at their paths) and must not (the agent's other files).
SEES = (
    "#!/bin/bash\nok=1\n"
    'test "$(cat /app/result.txt)" = 42 || { echo no result; ok=0; }\n'
    'test "$(cat /app/out/sub/b.txt)" = b && test -x /app/out/run.sh || { echo no out; ok=0; }\n'
    'test "$(cat /logs/artifacts/note.txt)" = note || { echo no note; ok=0; }\n'
    'test "$(cat /tmp/scratch.txt)" = scratch || { echo no scratch; ok=0; }\n'
    "for other in /app/secret.txt /etc/planted /logs/agent/trajectory.json /app/out/x.log /app/out/sub/cache; do\n"
    '  test ! -e "$other" || { echo "sees $other"; ok=0; }\ndone\n'
)
TEST = SEES + "echo $ok > /logs/verifier/reward.txt\n"
AGENT = (
    "echo 42 > /app/result.txt && mkdir -p /app/out/sub && echo a > /app/out/a.txt && echo b > /app/out/sub/b.txt\n"
    "printf '#!/bin/sh\\n' > /app/out/run.sh && chmod 755 /app/out/run.sh\n"
    "echo note > /logs/artifacts/note.txt && echo secret > /app/secret.txt && touch /etc/planted\n"
    "echo '{}' > /logs/agent/trajectory.json && echo scratch > /tmp/scratch.txt\n"
    "echo left > /app/out/x.log && mkdir -p /app/out/sub/cache && echo left > /app/out/sub/cache/c.txt\n"
)
NOOP = "echo doing nothing\n"
KEPT = ["artifacts/app/result.txt", "artifacts/logs/artifacts/note.txt", "artifacts/outputs/a.txt",
        "artifacts/outputs/run.sh", "artifacts/outputs/sub/b.txt", "artifacts/tmp/scratch.txt", "trajectory.json"]  # fmt: skip


@pytest.fixture
def config(hub_task_config):
    """``FROM debian:bookworm`` from the suite's registry (Docker Hub's mirror here)."""
    return hub_task_config


def run(tasks, config, folder, agent):
    return evaluate(serve(tasks, folder), agent, config=config, sandbox="bwrap", language="bash")


def test_a_separate_verifier_sees_the_artifacts_and_nothing_else_of_the_agents(tasks, config, tmp_path):
    toml = ARTIFACTS + '[verifier]\nenvironment_mode = "separate"\n'
    folder = harbor_folder(tmp_path / "separate", toml=toml, test=TEST)
    solved = run(tasks, config, folder, AGENT)
    assert (solved.status, solved.reward) == ("completed", 1.0), (solved.error, solved.test_output,
                                                                  solved.log[-3000:])  # fmt: skip
    assert [a["path"] for a in solved.artifacts] == KEPT
    # The task's own environment, built again from the build cache, in a root of its own
    verifier = solved.environment["verifier"]
    assert (verifier["kind"], verifier["ref"], verifier["cached"]) == ("dockerfile", "environment/Dockerfile", True)
    assert verifier["digest"] == solved.environment["digest"]
    assert "artifacts: copied 6 files into the verifier's environment" in solved.log
    # The agent's own root still has what it changed (the verifier never touched it)
    assert sorted(solved.system_changes["paths"]) == ["/etc/planted"]
    nothing = run(tasks, config, folder, NOOP)
    assert (nothing.status, nothing.reward, nothing.artifacts) == ("failed", 0.0, []), nothing.log[-3000:]
    assert "no result" in nothing.test_output


def test_tests_dockerfile_is_the_verifiers_image_with_its_own_tests(tasks, config, tmp_path):
    test = SEES + 'test "$GRADER" = tests-dockerfile && test "$(pwd)" = /grade || ok=0\n' \
                  "echo $ok > /logs/verifier/reward.txt\n"  # fmt: skip
    folder = harbor_folder(tmp_path / "bundled", toml=ARTIFACTS + '[verifier]\nenvironment_mode = "separate"\n',
                           test=test)  # fmt: skip
    (folder / "tests/Dockerfile").write_text(
        "FROM debian:bookworm\nENV GRADER=tests-dockerfile\nWORKDIR /grade\nCOPY test.sh /tests/test.sh\n"
    )
    solved = run(tasks, config, folder, AGENT)
    assert (solved.status, solved.reward) == ("completed", 1.0), (solved.error, solved.test_output,
                                                                  solved.log[-3000:])  # fmt: skip
    assert solved.environment["verifier"]["ref"] == "tests/Dockerfile"
    # A verifier's image that cannot be built fails the evaluation before the agent runs, naming it
    (folder / "tests/Dockerfile").write_text("FROM debian:bookworm\nRUN echo building the grader; exit 3\n")
    broken = run(tasks, config, folder, AGENT)
    assert (broken.status, broken.error_kind, broken.agent_output) == ("failed", "task_invalid", ""), broken.log[-3000:]
    assert broken.error.startswith("preparing_environment: the verifier's image: "), broken.error
    assert broken.environment["kind"] == "dockerfile" and "verifier" not in broken.environment


def test_a_verifier_environment_image_with_its_own_network_env_and_workdir(tasks, config, tmp_path, base_image,
                                                                          base_layer):  # fmt: skip
    image = pushed(base_image, base_layer, "separate/grader:1", Env=["PATH=/usr/bin:/bin", "FROM_IMAGE=yes"])
    test = (SEES + 'test "$FROM_IMAGE/$B/${A:-unset}" = yes/2/unset && test "$(pwd)" = /grade || ok=0\n'
            "echo $ok > /logs/verifier/reward.txt\n")  # fmt: skip
    toml = (
        ARTIFACTS + '[environment.env]\nA = "1"\n[verifier.environment]\n'
        f'docker_image = "{image}"\nworkdir = "/grade"\nnetwork_mode = "no-network"\nmemory_mb = 1024\n'
        '[verifier.environment.env]\nB = "2"\n'
    )
    folder = harbor_folder(tmp_path / "image", toml=toml, test="#!/bin/bash\nexit 3\n")  # never run: bundled
    missing = run(tasks, config, folder, AGENT)
    assert (missing.status, missing.error_kind) == ("failed", "task_invalid"), missing.log[-3000:]
    assert f"the verifier's image {image} has no /tests/test.sh" in missing.error
    # The image brings its tests: the same image with /tests/test.sh in a layer of its own
    bundled = pushed_with_tests(base_image, base_layer, "separate/grader:2", test)
    folder = harbor_folder(tmp_path / "image2", toml=toml.replace(image, bundled), test="#!/bin/bash\nexit 3\n")
    solved = run(tasks, config, folder, AGENT)
    assert (solved.status, solved.reward) == ("completed", 1.0), (solved.error, solved.test_output,
                                                                  solved.log[-3000:])  # fmt: skip
    limits = solved.limits_applied
    assert (limits["verifier_network_mode"], limits["verifier_network"], limits["verifier_memory_mb"]) == (
        "no-network", False, 1024)  # fmt: skip


def pushed_with_tests(base_image, base_layer, name: str, test: str) -> str:
    registry, _, _ = base_image
    layer = images_helpers.layer(images_helpers.member("tests/", type="dir"),
                                 images_helpers.member("tests/test.sh", test.encode(), mode=0o755))  # fmt: skip
    images_helpers.push_image(registry, name, layers=[base_layer, layer],
                              config={"Env": ["PATH=/usr/bin:/bin", "FROM_IMAGE=yes"], "Cmd": ["bash"]})  # fmt: skip
    return f"{registry.host}/{name}"


HOSTILE = (
    "ln -s /etc/shadow /app/result.txt && mkdir -p /app/out && ln -s / /app/out/root\n"
    "ln -s /etc/hostname /logs/artifacts/host && ln -s /etc /logs/artifacts/etc && ln -s /etc/shadow /logs/agent/t\n"
    "ln -s {host} /app/host && echo fine > /app/out/fine.txt\n"
)


def test_links_among_the_artifacts_are_never_followed_onto_the_host(tasks, config, tmp_path):
    """Each link is left out, whether the entry itself (/app/result.txt, /logs/agent/t), below a folder
    entry, or in /logs/artifacts; one on the way to an entry (/app/host/secret.txt, /app/host a link to a
    folder of the host's) resolves inside the agent's root, where nothing is: the host's file is never read."""
    host = tmp_path / "host-folder"
    host.mkdir()
    (host / "secret.txt").write_text("the host's secret\n")
    toml = 'artifacts = ["/app/result.txt", {source = "/app/out", destination = "outputs"}, "/logs/agent/t", ' \
           '"/app/host/secret.txt"]\n[verifier]\nenvironment_mode = "separate"\n'  # fmt: skip
    test = "#!/bin/bash\nls -la /app /app/out /logs/artifacts\ncat /app/host/secret.txt\necho 0 > /logs/verifier/reward.txt\n"
    folder = harbor_folder(tmp_path / "hostile", toml=toml, test=test)
    evaluation = run(tasks, config, folder, HOSTILE.format(host=host))
    assert [a["path"] for a in evaluation.artifacts] == ["artifacts/outputs/fine.txt"], evaluation.log[-3000:]
    line = next(line for line in evaluation.log.splitlines() if "artifacts: kept" in line)
    assert line.endswith(
        "left out 7: /app/host/secret.txt (not there); /app/result.txt (a symbolic link); /logs/agent/t (a symbolic "
        "link); artifacts/logs/artifacts/etc (a symbolic link); artifacts/logs/artifacts/host (a symbolic link); "
        "artifacts/outputs/root (a symbolic link); t (a symbolic link)"
    ), line
    # The verifier got the one file, no link, and nothing of the host's
    assert "fine.txt" in evaluation.test_output and "root ->" not in evaluation.test_output
    assert "secret" not in evaluation.test_output.replace("/app/host/secret.txt", "")
