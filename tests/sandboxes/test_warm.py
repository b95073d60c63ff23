"""Warm sandboxes (SANDBOX_WARM_IMAGES): made ahead, never listed, taken by a POST for their image
with the request's owner, user, workdir, env and network, and made again for the next one."""

from __future__ import annotations

from tests.helpers.polling import wait_for
from tests.sandboxes.conftest import TENANTS, Api


def ready_count(api: Api) -> float:
    text = api.call("GET", "/metrics").body.decode()
    line = next(line for line in text.splitlines() if line.startswith('term_executor_sandboxes{status="ready"}'))
    return float(line.split()[-1])


def test_a_post_takes_a_warm_sandbox_with_its_own_settings_and_a_bad_one_fails_alone(sandbox_services, image_ref):
    service = sandbox_services(
        SANDBOX_WARM_IMAGES=image_ref,
        SANDBOX_WARM_COUNT="1",
        AUTH_TOKENS=",".join(f"{name}:{token}" for name, token in TENANTS.items()),
    )
    alice, bob = Api(service, TENANTS["alice"]), Api(service, TENANTS["bob"])
    wait_for(lambda: ready_count(alice) >= 1, timeout=300, what="a warm sandbox")
    assert alice.json("GET", "/sandboxes")[1] == []  # a warm one is nobody's, and not listed

    spec = {"environment": {"image": image_ref}, "env": {"MARK": "taken"}, "user": "nobody", "workdir": "/srv/work"}
    status, body = alice.json("POST", "/sandboxes", spec)
    assert status == 201 and body["status"] == "ready", body
    sandbox_id = body["sandbox_id"]
    assert body["ready_at"] == body["created_at"]  # taken, not started: ready the moment it was made
    result = alice.exec(sandbox_id, 'echo "$MARK $(id -u) $(pwd)"')
    assert result["stdout"] == "taken 65534 /srv/work\n", result
    assert [row["sandbox_id"] for row in alice.json("GET", "/sandboxes")[1]] == [sandbox_id]
    assert bob.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "true"})[0] == 404
    assert bob.json("GET", f"/sandboxes/{sandbox_id}")[0] == 404

    wait_for(lambda: ready_count(alice) >= 2, timeout=300, what="the next warm sandbox")  # made again

    # What a warm one was not made with goes the usual way.
    other = alice.create({"environment": {"image": image_ref}, "memory_mb": 256})["sandbox_id"]
    assert other != sandbox_id and alice.exec(other, "true")["exit_code"] == 0
    for taken in (sandbox_id, other):
        assert alice.call("DELETE", f"/sandboxes/{taken}").status == 204

    # A user the image does not have fails the request; the warm one it took is made again.
    status, body = alice.json("POST", "/sandboxes", {"environment": {"image": image_ref}, "user": "no-such-user"})
    assert status == 400 and body["error"] == "task_invalid" and "no-such-user" in body["detail"], body
    wait_for(lambda: ready_count(alice) >= 1, timeout=300, what="a new warm sandbox")
    taken = alice.create({"environment": {"image": image_ref}})["sandbox_id"]
    assert alice.exec(taken, "true")["exit_code"] == 0
    assert alice.call("DELETE", f"/sandboxes/{taken}").status == 204
