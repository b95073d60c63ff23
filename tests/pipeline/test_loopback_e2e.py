"""The evaluation's own loopback (pipeline/run.py ``_loopback``, Context.loopback): the sandboxes of one
evaluation on the host's system up to the agent's (the install, the agent) join one network namespace, one
after another, instead of making one each; never the host's. The tests get one of their own: the agent's
server, which closed its connection first, leaves it in TIME_WAIT, and its port would refuse the tests'
server in a namespace shared with the agent."""

from __future__ import annotations

import os

import pytest

from tests.helpers.archives import Exec
from tests.helpers.tasks import ADD_TEST, SOLVER
from tests.pipeline.test_e2e import evaluate

pytestmark = [pytest.mark.django_db(transaction=True)]

if os.geteuid() != 0:
    pytest.skip("the evaluation's network namespace is made by root", allow_module_level=True)

# The agent says which namespace it runs in, and leaves a server listening on 127.0.0.1:8765 in the
# background (setsid: out of its process group), serving until its sandbox's end takes it. The server
# says when it listens; the agent waits for that line (60 s at most), then connects once.
SERVER = (
    "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 8765)); s.listen(); "
    "print('listening', flush=True); sys.stdout.close()\n"
    "while True: s.accept()[0].close()"
)
AGENT = (
    SOLVER
    + f"""
import os, select, socket, subprocess
print('AGENT-NET ' + os.readlink('/proc/self/ns/net'))
server = subprocess.Popen(['python3', '-c', {SERVER!r}], start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
if select.select([server.stdout], [], [], 60)[0] and server.stdout.readline() == 'listening\\n':
    socket.create_connection(('127.0.0.1', 8765), timeout=10).close()
    print('AGENT-SERVER-UP')
"""
)
# The tests say theirs, check the loopback is up, that the agent's server is gone, and bind its port.
TESTS_NET = Exec(
    "#!/bin/bash\nset -e\n"
    'echo "TESTS-NET $(readlink /proc/self/ns/net)"\n'
    "python3 - <<'EOF'\n"
    "import socket\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', 8765), timeout=2).close()\n"
    "    print('AGENT-SERVER-STILL-THERE')\n"
    "except OSError:\n"
    "    pass\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', 8765)); s.listen(); print('PORT-FREE')\n"
    "EOF\n"
)


def _line(text: str, prefix: str) -> str:
    return next(line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix))


def test_the_sandboxes_up_to_the_agents_share_a_loopback_and_the_tests_get_their_own(tasks, e2e_config):
    url = tasks.task(
        install=['echo "INSTALL-NET $(readlink /proc/self/ns/net)"'],
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_net.sh": TESTS_NET},
    )
    first = evaluate(url, AGENT, config=e2e_config, sandbox="bwrap")
    assert (first.status, first.passed) == ("completed", True), (first.error, first.test_output)
    assert "AGENT-SERVER-UP" in first.agent_output
    assert "PORT-FREE" in first.test_output and "AGENT-SERVER-STILL-THERE" not in first.test_output
    install_net = _line(first.log, "INSTALL-NET ")
    agent_net, tests_net = _line(first.agent_output, "AGENT-NET "), _line(first.test_output, "TESTS-NET ")
    assert agent_net.startswith("net:[") and agent_net == install_net  # one after the other, one namespace
    assert tests_net.startswith("net:[") and tests_net != agent_net  # the tests' own
    assert os.readlink("/proc/self/ns/net") not in (agent_net, tests_net)  # never the host's
    # The next evaluation makes its own (its number may be the freed one's: the kernel reuses them).
    second = evaluate(url, AGENT, config=e2e_config, sandbox="bwrap")
    assert (second.status, second.passed) == ("completed", True), second.error
    assert _line(second.agent_output, "AGENT-NET ") != os.readlink("/proc/self/ns/net")
