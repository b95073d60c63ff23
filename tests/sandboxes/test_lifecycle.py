"""A live sandbox's end (SPEC §24): idle and lifetime limits, MAX_SANDBOXES, limits crossed, and a
dead init, a dead sandbox process or a dead worker leaving no process, mount, folder or cgroup."""

from __future__ import annotations

import os
import signal

from evaluations.runtime import killer
from tests.helpers.polling import wait_for
from tests.sandboxes.conftest import Api


def ended(api: Api, sandbox_id: str, timeout: float = 120) -> dict:
    def check():
        body = api.json("GET", f"/sandboxes/{sandbox_id}")[1]
        return body if body["status"] not in ("starting", "ready") else None

    return wait_for(check, timeout=timeout, what=f"sandbox {sandbox_id} to end")


def tagged(sandbox_id: str) -> list:
    return killer.tagged(f"sandbox-{sandbox_id}")


def leftovers(service, sandbox_id: str) -> list[str]:
    """What of the sandbox is still on the host: processes, mounts, folders, its cgroup."""
    found = [f"process {proc.pid}" for proc in tagged(sandbox_id)]
    with open("/proc/self/mountinfo") as mounts:
        found += [line.split()[4] for line in mounts if f"sandbox-{sandbox_id}" in line]
    found += [entry.name for entry in os.scandir(service.sessions) if sandbox_id in entry.name]
    for hierarchy in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        for folder, _, _ in os.walk(hierarchy):
            if folder.endswith(f"sandbox-{sandbox_id}"):
                found.append(folder)
    return found


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as name:
            return name.read().strip()
    except OSError:
        return ""


def owner_process(sandbox_id: str) -> int:
    """The sandbox's process: the parent of its bubblewrap (the first tagged process whose parent is not)."""
    procs = tagged(sandbox_id)
    pids = {proc.pid for proc in procs}
    return next(proc.ppid for proc in procs if proc.ppid not in pids)


def test_an_idle_sandbox_expires(api, base_image):
    sandbox_id = api.create({"environment": {"image": base_image[1]}, "idle_timeout_secs": 2})["sandbox_id"]
    body = ended(api, sandbox_id)
    assert body["status"] == "expired" and "idle" in body["error"], body
    assert wait_for(lambda: not leftovers(api.service, sandbox_id), what="nothing left")


def test_a_sandbox_past_its_lifetime_expires(api, base_image):
    # Neither "ready" nor an exec awaited before it ends: whether they fit in the 3 s (counted from
    # the POST) is the machine's speed (a fresh host builds the init and pulls the image inside
    # them), not what this test is about.
    status, body = api.json("POST", "/sandboxes", {"environment": {"image": base_image[1]}, "max_lifetime_secs": 3})
    assert status in (201, 202), body
    sandbox_id = body["sandbox_id"]
    body = ended(api, sandbox_id)
    assert body["status"] == "expired" and "max_lifetime_secs" in body["error"], body
    status, answer = api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "true"})
    assert (status, answer["error"]) == (410, "gone")


def test_a_sandbox_over_memory_reports_it(api, base_image):
    sandbox_id = api.create({"environment": {"image": base_image[1]}, "memory_mb": 64})["sandbox_id"]
    hog = "python3 -c 'b = bytearray(512 * 1024 * 1024); import time; time.sleep(5)'"
    status, result = api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": hog})
    assert status in (200, 410), result
    if status == 200:
        assert result["exit_code"] == 137, result
    body = ended(api, sandbox_id)
    assert body["status"] == "failed" and body["error_kind"] == "limit_exceeded" and "memory" in body["error"], body
    assert wait_for(lambda: not leftovers(api.service, sandbox_id), what="nothing left")


def test_a_sandbox_over_its_disk_quota_reports_it(api, base_image):
    sandbox_id = api.create({"environment": {"image": base_image[1]}, "storage_mb": 8})["sandbox_id"]
    response = api.call("PUT", f"/sandboxes/{sandbox_id}/files?path=/big", raw=b"x" * (9 * 1024 * 1024))
    assert response.status == 413, response.body  # refused before a byte is written
    api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "head -c 20000000 /dev/zero > /root/fill; sleep 5"})
    body = ended(api, sandbox_id)
    assert body["status"] == "failed" and "disk quota" in body["error"], body
    assert wait_for(lambda: not leftovers(api.service, sandbox_id), what="nothing left")


def test_a_dead_init_ends_the_sandbox_and_leaves_nothing(api, base_image):
    sandbox_id = api.create({"environment": {"image": base_image[1]}})["sandbox_id"]
    init = next(proc.pid for proc in tagged(sandbox_id) if comm(proc.pid) == "te-init")
    os.kill(init, signal.SIGKILL)
    body = ended(api, sandbox_id)
    assert body["status"] == "failed" and body["error_kind"] == "infrastructure", body
    assert wait_for(lambda: not leftovers(api.service, sandbox_id), what="nothing left")


def test_a_dead_sandbox_process_is_cleaned_up_by_the_worker(api, base_image):
    sandbox_id = api.create({"environment": {"image": base_image[1]}})["sandbox_id"]
    os.kill(owner_process(sandbox_id), signal.SIGKILL)
    body = ended(api, sandbox_id)
    assert body["status"] == "failed" and "process died" in body["error"], body
    assert wait_for(lambda: not leftovers(api.service, sandbox_id), what="nothing left")


def test_max_sandboxes_then_the_reaper_after_a_dead_worker_and_sandbox(sandbox_services, base_image):
    """Two things a service of its own is for (each start costs seconds): past MAX_SANDBOXES a POST is
    503; then the worker and a sandbox's process are killed, and the reaper cleans up."""
    live = sandbox_services(WORKER_STALE_SECS="2", MAX_SANDBOXES="1")
    api = Api(live)
    first = api.create({"environment": {"image": base_image[1]}})["sandbox_id"]
    status, body = api.json("POST", "/sandboxes", {"environment": {"image": base_image[1]}})
    assert (status, body["error"]) == (503, "at_capacity"), body
    assert api.call("DELETE", f"/sandboxes/{first}").status == 204

    sandbox_id = api.create({"environment": {"image": base_image[1]}})["sandbox_id"]
    owner = owner_process(sandbox_id)
    live.worker.send_signal(signal.SIGKILL)
    os.kill(owner, signal.SIGKILL)  # nobody left to clean up: the reaper must
    live.worker.wait(timeout=30)
    wait_for(lambda: not tagged(sandbox_id), what="the sandbox's processes to die with their owner")
    assert leftovers(live, sandbox_id), "a mount or a folder should be left for the reaper"

    def reap() -> str | None:
        """One reap; its line once it found the sandbox lost (its worker's heartbeat gone stale, past
        WORKER_STALE_SECS=2): until then it leaves the live sandbox's folder and mount alone."""
        reaped = live.manage("reap_sessions")
        line = reaped.stdout + reaped.stderr
        return line if "sandboxes_lost=1" in line else None

    line = wait_for(reap, timeout=120, interval=1, what="the reaper to find the sandbox's worker lost")
    assert not leftovers(live, sandbox_id), line
    assert api.json("GET", f"/sandboxes/{sandbox_id}")[1]["status"] == "failed"
