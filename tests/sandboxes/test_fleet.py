"""Several hosts on one database (SPEC §24): a sandbox lives on the host that made it; any host's API
answers for it, with 307 to its host's PUBLIC_URL for what only that host can do."""

from __future__ import annotations

import json

from tests.helpers.http import request
from tests.sandboxes.conftest import TOKEN, Api

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_sandbox_is_answered_by_any_host_and_served_by_its_own(sandbox_services, image_ref):
    first = sandbox_services(public=True)
    second = sandbox_services(public=True, database_url=first.env["DATABASE_URL"])
    unnamed = sandbox_services(database_url=first.env["DATABASE_URL"])  # no PUBLIC_URL
    made_on_first, via_second = Api(first), Api(second)
    sandbox_id = made_on_first.create({"environment": {"image": image_ref}})["sandbox_id"]

    status, body = via_second.json("GET", f"/sandboxes/{sandbox_id}")  # the row: any host reads it
    assert status == 200 and body["status"] == "ready"
    assert sandbox_id in [row["sandbox_id"] for row in via_second.json("GET", "/sandboxes")[1]]

    for method, path, data in (
        ("POST", f"/sandboxes/{sandbox_id}/exec", json.dumps({"command": "echo here"}).encode()),
        ("PUT", f"/sandboxes/{sandbox_id}/files?path=/root/a.txt", b"A"),
        ("GET", f"/sandboxes/{sandbox_id}/files?path=/root/a.txt", None),
        ("PUT", f"/sandboxes/{sandbox_id}/network", json.dumps({"mode": "no-network"}).encode()),
    ):
        moved = via_second.call(method, path, raw=data)
        if method == "GET":  # urllib follows a GET's redirect itself: the answer is the owner's
            assert moved.status == 200 and moved.body == b"A"
            continue
        assert moved.status == 307, (method, path, moved.body)
        assert moved.headers["Location"] == first.url(path)
        followed = request(method, moved.headers["Location"], data=data, headers=AUTH)
        assert followed.status in (200, 204), followed.body
        if path.endswith("/exec"):
            assert json.loads(followed.body)["stdout"] == "here\n"

    moved = via_second.call("DELETE", f"/sandboxes/{sandbox_id}")
    assert moved.status == 307 and moved.headers["Location"] == first.url(f"/sandboxes/{sandbox_id}")
    assert request("DELETE", moved.headers["Location"], headers=AUTH).status == 204
    status, body = via_second.json("GET", f"/sandboxes/{sandbox_id}")
    assert body["status"] == "stopped"
    status, body = via_second.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "true"})
    assert (status, body["error"]) == (410, "gone")  # ended: no redirect, on any host

    # A host without PUBLIC_URL cannot be redirected to: its sandboxes are answered 503 elsewhere.
    elsewhere = Api(unnamed).create({"environment": {"image": image_ref}})["sandbox_id"]
    try:
        status, body = via_second.json("POST", f"/sandboxes/{elsewhere}/exec", {"command": "true"})
        assert status == 503 and "PUBLIC_URL" in body["detail"], body
    finally:
        Api(unnamed).call("DELETE", f"/sandboxes/{elsewhere}")
