"""``POST /sandboxes/{id}/services/{name}/stop`` (Harbor's ``stop_service``, SPEC §24): every process of
the service killed with its pid namespace, its root kept (its files, its volumes, still read and
written), exec in it refused (409), GET showing it ``stopped``, the rest of the sandbox running on;
stopping it again does nothing; each exec's row names the service it ran in."""

from __future__ import annotations

import uuid

from tests.helpers.polling import wait_for
from tests.sandboxes.test_compose import task_url, with_marker
from tests.sandboxes.test_compose_volumes import read_member, volumes_compose
from tests.sandboxes.test_lifecycle import leftovers


def stop(api, sandbox_id: str, name: str):
    return api.call("POST", f"/sandboxes/{sandbox_id}/services/{name}/stop")


def test_stopping_main_then_a_service(api, sandbox_service, image_ref, web):
    """main stopped first, as Harbor's trial does before a separate verifier: its processes end (one it
    left in the background too), its files and its artifacts folder (bound in the sidecar) still
    answer, exec in it is refused; the sidecar still runs and answers exec. Then the sidecar: its
    processes end, its files answer, its exec is refused. DELETE ends the rest."""
    main_marker, side_marker = (f"te-stop-{uuid.uuid4().hex[:8]}" for _ in range(2))
    compose = volumes_compose(
        image_ref,
        "echo side > /logs/artifacts/side.txt; sleep infinity; :",
        side=["${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}"],
    )
    compose["services"]["side"]["command"].append(side_marker)  # its shell's $0, to find it on the host
    sandbox_id = api.create({"environment": {"task_url": task_url(web, image_ref, compose)}})["sandbox_id"]
    files = f"/sandboxes/{sandbox_id}/files"
    try:
        left = f"sh -c 'sleep 1000; :' {main_marker} >/dev/null 2>&1 &"  # a process main leaves running
        assert api.exec(sandbox_id, left)["exit_code"] == 0
        assert api.exec(sandbox_id, "echo kept > /root/kept.txt")["exit_code"] == 0
        assert api.exec(sandbox_id, "echo ran", service="side")["stdout"] == "ran\n"
        assert with_marker(main_marker) and with_marker(side_marker)

        assert stop(api, sandbox_id, "main").status == 204
        assert not with_marker(main_marker), "main's processes end with it"
        status, body = api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "true"})
        assert status == 409 and body["error"] == "service_stopped" and "'main'" in body["detail"], body
        response = api.call("GET", f"{files}?path=/root/kept.txt")
        assert response.status == 200 and response.body == b"kept\n"
        response = api.call("GET", f"{files}?path=/logs/artifacts")  # Harbor's collection after the stop
        assert response.status == 200 and read_member(response.body, "side.txt") == b"side\n"
        assert api.call("PUT", f"{files}?path=/root/after.txt", raw=b"after\n").status == 204  # as docker cp
        # the sidecar runs on, and still writes what main's root shows
        assert with_marker(side_marker)
        assert api.exec(sandbox_id, "echo more > /logs/artifacts/more.txt", service="side")["exit_code"] == 0
        assert api.call("GET", f"{files}?path=/logs/artifacts/more.txt").body == b"more\n"
        status, body = api.json("GET", f"/sandboxes/{sandbox_id}")
        assert body["status"] == "ready" and body["environment"]["state"] == "stopped", body
        assert body["environment"]["services"][0]["state"] == "running", body
        assert stop(api, sandbox_id, "main").status == 204  # again: nothing to do, as docker's

        assert stop(api, sandbox_id, "side").status == 204
        assert not with_marker(side_marker), "the service's processes end with it"
        status, body = api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "true", "service": "side"})
        assert status == 409 and body["error"] == "service_stopped" and "'side'" in body["detail"], body
        response = api.call("GET", f"{files}?path=/logs/artifacts/side.txt&service=side")
        assert response.status == 200 and response.body == b"side\n"
        response = api.call("GET", f"{files}?path=/etc/hostname&service=side")
        assert response.status == 200, response.body
        status, body = api.json("GET", f"/sandboxes/{sandbox_id}")
        assert body["status"] == "ready" and body["environment"]["services"][0]["state"] == "stopped", body
        assert stop(api, sandbox_id, "side").status == 204
    finally:
        assert api.call("DELETE", f"/sandboxes/{sandbox_id}").status == 204
    assert wait_for(lambda: not leftovers(sandbox_service, sandbox_id), what="nothing left")
    status, body = api.json("GET", f"/sandboxes/{sandbox_id}")
    assert body["status"] == "stopped" and body["environment"]["state"] == "stopped", body
    # each exec's row names its service: blank for main
    database = sandbox_service.database
    key = sandbox_id if database.name else uuid.UUID(sandbox_id).hex
    query = "SELECT position, service FROM evaluations_sandboxexec WHERE sandbox_id = %s ORDER BY position"
    rows = wait_for(lambda: (found := database.rows(query, (key,))) and len(found) >= 4 and found, what="exec rows")
    assert [service for _, service in rows] == ["", "", "side", "side"], rows  # none for the refused ones


def test_stopping_a_service_the_sandbox_lacks_or_an_ended_sandbox(api, image_ref, web):
    compose = volumes_compose(image_ref, "exec sleep infinity")
    sandbox_id = api.create({"environment": {"task_url": task_url(web, image_ref, compose)}})["sandbox_id"]
    try:
        response = stop(api, sandbox_id, "db")
        assert response.status == 404 and b"no service 'db' (its services: main, side)" in response.body
        assert stop(api, str(uuid.uuid4()), "main").status == 404
        assert api.exec(sandbox_id, "echo still")["stdout"] == "still\n"  # nothing was stopped
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox_id}")
    response = stop(api, sandbox_id, "side")
    assert response.status == 410, response.body


def test_with_main_stopped_the_sandbox_is_still_held_to_its_limits(api, image_ref, web):
    """main's sandbox carried the watch over the whole sandbox: once it is stopped, a service filling a
    volume past ``storage_mb`` still ends the sandbox, as before."""
    compose = volumes_compose(
        image_ref, "sleep infinity", main=["fill:/fill"], side=["fill:/fill"], volumes={"fill": None}
    )
    spec = {"environment": {"task_url": task_url(web, image_ref, compose)}, "storage_mb": 32}
    sandbox_id = api.create(spec)["sandbox_id"]
    try:
        assert stop(api, sandbox_id, "main").status == 204
        fill = "head -c 20M /dev/zero > /fill/a; head -c 20M /dev/zero > /fill/b; sleep 30"
        api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": fill, "service": "side"}, timeout=120)

        def ended():
            found = api.json("GET", f"/sandboxes/{sandbox_id}")[1]
            return found if found["status"] != "ready" else None

        body = wait_for(ended, timeout=60, what="the sandbox to end over its quota")
        assert body["status"] == "failed" and body["error_kind"] == "limit_exceeded", body
        assert "disk quota exceeded" in body["error"], body
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox_id}")
