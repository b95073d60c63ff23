"""The evaluation's own loopback (pipeline/run.py ``_loopback``, Context.loopback): the sandboxes of one
evaluation on the host's system join one network namespace, one after another, instead of making one each;
never the host's, never another evaluation's, and nothing of one phase's listens on in the next."""

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
# background (setsid: out of its process group); its sandbox's end takes it.
AGENT = (
    SOLVER
    + """
import os, subprocess
print('AGENT-NET ' + os.readlink('/proc/self/ns/net'))
subprocess.Popen(['python3', '-c', 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 8765)); s.listen(); time.sleep(60)'],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
import time, socket
for _ in range(200):
    try:
        socket.create_connection(('127.0.0.1', 8765), timeout=1).close()
        print('AGENT-SERVER-UP')
        break
    except OSError:
        time.sleep(0.05)
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


def test_one_evaluations_sandboxes_share_a_loopback_of_their_own_and_nothing_outlives_a_phase(tasks, e2e_config):
    url = tasks.task(tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_net.sh": TESTS_NET})
    first = evaluate(url, AGENT, config=e2e_config, sandbox="bwrap")
    assert (first.status, first.passed) == ("completed", True), (first.error, first.test_output)
    assert "AGENT-SERVER-UP" in first.agent_output
    assert "PORT-FREE" in first.test_output and "AGENT-SERVER-STILL-THERE" not in first.test_output
    agent_net, tests_net = _line(first.agent_output, "AGENT-NET "), _line(first.test_output, "TESTS-NET ")
    assert agent_net.startswith("net:[") and agent_net == tests_net
    assert agent_net != os.readlink("/proc/self/ns/net")  # never the host's
    # The next evaluation makes its own (its number may be the freed one's: the kernel reuses them).
    second = evaluate(url, AGENT, config=e2e_config, sandbox="bwrap")
    assert (second.status, second.passed) == ("completed", True), second.error
    assert _line(second.agent_output, "AGENT-NET ") != os.readlink("/proc/self/ns/net")
