"""``[agent] user`` and ``[verifier] user`` (SPEC §23) through the whole pipeline, on the suite's
Debian image (``FROM debian:bookworm`` through the mirror): the agent runs as its user, the verifier
as its own or the image's User (Harbor 0.25), each with its phase's network through the one proxy,
the verifier writing its reward as its user; a user the image lacks fails the evaluation, named."""

from __future__ import annotations

import dataclasses

import pytest

from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import harbor_folder, serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def config(hub_task_config, http_server):
    """Harbor tasks as written (docker.io is the suite's registry), with only the HTTP server let through."""
    http_server.respond("/hello", body=b"hello\n")
    return dataclasses.replace(hub_task_config, egress_allow=(f"127.0.0.1:{http_server.port}",), test_network=True)


def fetch(http_server) -> str:
    """Bash: ``fetched`` or ``refused``, through the evaluation's proxy."""
    url = f"http://127.0.0.1:{http_server.port}/hello"
    return (
        "NO_PROXY= no_proxy= python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], "
        f"timeout=30).read()' {url} >/dev/null 2>&1 && echo fetched || echo refused\n"
    )


def verifier_test(http_server, expected: str) -> str:
    """The verifier says who it is, whose file the agent left, and whether it has the network; it
    writes its reward itself (its /logs/verifier is its user's)."""
    return (
        "#!/bin/bash\n"
        'echo "verifier=$(id -un):$(id -gn) left-by=$(stat -c %U /var/tmp/by-agent) net=$('
        + fetch(http_server).strip()
        + ')"\n'
        f'[ "$(id -un) $(stat -c %U /var/tmp/by-agent)" = "{expected}" ] && echo 1 > /logs/verifier/reward.txt '
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )


AGENT = 'echo "agent=$(id -un)"; echo hi > /var/tmp/by-agent; touch /app/mine 2>/dev/null || echo "no /app for me"\n'


def test_the_agent_runs_as_its_user_and_the_verifier_as_the_images(tasks, config, http_server, tmp_path):
    """``[agent] user = "nobody"`` on an image whose User is root: the agent is nobody (WORKDIR /app,
    root's, is not its to write, as under Docker), the verifier root, with its network, reading the
    file nobody left; the image's entrypoint and the healthcheck run as the image's User (root)."""
    toml = (
        '[agent]\nuser = "nobody"\n[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["127.0.0.1"]\n'
        '[environment]\nnetwork_mode = "no-network"\n'
        "[environment.healthcheck]\ncommand = 'test -s /var/tmp/first && test \"$(id -un)\" = root'\n"
        "interval_sec = 0.2\nstart_interval_sec = 0.2\nstart_period_sec = 60.0\n"
    )
    folder = harbor_folder(tmp_path / "task", toml=toml, test=verifier_test(http_server, "root nobody"))
    (folder / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm\nWORKDIR /app\n"
        'ENTRYPOINT ["sh", "-c", "id -un > /var/tmp/first; exec \\"$@\\"", "entrypoint"]\n'
    )
    agent = 'echo "first=$(cat /var/tmp/first)"\n' + AGENT + fetch(http_server)
    evaluation = evaluate(serve(tasks, folder), agent, config=config, sandbox="bwrap", language="bash")
    assert "first=root" in evaluation.agent_output and "agent=nobody" in evaluation.agent_output, (
        evaluation.agent_output,
        evaluation.log[-3000:],
    )
    assert "no /app for me" in evaluation.agent_output
    assert evaluation.agent_output.rstrip().endswith("refused")  # the agent's phase: no network
    assert "verifier=root:root left-by=nobody net=fetched" in evaluation.test_output, evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])


def test_a_verifier_user_of_its_own_over_the_images_user(tasks, config, http_server, tmp_path):
    """The image's User is nobody; ``[agent] user = 0`` makes the agent root (a uid, as Harbor allows),
    ``[verifier] user = "daemon"`` the verifier daemon, which has its network and writes its reward."""
    toml = '[agent]\nuser = 0\n[verifier]\nuser = "daemon"\n'
    folder = harbor_folder(tmp_path / "task", toml=toml, test=verifier_test(http_server, "daemon root"))
    (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\nUSER nobody\n")
    evaluation = evaluate(serve(tasks, folder), AGENT, config=config, sandbox="bwrap", language="bash")
    assert "agent=root" in evaluation.agent_output and "no /app" not in evaluation.agent_output, (
        evaluation.agent_output,
        evaluation.log[-3000:],
    )
    assert "verifier=daemon:daemon left-by=root net=fetched" in evaluation.test_output, evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])


def test_an_entrypoint_as_a_third_user_runs_as_that_user_without_capabilities(tasks, config, http_server, tmp_path):
    """The image's User nobody, [agent] user root: the ENTRYPOINT and the healthcheck run as nobody
    (neither root nor the map's user: the sandbox is set up as the image's root and the init switches),
    with no capability left; the agent, root, sees what the entrypoint wrote; the verifier is the
    image's User too."""
    toml = (
        "[agent]\nuser = 0\n"
        "[environment.healthcheck]\ncommand = 'test -s /var/tmp/first && test \"$(id -un)\" = nobody'\n"
        "interval_sec = 0.2\nstart_interval_sec = 0.2\nstart_period_sec = 60.0\n"
    )
    folder = harbor_folder(tmp_path / "task", toml=toml, test=verifier_test(http_server, "nobody root"))
    first = "echo $(id -un):$(id -gn):$(id -G):$(grep CapEff /proc/self/status | cut -f2) > /var/tmp/first"
    (folder / "environment" / "Dockerfile").write_text(
        f'FROM debian:bookworm\nUSER nobody\nENTRYPOINT ["sh", "-c", "{first}; exec \\"$@\\"", "entrypoint"]\n'
    )
    agent = 'echo "first=$(cat /var/tmp/first)"\n' + AGENT
    evaluation = evaluate(serve(tasks, folder), agent, config=config, sandbox="bwrap", language="bash")
    assert "first=nobody:nogroup:65534:0000000000000000" in evaluation.agent_output, (
        evaluation.agent_output, evaluation.error, evaluation.log[-3000:])  # fmt: skip
    assert "agent=root" in evaluation.agent_output
    assert "verifier=nobody:nogroup left-by=root" in evaluation.test_output, evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[agent]\nuser = "ghost"\n',
            "task.toml: [agent] user 'ghost' cannot run in the image: the image's user 'ghost' is not in its "
            "/etc/passwd",
        ),
        (
            '[verifier]\nuser = "nobody:ghosts"\n',
            "task.toml: [verifier] user 'nobody:ghosts' cannot run in the image: the image's group 'ghosts' is "
            "not in its /etc/group",
        ),
    ],
)
def test_a_user_the_image_lacks_is_named_before_the_agent(tasks, config, http_server, tmp_path, toml, message):
    folder = harbor_folder(tmp_path / "task", toml=toml, test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    evaluation = evaluate(serve(tasks, folder), AGENT, config=config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.error_kind) == ("failed", "task_invalid"), evaluation.log[-2000:]
    assert f"preparing_environment: {message}" in evaluation.log
    assert message in evaluation.error
    assert evaluation.agent_output == ""
