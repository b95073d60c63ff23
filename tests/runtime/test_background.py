"""``Spawner.background`` (a process beside the commands: an environment's entrypoint, SPEC §23) and
``SharedNetwork`` (one network namespace its sandboxes share): real processes under bubblewrap."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from evaluations.runtime import SandboxPolicy
from evaluations.runtime.netns import SharedNetwork
from tests.runtime.support import DEFAULT_LIMITS, tagged_alive

SERVER = "echo serving; exec python3 -m http.server {port} --bind 127.0.0.1 --directory {folder}"
# Bounded retries: the server needs a moment to listen (about 10 s at most on a loaded machine).
CLIENT = (
    "for i in $(seq 200); do python3 -c 'import urllib.request as u; "
    'print(u.urlopen("http://127.0.0.1:{port}/hello.txt", timeout=5).read().decode().strip())\' '
    "2>/dev/null && exit 0; sleep 0.05; done; echo unreachable; exit 1"
)


@pytest.fixture
def network():
    if os.geteuid() != 0:
        pytest.skip("a network namespace of the environment's is made as root")
    shared = SharedNetwork.create()
    yield shared
    shared.close()


def _policy(sp, **fields) -> SandboxPolicy:
    return SandboxPolicy(writable=(sp.session,), **fields)


def _serve(sp, network, port=8765):
    (sp.session / "hello.txt").write_text("hello over the shared loopback\n")
    argv = ["bash", "-c", SERVER.format(port=port, folder=sp.session)]
    return sp.spawner.background(
        "server", argv, cwd=sp.session, env=sp.env(), limits=DEFAULT_LIMITS, policy=_policy(sp, netns=network.path)
    )


def test_a_server_in_the_shared_namespace_is_reached_and_others_do_not_see_it(bwrap_sp, network):
    server = _serve(bwrap_sp, network)
    joined = bwrap_sp.spawner.run(["bash", "-c", CLIENT.format(port=8765)], cwd=bwrap_sp.session,
                                  env=bwrap_sp.env(), limits=DEFAULT_LIMITS,
                                  policy=_policy(bwrap_sp, netns=network.path))  # fmt: skip
    assert (joined.exit_code, joined.output.strip()) == (0, "hello over the shared loopback"), joined.output
    own = bwrap_sp.run(CLIENT.format(port=8765).replace("seq 200", "seq 3"))  # a namespace of its own
    assert (own.exit_code, own.output.strip()) == (1, "unreachable")
    assert server.alive and server.exit_code is None
    server_pids = server.pids()
    # A sweep (after the agent) spares it; the evaluation's end (close) ends it, and everything in it.
    bwrap_sp.spawner.sweep()
    assert server.alive and {p.pid for p in tagged_alive(bwrap_sp.eval_id)} >= server_pids
    bwrap_sp.spawner.close()
    assert not server.alive and not tagged_alive(bwrap_sp.eval_id)
    assert "serving" in server.output()


def test_a_command_over_its_time_is_killed_without_the_background_process(bwrap_sp, network):
    server = _serve(bwrap_sp, network, port=8766)
    limits = dataclasses.replace(DEFAULT_LIMITS, timeout_secs=0.5)
    hung = bwrap_sp.spawner.run(["sleep", "60"], cwd=bwrap_sp.session, env=bwrap_sp.env(), limits=limits,
                                policy=_policy(bwrap_sp, netns=network.path))  # fmt: skip
    assert hung.limit is not None and hung.limit.value == "timeout"
    assert server.alive
    reached = bwrap_sp.spawner.run(["bash", "-c", CLIENT.format(port=8766)], cwd=bwrap_sp.session,
                                   env=bwrap_sp.env(), limits=DEFAULT_LIMITS,
                                   policy=_policy(bwrap_sp, netns=network.path))  # fmt: skip
    assert reached.exit_code == 0, reached.output
    bwrap_sp.spawner.close()
    assert not tagged_alive(bwrap_sp.eval_id)


def test_a_background_process_that_exits_reports_its_status_and_output(bwrap_sp):
    ended = bwrap_sp.spawner.background(
        "once", ["bash", "-c", "echo once; exit 7"], cwd=bwrap_sp.session, env=bwrap_sp.env(),
        limits=DEFAULT_LIMITS, policy=_policy(bwrap_sp),
    )  # fmt: skip
    ended.proc.wait(timeout=30)
    assert ended.stop()  # its sandbox seen gone
    assert (ended.exit_code, ended.output()) == (7, "once\n")
    bwrap_sp.spawner.close()
    assert not tagged_alive(bwrap_sp.eval_id)


def test_the_namespace_has_its_loopback_up_and_low_ports_open_in_it_alone(network):
    host_setting = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
    before = host_setting.read_text()
    another = SharedNetwork.create()
    try:
        assert host_setting.read_text() == before  # the host's own setting is untouched
        script = "cat /proc/sys/net/ipv4/ip_unprivileged_port_start; grep -c . /proc/net/dev"
        done = subprocess.run(["nsenter", f"--net={another.path}", "--", "sh", "-c", script],
                              capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
        # Low ports open; two header lines and lo alone: no device reaches the host (lo is up: the
        # server tests above reach 127.0.0.1 in such a namespace).
        assert done.stdout.split()[:2] == ["0", "3"], done.stdout
    finally:
        another.close()
    with pytest.raises(ValueError):
        _ = another.path
