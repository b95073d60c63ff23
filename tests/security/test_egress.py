"""Containment II (SPEC §12), from inside real sandboxes: egress by policy, kernel limits, resources.

Every evaluation here runs under bubblewrap, in its cgroup where the host has them (as root here:
cgroup v1), with the egress proxy of its own. What an agent tries is reported on its output; what
the proxy saw is the evaluation's ``egress``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import psutil
import pytest

from evaluations.runtime import cgroups
from tests.helpers.runtimes import REGISTRIES
from tests.helpers.tasks import ADD_TEST, SOLVER
from tests.security.support import evaluate, still_works

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

METADATA = "169.254.169.254"
# Each target: straight to it (there is no route but the sandbox's own loopback), then through the
# relay with CONNECT, as HTTPS_PROXY clients do. The proxy's answer is its status line.
PROBE = (
    """\
import json, os, socket
report = {}
for host, port in json.loads(os.environ["TARGETS"]):
    direct = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    direct.settimeout(3)
    try:
        direct.connect((host, port))
        straight = "connected"
    except OSError as exc:
        straight = type(exc).__name__
    finally:
        direct.close()
    try:
        relay = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        relay.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
        answer = relay.recv(4096).decode(errors="replace").split("\\r\\n")[0]
        relay.close()
    except OSError as exc:
        answer = "no proxy: " + type(exc).__name__
    report[f"{host}:{port}"] = [straight, answer]
print("REPORT " + json.dumps(report))
"""
    + SOLVER
)


@pytest.fixture
def config(e2e_config):
    return dataclasses.replace(e2e_config, install_timeout_secs=300)


def host_address() -> str:
    """This machine's first non-loopback IPv4 address."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    pytest.skip("no non-loopback address on this host")


def report_of(evaluation) -> dict:
    return json.loads(evaluation.agent_output.split("REPORT ", 1)[1].splitlines()[0])


def test_a_default_agent_reaches_neither_the_service_the_database_the_host_nor_the_metadata(tasks, config, http_server):
    service_port = http_server.port  # the port a service listens on, on this host's loopback
    targets = [["127.0.0.1", service_port], ["127.0.0.1", 5432], [host_address(), service_port], [METADATA, 80]]
    evaluation = evaluate(tasks.task(), PROBE, config=config, sandbox="bwrap", env={"TARGETS": json.dumps(targets)})
    assert evaluation.passed, evaluation.error  # the agent ran with network on (AGENT_NETWORK's default)
    report = report_of(evaluation)
    for host, port in targets:
        straight, through_proxy = report[f"{host}:{port}"]
        assert straight != "connected", (host, port)  # no route out of the sandbox's own loopback
        assert through_proxy.startswith("HTTP/1.1 403"), (host, port, through_proxy)
    refused = {(e["host"], e["port"]): e for e in evaluation.egress if not e["allowed"]}
    assert refused[("127.0.0.1", 5432)]["reason"] == "loopback address"
    assert refused[(METADATA, 80)]["reason"] == "link-local address"
    assert refused[(host_address(), service_port)]["reason"] in ("host's own address", "private address")
    assert all(e["step"] == "running_agent" for e in refused.values())
    # The executor's own fetch of the repository went through the proxy too, allowed for it alone.
    cloned = [e for e in evaluation.egress if e["step"] == "cloning_repo"]
    assert cloned and all(e["allowed"] and e["host"] == "127.0.0.1" for e in cloned), evaluation.egress
    assert not [e for e in evaluation.egress if e["step"] == "running_agent" and e["allowed"]]


PIP_DOWNLOAD = "pip download --no-deps --no-cache-dir -d {folder} six==1.16.0"


def test_an_allowed_registry_works_in_install_and_agent_and_the_egress_list_says_so(tasks, config):
    allowed = dataclasses.replace(config, egress_allow=REGISTRIES)
    agent = f"import subprocess\nsubprocess.run({PIP_DOWNLOAD.format(folder='/tmp/agent').split()!r}, check=True)\n"
    url = tasks.task(install=[PIP_DOWNLOAD.format(folder="/tmp/install")])
    evaluation = evaluate(url, agent + SOLVER, config=allowed, sandbox="bwrap")
    assert evaluation.passed, (evaluation.error, evaluation.agent_output[-2000:])
    made = {(e["step"], e["host"]) for e in evaluation.egress if e["allowed"]}
    for step in ("installing_deps", "running_agent"):
        assert (step, "pypi.org") in made and (step, "files.pythonhosted.org") in made, evaluation.egress
    pypi = next(e for e in evaluation.egress if e["host"] == "files.pythonhosted.org")
    assert pypi["reason"] == "allowed by EGRESS_ALLOW" and pypi["bytes_in"] > 10_000 and pypi["count"] >= 1


def test_a_denied_host_is_refused_though_allowed(tasks, config):
    denied = dataclasses.replace(config, egress_allow=REGISTRIES, egress_deny=("files.pythonhosted.org",))
    url = tasks.task(install=[PIP_DOWNLOAD.format(folder="/tmp/install")])
    evaluation = evaluate(url, SOLVER, config=denied, sandbox="bwrap")
    assert evaluation.status == "failed" and evaluation.error.startswith("installing_deps: install command")
    refused = [e for e in evaluation.egress if e["host"] == "files.pythonhosted.org"]
    assert refused and not refused[0]["allowed"] and refused[0]["reason"] == "denied by EGRESS_DENY"


def test_without_allow_the_registry_is_refused_by_default(tasks, config):
    evaluation = evaluate(
        tasks.task(install=[PIP_DOWNLOAD.format(folder="/tmp/x")]), SOLVER, config=config, sandbox="bwrap"
    )
    assert evaluation.status == "failed"
    refused = [e for e in evaluation.egress if e["host"] == "pypi.org"]
    assert refused and refused[0]["reason"] == "private address"  # 203.0.113.80 here: TEST-NET


def test_the_tests_reach_nothing_with_test_network_off(tasks, config, http_server):
    reach = (
        f"exec 3<>/dev/tcp/127.0.0.1/{http_server.port} && echo REACHED; "
        "env | grep -i _proxy= && echo PROXIED; exit 0\n"
    )
    url = tasks.task(tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_reach.sh": reach})
    evaluation = evaluate(url, SOLVER, config=config, sandbox="bwrap")
    assert evaluation.passed, evaluation.error
    assert "REACHED" not in evaluation.test_output and "PROXIED" not in evaluation.test_output
    assert not [e for e in evaluation.egress if e["step"] == "running_tests"]


CLOSED_PUBLIC = "93.184.215.14"  # a public address: reached under EGRESS_DEFAULT=public, refused in a closed list


def test_a_closed_list_reaches_only_what_allow_names_and_deny_still_wins(tasks, config, http_server):
    """EGRESS_DEFAULT=deny: the registries the install needs and host A, named in EGRESS_ALLOW, are
    reached; a public address, an unnamed registry and the same server by another name or address
    are not; a host both allowed and denied is denied. The clone still reaches the task's repository."""
    port = http_server.port
    closed = dataclasses.replace(
        config,
        egress_default="deny",
        egress_allow=("pypi.org", "files.pythonhosted.org", f"localhost:{port}", f"vm:{port}"),
        egress_deny=("vm",),
    )
    targets = [
        ["localhost", port],
        ["vm", port],
        ["127.0.0.1", port],
        [CLOSED_PUBLIC, 443],
        ["registry.npmjs.org", 443],
    ]
    url = tasks.task(install=[PIP_DOWNLOAD.format(folder="/tmp/install")])
    evaluation = evaluate(url, PROBE, config=closed, sandbox="bwrap", env={"TARGETS": json.dumps(targets)})
    assert evaluation.passed, (evaluation.error, evaluation.agent_output[-2000:])
    report = report_of(evaluation)
    assert report[f"localhost:{port}"][1].startswith("HTTP/1.1 200"), report
    for host, port_ in targets[1:]:
        assert report[f"{host}:{port_}"][1].startswith("HTTP/1.1 403"), (host, report)
    agent = {
        (e["host"], e["port"]): (e["allowed"], e["reason"]) for e in evaluation.egress if e["step"] == "running_agent"
    }
    assert agent == {
        ("localhost", port): (True, "allowed by EGRESS_ALLOW"),
        ("vm", port): (False, "denied by EGRESS_DENY"),
        ("127.0.0.1", port): (False, "not in EGRESS_ALLOW"),
        (CLOSED_PUBLIC, 443): (False, "not in EGRESS_ALLOW"),
        ("registry.npmjs.org", 443): (False, "not in EGRESS_ALLOW"),
    }, evaluation.egress
    installed = {(e["host"], e["allowed"]) for e in evaluation.egress if e["step"] == "installing_deps"}
    assert {("pypi.org", True), ("files.pythonhosted.org", True)} <= installed, evaluation.egress
    cloned = [e for e in evaluation.egress if e["step"] == "cloning_repo"]
    assert cloned and all(e["allowed"] and e["host"] == "127.0.0.1" for e in cloned), evaluation.egress


needs_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or not cgroups.detect().enforced, reason="needs root and cgroups (v1 or v2)"
)

BURST = """\
import multiprocessing, time
def hold(_):
    block = bytearray(64 * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(30)
with multiprocessing.Pool(8) as pool:  # 512 MiB asked at once, by 8 processes, against 256 MiB
    pool.map(hold, range(8))
"""


@needs_cgroups
def test_a_burst_allocation_never_goes_past_the_memory_limit_and_the_error_names_it(tasks, config):
    limited = dataclasses.replace(config, memory_limit_mb=256)
    evaluation = evaluate(tasks.task(), BURST, config=limited, sandbox="bwrap")
    assert evaluation.status == "failed"
    assert evaluation.error.startswith("running_agent: memory limit exceeded (peak "), evaluation.error
    assert evaluation.error.endswith(" MiB > 256 MiB)")
    assert evaluation.resources["peak_memory_bytes"] <= 256 * 2**20 * 1.05  # the kernel held it
    still_works(tasks, config, "bwrap")


FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


@needs_cgroups
def test_a_fork_bomb_stops_at_the_process_limit_and_the_next_evaluation_passes(tasks, config):
    limited = dataclasses.replace(config, max_processes=64)
    evaluation = evaluate(tasks.task(), FORK_BOMB, config=limited, sandbox="bwrap")
    assert evaluation.status == "failed"
    assert evaluation.error.startswith("running_agent: process limit exceeded"), evaluation.error
    assert evaluation.resources["peak_processes"] <= 64 + 16  # the kernel's pids.max, plus RLIMIT_NPROC's margin
    still_works(tasks, config, "bwrap")


@needs_cgroups
def test_every_evaluation_has_its_resources_and_leaves_no_cgroup(tasks, config, settings):
    evaluation = evaluate(tasks.task(), SOLVER, config=config, sandbox="bwrap")
    assert evaluation.passed
    figures = evaluation.resources
    assert set(figures) == {"peak_memory_bytes", "cpu_seconds", "peak_processes", "peak_disk_bytes", "peak_files"}
    assert figures["peak_memory_bytes"] > 1024 * 1024 and figures["cpu_seconds"] > 0
    assert figures["peak_processes"] >= 1 and figures["peak_disk_bytes"] > 0 and figures["peak_files"] > 0
    support = cgroups.detect(settings.EXECUTOR.cgroup_parent)
    assert not [p for p in support.parents.values() if (Path(p) / str(evaluation.id)).exists()]
