"""Two evaluations at once on a live service (gunicorn + run_worker), with and without
bubblewrap: the attacker cannot read, write, signal or starve the victim."""

from __future__ import annotations

import os

import pytest

from evaluations.runtime import probe_bwrap
from tests.helpers.http import request
from tests.helpers.polling import submit, wait_for, wait_terminal
from tests.security.support import live_still_works

pytestmark = pytest.mark.slow

HELD = 30  # processes each side keeps alive; MAX_PROCESSES=40, so RLIMIT_NPROC = 56 per uid

VICTIM = f"""
import os, sys, time
print('UID', os.getuid(), flush=True)
home = os.environ['HOME']
for path in ('secret.txt', home + '/secret.txt'):
    open(path, 'w').write('victim-secret')
children = []
for _ in range({HELD}):
    pid = os.fork()
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    children.append(pid)
open('.holding', 'w').write('x')
for _ in range(1200):  # the test writes .release once the attacker is done
    if os.path.exists('.release'):
        break
    time.sleep(0.05)
alive = sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in children)
intact = all(open(p).read() == 'victim-secret' for p in ('secret.txt', home + '/secret.txt'))
print('ALIVE', alive, 'INTACT', intact, 'PLANTED', os.path.exists('planted'), flush=True)
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
if alive == {HELD} and intact and not os.path.exists('planted'):
    open('calc.py', 'w').write('def add(a, b):\\n    return a + b\\n')
"""

ATTACKER = f"""
import json, os, signal, time
print('UID', os.getuid(), flush=True)
victim, victim_id = os.environ['VICTIM'], os.environ['VICTIM_ID']
forked = 0
for _ in range({HELD}):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        forked += 1
    except OSError as exc:
        print('FORK FAILED', exc.errno, flush=True)
        break
print('FORKED', forked, flush=True)
for path in ['/repo/secret.txt', '/home/secret.txt', '/agent/agent.py', '/repo', '/home', '']:
    try:
        if os.path.isdir(victim + path):
            print('LISTED', path, os.listdir(victim + path), flush=True)
        else:
            print('READ', path, open(victim + path).read()[:50], flush=True)
    except OSError as exc:
        print('DENIED read', path, exc.errno, flush=True)
for path in ['/repo/planted', '/home/planted', '/tmp/planted']:
    try:
        open(victim + path, 'w').write('x')
        print('WROTE', path, flush=True)
    except OSError as exc:
        print('DENIED write', path, exc.errno, flush=True)
seen = 0
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        cmdline = open(f'/proc/{{pid}}/cmdline', 'rb').read()
    except OSError:
        continue
    if victim_id.encode() not in cmdline or os.stat(f'/proc/{{pid}}').st_uid == os.getuid():
        continue  # not the victim's (bwrap's own argv names VICTIM_ID)
    seen += 1
    try:
        env = open(f'/proc/{{pid}}/environ', 'rb').read()
        print('ENVIRON', pid, env[:80], flush=True)
    except OSError:
        pass
    try:
        os.kill(int(pid), signal.SIGKILL)
        print('KILLED', pid, flush=True)
    except OSError as exc:
        pass
print('SEEN', seen, flush=True)
os.kill(-1, signal.SIGKILL)  # everything this uid may signal
"""


@pytest.fixture(scope="module", params=["none", "bwrap"])
def service(request, live_factory):
    if request.param == "bwrap":
        works, detail = probe_bwrap()
        if not works:
            if os.environ.get("REQUIRE_SANDBOX") == "1":
                pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
            pytest.skip(detail)
    return live_factory(SANDBOX=request.param, MAX_PROCESSES=40)


def test_a_concurrent_evaluation_cannot_read_write_signal_or_starve_another(service, module_www):
    tasks, _server = module_www
    victim_id = submit(service, tasks.task(), VICTIM)
    session = service.workspace_base / victim_id
    wait_for(lambda: (session / "repo" / ".holding").exists(), 60, what="the victim to hold its processes")
    env = {"VICTIM": str(session), "VICTIM_ID": victim_id}
    attacker = wait_terminal(service, submit(service, tasks.task(), ATTACKER, env=env))
    (session / "repo" / ".release").write_text("x")
    victim = wait_terminal(service, victim_id)

    out = attacker["agent_output"]
    assert f"FORKED {HELD}" in out, out  # a uid of its own: the victim's processes do not count
    for word in ("LISTED", "READ", "WROTE", "ENVIRON", "KILLED", "victim-secret"):
        assert word not in out, out
    assert out.count("DENIED") == 9
    if service.env["SANDBOX"] == "none":  # the victim's processes are in sight, yet out of reach
        assert "SEEN 0" not in out, out
    assert victim["agent_output"].split("UID")[1].split()[0] != out.split("UID")[1].split()[0]
    assert f"ALIVE {HELD} INTACT True PLANTED False" in victim["agent_output"], victim["agent_output"]
    assert (victim["status"], victim["passed"]) == ("completed", True), victim["error"]
    live_still_works(service, tasks)


def test_status_says_what_is_not_enforced(service, module_www):
    body = request("GET", service.url("/status")).json()
    assert body["sandbox"] == service.env["SANDBOX"]
    warned = " ".join(body["warnings"])
    if service.env["SANDBOX"] == "none":
        assert "network isolation" in warned and "cannot be enforced" in warned
    else:
        assert "network" not in warned
    log = (service.folder / "worker.log").read_text()
    assert ("network isolation" in log) == (service.env["SANDBOX"] == "none")
    live_still_works(service, module_www[0])
