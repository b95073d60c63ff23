"""Network per step under bubblewrap, on a live service: with TEST_NETWORK off (the default)
and AGENT_NETWORK=off, neither the tests nor the agent reach anything, not even 127.0.0.1.

Without the sandbox this cannot be enforced; /status and the log say so (test_isolation.py).
Traffic stays on 127.0.0.0/8 and ::1: single connection attempts with a 2 s timeout.
"""

from __future__ import annotations

import os
import socket

import pytest

from evaluations.runtime import probe_bwrap
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import submit, wait_terminal
from tests.helpers.tasks import SOLVER
from tests.security.support import live_still_works

pytestmark = pytest.mark.slow

# Exit 0 only if the connection fails: a test that passes is an attack that failed.
CONNECT = (
    "#!/bin/bash\npython3 - <<'EOF'\nimport socket, sys\n"
    "try:\n    socket.create_connection(({host!r}, {port}), timeout=2).close()\n"
    "except OSError as exc:\n    print('REFUSED', exc)\n    sys.exit(0)\n"
    "print('CONNECTED to {host} port {port}')\nsys.exit(1)\nEOF\n"
)


@pytest.fixture(scope="module")
def service(live_factory):
    works, detail = probe_bwrap()
    if not works:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
        pytest.skip(detail)
    return live_factory(SANDBOX="bwrap", AGENT_NETWORK="off")


@pytest.fixture(scope="module")
def ipv6_listener():
    with TestHTTPServer(host="::1") as server:
        yield server


def reachable_from_here(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def targets(service, module_www, ipv6_listener) -> dict[str, tuple[str, int]]:
    return {
        "service_port": ("127.0.0.1", service.port),
        "postgresql": ("127.0.0.1", 5432),
        "task_server_on_127_0_0_1": ("127.0.0.1", module_www[1].port),
        "ipv6_loopback": ("::1", ipv6_listener.port),
    }


@pytest.mark.parametrize("target", ["service_port", "postgresql", "task_server_on_127_0_0_1", "ipv6_loopback"])
def test_the_tests_and_the_agent_cannot_connect(service, module_www, ipv6_listener, target):
    tasks, _server = module_www
    host, port = targets(service, module_www, ipv6_listener)[target]
    if not reachable_from_here(host, port):
        pytest.skip(f"nothing listens on {host} port {port} here")  # PostgreSQL may be absent
    probe = CONNECT.format(host=host, port=port)
    agent = SOLVER + f"import subprocess\nsubprocess.run(['bash', '-c', {probe!r}])\n"
    url = tasks.task(tests={"fail_to_pass_add.sh": "python3 -c 'from calc import add; assert add(2, 3) == 5'\n",
                            f"connect_{target}.sh": probe})  # fmt: skip
    body = wait_terminal(service, submit(service, url, agent))
    assert "REFUSED" in body["agent_output"] and "CONNECTED" not in body["agent_output"], body["agent_output"]
    results = {r["name"]: r for r in body["test_results"]}
    assert results[f"connect_{target}"]["passed"], results[f"connect_{target}"]["output"]
    assert (body["status"], body["passed"]) == ("completed", True), body["error"]
    live_still_works(service, tasks)
