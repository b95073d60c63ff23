"""Bad input and containment of live sandboxes (SPEC §24, §21): each refused with a clear error."""

from __future__ import annotations

import io
import os
import tarfile
import threading
import uuid

import pytest

from tests.sandboxes.conftest import TENANTS, Api


@pytest.fixture
def sandbox(api, image_ref):
    body = api.create({"environment": {"image": image_ref}})
    yield body["sandbox_id"]
    api.call("DELETE", f"/sandboxes/{body['sandbox_id']}")


def test_an_unknown_sandbox_is_not_found(api):
    for method, path in (
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/exec"),
        ("GET", "/files?path=/etc/passwd"),
        ("PUT", "/network"),
    ):
        for sandbox_id in (str(uuid.uuid4()), "not-a-uuid"):
            status, body = api.json(method, f"/sandboxes/{sandbox_id}{path}", {} if method in ("POST", "PUT") else None)
            assert (status, body["error"]) == (404, "not_found"), (method, path, body)


def test_another_tenants_sandbox_is_not_found_and_not_listed(sandbox_service, image_ref):
    alice, bob = Api(sandbox_service, TENANTS["alice"]), Api(sandbox_service, TENANTS["bob"])
    sandbox_id = alice.create({"environment": {"image": image_ref}})["sandbox_id"]
    try:
        status, body = bob.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "id"})
        assert (status, body["error"]) == (404, "not_found")
        assert bob.json("GET", f"/sandboxes/{sandbox_id}")[0] == 404
        assert bob.call("DELETE", f"/sandboxes/{sandbox_id}").status == 404
        assert sandbox_id not in [row["sandbox_id"] for row in bob.json("GET", "/sandboxes")[1]]
        assert sandbox_id in [row["sandbox_id"] for row in alice.json("GET", "/sandboxes")[1]]
        assert alice.exec(sandbox_id, "true")["exit_code"] == 0  # still alive, untouched
    finally:
        alice.call("DELETE", f"/sandboxes/{sandbox_id}")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "environment"),
        ({"environment": {"image": ""}}, "environment.image"),
        ({"environment": {"image": "a", "task_url": "b"}}, "environment"),
        ({"environment": {"dockerfile": "Dockerfile"}}, "environment.dockerfile"),
        ({"environment": {"image": "a"}, "network": {"mode": "open"}}, "network.mode"),
        (
            {"environment": {"image": "a"}, "network": {"mode": "allowlist", "allowed_hosts": ["*"]}},
            "network.allowed_hosts",
        ),
        (
            {"environment": {"image": "a"}, "network": {"mode": "public", "allowed_hosts": ["x.org"]}},
            "network.allowed_hosts",
        ),
        ({"environment": {"image": "a"}, "memory_mb": -1}, "memory_mb"),
        ({"environment": {"image": "a"}, "env": {"A=B": "c"}}, "env"),
        ({"environment": {"image": "a"}, "workdir": "relative"}, "workdir"),
        ({"environment": {"image": "a"}, "surprise": 1}, "surprise"),
    ],
)
def test_a_bad_body_is_refused_naming_its_field(api, body, field):
    status, answer = api.json("POST", "/sandboxes", body)
    assert status == 400 and answer["error"] == "bad_request", answer
    assert field in answer["fields"], answer


def test_an_image_that_does_not_exist_fails_as_the_callers_fault(api, image_ref):
    missing = image_ref.rsplit(":", 1)[0] + ":no-such-tag"
    status, body = api.json("POST", "/sandboxes", {"environment": {"image": missing}})
    assert status == 400 and body["error"] == "task_invalid", body


def test_bad_exec_requests(api, sandbox):
    for request, field in (
        ({}, "command"),
        ({"command": []}, "command"),
        ({"command": "true", "cwd": "relative"}, "cwd"),
        ({"command": "true", "timeout_secs": -1}, "timeout_secs"),
        ({"command": "true", "user": "no-such-user"}, "user"),
        ({"command": "true", "env": {"": "x"}}, "env"),
    ):
        status, body = api.json("POST", f"/sandboxes/{sandbox}/exec", request)
        assert status == 400 and field in body["detail"], (request, body)
    missing = api.exec(sandbox, ["no-such-program"])
    assert missing["exit_code"] == 127 and "no-such-program" in missing["stderr"]
    gone_dir = api.exec(sandbox, "true", cwd="/no/such/folder")
    assert gone_dir["exit_code"] == 126 and "/no/such/folder" in gone_dir["stderr"]


def test_a_path_leaving_the_root_stays_inside_it(api, sandbox):
    """Paths with .. and links the sandbox made to / resolve inside the sandbox's root, never the host's."""
    marker = f"escape-{uuid.uuid4().hex}"
    response = api.call("PUT", f"/sandboxes/{sandbox}/files?path=/../../../../tmp/{marker}", raw=b"x")
    assert response.status == 204
    assert not os.path.exists(f"/tmp/{marker}")
    assert api.exec(sandbox, f"cat /tmp/{marker}")["stdout"] == "x"
    api.exec(sandbox, "ln -s / /root/hostroot; ln -s ../../../../../etc /root/up")
    for path in (f"/root/hostroot/etc/{marker}", f"/root/up/{marker}"):
        response = api.call("PUT", f"/sandboxes/{sandbox}/files?path={path}", raw=b"y")
        assert response.status == 204, response.body
        assert not os.path.exists(f"/etc/{marker}")
    assert api.exec(sandbox, f"cat /etc/{marker}")["stdout"] == "y"
    # Reading through a link to a host-only path reads the sandbox's own file.
    api.exec(sandbox, "echo mine > /etc/hostname-probe; ln -sf /etc/hostname-probe /root/probe")
    assert api.call("GET", f"/sandboxes/{sandbox}/files?path=/root/probe").body == b"mine\n"
    # A tar whose members climb out lands inside, or is refused.
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        info = tarfile.TarInfo(f"../../../../tmp/{marker}-tar")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"z"))
    response = api.call("PUT", f"/sandboxes/{sandbox}/files?path=/root&extract=tar", raw=packed.getvalue())
    assert response.status in (204, 400), response.body
    assert not os.path.exists(f"/tmp/{marker}-tar")
    for bad in ("relative/path", ""):
        response = api.call("PUT", f"/sandboxes/{sandbox}/files?path={bad}", raw=b"x")
        assert response.status == 400


def test_several_execs_run_at_once(api, sandbox):
    """Two execs that each wait for the other's file: they finish only if they run together."""
    results = []

    def run(mine, theirs):
        results.append(
            api.exec(
                sandbox,
                f"touch /tmp/{mine}; for i in $(seq 600); do [ -e /tmp/{theirs} ] && exit 0; sleep 0.1; done; exit 1",
            )
        )

    threads = [threading.Thread(target=run, args=pair) for pair in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [result["exit_code"] for result in results] == [0, 0]


def test_output_is_capped_per_stream(api, sandbox):
    result = api.exec(sandbox, "head -c 3000000 /dev/zero | tr '\\\\0' a; echo done >&2")
    assert result["truncated"] is True and result["stderr"] == "done\n"
    assert len(result["stdout"]) < 1_100_000


def test_the_network_policy_changes_between_phases(api, sandbox, web):
    fetch = (
        "python3 -c 'import sys, urllib.request; "
        f'print(urllib.request.urlopen("http://127.0.0.1:{web.port}/hello.txt", timeout=20).read().decode())\''
    )
    direct = {"NO_PROXY": "", "no_proxy": ""}  # the proxy's variables say 127.0.0.1 is reached directly
    assert api.exec(sandbox, fetch, env=direct)["stdout"] == "hello from the host\n\n"
    for network in ({"mode": "no-network"}, {"mode": "allowlist", "allowed_hosts": ["example.org"]}):
        status, body = api.json("PUT", f"/sandboxes/{sandbox}/network", network)
        assert status == 200 and body["mode"] == network["mode"]
        refused = api.exec(sandbox, fetch, env=direct)
        assert refused["exit_code"] != 0 and "403" in refused["stderr"], refused
    status, _ = api.json("PUT", f"/sandboxes/{sandbox}/network", {"mode": "allowlist", "allowed_hosts": ["127.0.0.1"]})
    assert status == 200
    assert api.exec(sandbox, fetch, env=direct)["exit_code"] == 0
    status, body = api.json("PUT", f"/sandboxes/{sandbox}/network", {"mode": "sideways"})
    assert status == 400 and "network.mode" in body["detail"]
    assert api.json("GET", f"/sandboxes/{sandbox}")[1]["network"] == {
        "mode": "allowlist",
        "allowed_hosts": ["127.0.0.1"],
    }


def test_every_user_of_the_image_has_the_sandbox_s_network(api, sandbox, web):
    """An exec as another user than the sandbox's (root here, the image's nobody) goes out through
    the same proxy, and its policy: the proxy knows every id of the sandbox's range, not the lease's alone."""
    fetch = (
        "python3 -c 'import sys, urllib.request; "
        f'print(urllib.request.urlopen("http://127.0.0.1:{web.port}/hello.txt", timeout=20).read().decode())\''
    )
    direct = {"NO_PROXY": "", "no_proxy": ""}
    for user in ("root", "nobody", 4242):
        result = api.exec(sandbox, fetch, env=direct, user=user)
        assert result["stdout"] == "hello from the host\n\n", (user, result)
    status, _ = api.json("PUT", f"/sandboxes/{sandbox}/network", {"mode": "no-network"})
    assert status == 200
    for user in ("root", "nobody"):
        refused = api.exec(sandbox, fetch, env=direct, user=user)
        assert refused["exit_code"] != 0 and "403" in refused["stderr"], (user, refused)


def test_the_host_services_are_out_of_reach(api, sandbox):
    """PostgreSQL, Redis, MariaDB and RabbitMQ on the host's loopback: a sandbox reaches none."""
    probe = (
        "python3 -c 'import socket, sys\n"
        "for port in (5432, 6379, 3306, 5672):\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        '    print(port, s.connect_ex(("127.0.0.1", port)))\n\''
    )
    result = api.exec(sandbox, probe)
    lines = dict(line.split() for line in result["stdout"].split("\n") if line)
    assert lines and all(code != "0" for code in lines.values()), result
