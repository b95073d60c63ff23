"""Harbor tasks of the suite's own whose agent and verifier phases have networks of their own (SPEC §23),
through the whole pipeline: one egress proxy per evaluation, its policy switched from the agent's phase
to the verifier's; and /logs/verifier, empty while the agent runs, emptied again before the verifier.

Each phase's commands try the same destinations through the proxy (python3's urllib, NO_PROXY emptied
so 127.0.0.1 goes through it): the suite's HTTP server on 127.0.0.1 by address and as ``localhost``, a
server on ``::1`` (where the machine has it), a name under ``*.example.test`` (no such name resolves:
"resolution failed" says the task's list let it through), and 127.0.0.1 on a port the operator does
not allow. The operator allows the two servers (EGRESS_ALLOW: the defaults refuse loopback, and a
task's allowlist never widens the operator's rules); TEST_NETWORK is on.
"""

from __future__ import annotations

import dataclasses

import pytest

from evaluations.network.egress.policy import ALLOWED_BY_RULE, NOT_IN_TASK_LIST, RESOLUTION_FAILED
from tests.helpers.httpserver import TestHTTPServer
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_harbor_e2e import harbor_folder, serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

OK, TASK, LOOPBACK, NO_NAME = ALLOWED_BY_RULE, NOT_IN_TASK_LIST, "loopback address", RESOLUTION_FAILED
CLOSED_PORT = 9  # 127.0.0.1:9: allowed by no rule of the operator's


@pytest.fixture
def server6():
    """An HTTP server on ::1, or None where this machine has no IPv6 loopback."""
    try:
        server = TestHTTPServer(host="::1").start()
    except OSError:
        yield None
        return
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def config(image_task_config, http_server, server6):
    allow = [f"127.0.0.1:{http_server.port}", f"[::1]:{http_server.port}"]  # localhost, whichever it is
    if server6 is not None:
        allow.append(f"[::1]:{server6.port}")
    return dataclasses.replace(image_task_config, egress_allow=tuple(allow), test_network=True)


def targets(http_server, server6) -> dict[str, tuple[str, int, str]]:
    """name -> (host as the proxy records it, port, URL path prefix)."""
    found = {
        "address": ("127.0.0.1", http_server.port, f"http://127.0.0.1:{http_server.port}"),
        "name": ("localhost", http_server.port, f"http://localhost:{http_server.port}"),
        "wildcard": ("a.example.test", http_server.port, f"http://a.example.test:{http_server.port}"),
        "operator": ("127.0.0.1", CLOSED_PORT, f"http://127.0.0.1:{CLOSED_PORT}"),
    }
    if server6 is not None:
        found["ipv6"] = ("::1", server6.port, f"http://[::1]:{server6.port}")
    return found


def reach_script(phase: str, urls: dict[str, tuple[str, int, str]]) -> str:
    """Bash trying each destination through the proxy: ``reached NAME`` or ``refused NAME`` per line."""
    lines = [
        "reach() {",
        "  NO_PROXY= no_proxy= python3 -c 'import sys, urllib.request; "
        'urllib.request.urlopen(sys.argv[1], timeout=30).read()\' "$2" >/dev/null 2>&1 '
        '&& echo "reached $1" || echo "refused $1"',
        "}",
    ]
    lines += [f"reach {name} {url}/{phase}/{name}" for name, (_, _, url) in urls.items()]
    return "\n".join(lines) + "\n"


def run_phases(tasks, config, tmp_path, http_server, server6, toml: str):
    urls = targets(http_server, server6)
    for server in filter(None, (http_server, server6)):
        for phase in ("agent", "verifier"):
            for name in urls:
                server.respond(f"/{phase}/{name}", body=b"reached\n")
    test = "#!/bin/bash\n" + reach_script("verifier", urls) + "echo 1 > /logs/verifier/reward.txt\n"
    image = f"{config.image_insecure_registries[0]}/base/debian:bookworm"
    folder = harbor_folder(tmp_path / "task", toml=f'[environment]\ndocker_image = "{image}"\n{toml}', test=test)
    evaluation = evaluate(serve(tasks, folder), reach_script("agent", urls), config=config, sandbox="bwrap",
                          language="bash")  # fmt: skip
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    return evaluation, urls


def check_phase(evaluation, http_server, server6, urls, phase: str, step: str, output: str, expected: dict):
    """Each destination of ``phase``: the proxy's reason (None: the phase has no network, no record), what
    the command saw, and whether the request reached a server."""
    records = {(r["host"], r["port"]): r for r in evaluation.egress if r["step"] == step}
    arrived = {request["path"] for server in (http_server, server6) if server for request in server.requests}
    for name, (host, port, _) in urls.items():
        reason = expected[name]
        record = records.get((host, port))
        if reason is None:
            assert record is None, (phase, name, record)
        else:
            assert record is not None and record["reason"] == reason, (phase, name, record, evaluation.egress)
            assert record["allowed"] == (reason == OK), (phase, name, record)
        reached = reason == OK
        assert (f"reached {name}" if reached else f"refused {name}") in output, (phase, name, output)
        assert (f"/{phase}/{name}" in arrived) == reached, (phase, name, arrived)


EVERYWHERE = {"address": OK, "name": OK, "ipv6": OK, "wildcard": NO_NAME, "operator": LOOPBACK}  # public


@pytest.mark.parametrize(
    ("toml", "agent", "verifier", "modes"),
    [
        pytest.param(  # the agent reaches the address, the verifier is refused it; the reverse for the name
            '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["127.0.0.1", "127.0.0.1"]\n'
            '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["localhost", "*.Example.Test."]\n',
            {"address": OK, "name": TASK, "ipv6": TASK, "wildcard": TASK, "operator": LOOPBACK},
            {"address": TASK, "name": OK, "ipv6": TASK, "wildcard": NO_NAME, "operator": TASK},
            (("public", None), ("allowlist", ["127.0.0.1"]), ("allowlist", ["localhost", "*.example.test"])),
            id="ipv4-then-name-and-wildcard",
        ),
        pytest.param(  # CIDRs for the agent; the verifier has [environment]'s list (an IPv6 address, a name)
            'network_mode = "allowlist"\nallowed_hosts = ["::1", "localhost"]\n'
            '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["127.0.0.0/8", "::/127"]\n',
            {"address": OK, "name": TASK, "ipv6": OK, "wildcard": TASK, "operator": LOOPBACK},
            {"address": TASK, "name": OK, "ipv6": OK, "wildcard": TASK, "operator": TASK},
            (("allowlist", ["::1", "localhost"]), ("allowlist", ["127.0.0.0/8", "::/127"]),
             ("allowlist", ["::1", "localhost"])),
            id="cidrs-then-the-environments-ipv6-and-name",
        ),
        pytest.param(  # no network for the environment, hence the agent; the verifier's own: public
            'network_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n',
            dict.fromkeys(EVERYWHERE),
            EVERYWHERE,
            (("no-network", None), ("no-network", None), ("public", None)),
            id="none-then-public",
        ),
    ],
)  # fmt: skip
def test_each_phase_reaches_what_its_own_network_allows(tasks, config, tmp_path, http_server, server6, toml,
                                                        agent, verifier, modes):  # fmt: skip
    evaluation, urls = run_phases(tasks, config, tmp_path, http_server, server6, toml)
    check_phase(evaluation, http_server, server6, urls, "agent", "running_agent", evaluation.agent_output, agent)
    check_phase(evaluation, http_server, server6, urls, "verifier", "running_tests", evaluation.test_output, verifier)
    limits = evaluation.limits_applied
    assert (
        (limits["network"], limits["allowed_hosts"]),
        (limits["agent_network_mode"], limits["agent_allowed_hosts"]),
        (limits["verifier_network_mode"], limits["verifier_allowed_hosts"]),
    ) == modes
    assert (limits["agent_network"], limits["verifier_network"]) == (agent["address"] is not None, True)


LOGS_AGENT = """\
if [ -d /logs/verifier ] && [ -z "$(ls -A /logs/verifier)" ]; then echo "agent: /logs/verifier is empty"; fi
echo 1 > /logs/verifier/reward.txt && mkdir -p /logs/verifier/sub && echo planted > /logs/verifier/sub/left.txt \
  && echo "agent: wrote /logs/verifier"
ls -la /logs/verifier
"""

LOGS_TEST = """\
#!/bin/bash
left=$(ls -A /logs/verifier)
echo "verifier found: [$left]"
if [ -z "$left" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_logs_verifier_is_empty_for_the_agent_and_what_it_left_there_is_gone_for_the_verifier(tasks, config, tmp_path):
    image = f"{config.image_insecure_registries[0]}/base/debian:bookworm"
    folder = harbor_folder(tmp_path / "task", toml=f'[environment]\ndocker_image = "{image}"\n', test=LOGS_TEST)
    evaluation = evaluate(serve(tasks, folder), LOGS_AGENT, config=config, sandbox="bwrap", language="bash")
    assert "agent: /logs/verifier is empty" in evaluation.agent_output, evaluation.agent_output
    assert "agent: wrote /logs/verifier" in evaluation.agent_output, evaluation.agent_output
    assert "verifier found: []" in evaluation.test_output, evaluation.test_output
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    assert evaluation.system_changes["count"] == 0, evaluation.system_changes  # the mount point is the executor's
    assert evaluation.artifacts == []  # /logs/verifier is not /logs/agent: nothing of it is kept


LEFT_AGENT = """\
echo from-agent > /tmp/left.txt
echo from-agent > /var/tmp/left-var.txt
echo from-agent > /logs/artifacts/note.txt
"""

LEFT_TEST = """\
#!/bin/bash
echo "tmp: [$(cat /tmp/left.txt 2>&1)]"
echo "var-tmp: [$(cat /var/tmp/left-var.txt 2>&1)]"
echo "artifacts: [$(cat /logs/artifacts/note.txt 2>&1)]"
echo from-verifier > /logs/artifacts/added.txt && echo "artifacts writable"
echo 1 > /logs/verifier/reward.txt
"""


@pytest.mark.parametrize("isolated", [False, True])
def test_a_shared_verifier_finds_tmp_and_logs_artifacts_as_the_agent_left_them(tasks, config, tmp_path, isolated):
    """Harbor runs a shared verifier in the agent's container, where /tmp and the trial's artifacts folder
    (mounted at /logs/artifacts in every phase) are as the agent left them; Harbor's own example tasks
    (verifier-mode-matrix/multistep-all-shared, network-policy-matrix) read both. An isolated verifier
    (SPEC §17: the image plus only the working directory) gets an empty /tmp."""
    image = f"{config.image_insecure_registries[0]}/base/debian:bookworm"
    toml = (
        f'[environment]\ndocker_image = "{image}"\nworkdir = "/app"\n[verifier]\nisolated = {str(isolated).lower()}\n'
    )
    folder = harbor_folder(tmp_path / "task", toml=toml, test=LEFT_TEST)
    evaluation = evaluate(serve(tasks, folder), LEFT_AGENT, config=config, sandbox="bwrap", language="bash")
    assert (evaluation.status, evaluation.reward) == ("completed", 1.0), (evaluation.error, evaluation.log[-3000:])
    output = evaluation.test_output
    if isolated:
        assert "tmp: [cat: /tmp/left.txt: No such file or directory]" in output, output
        assert "var-tmp: [cat: /var/tmp/left-var.txt: No such file or directory]" in output, output
    else:
        assert "tmp: [from-agent]" in output, output
        assert "var-tmp: [from-agent]" in output, output
    assert "artifacts: [from-agent]" in output, output
    assert "artifacts writable" in output, output
    # Collected after the agent, before the verifier: what the verifier added is not an artifact.
    listed = [entry["path"] for entry in evaluation.artifacts]
    assert "artifacts/logs/artifacts/note.txt" in listed, listed
    assert not any(path.endswith("added.txt") for path in listed), listed
