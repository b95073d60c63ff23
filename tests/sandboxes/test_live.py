"""Live sandboxes over HTTP (SPEC §24), against a real service, worker and registry on 127.0.0.1."""

from __future__ import annotations

import io
import tarfile

import pytest

from tests.helpers import images as images_helpers
from tests.helpers.polling import wait_for


@pytest.fixture
def sandbox(api, image_ref):
    body = api.create({"environment": {"image": image_ref}})
    yield body["sandbox_id"]
    api.call("DELETE", f"/sandboxes/{body['sandbox_id']}")


def test_a_sandbox_from_an_image_is_ready_and_runs_commands_as_its_root(api, image_ref, sandbox):
    status, body = api.json("GET", f"/sandboxes/{sandbox}")
    assert status == 200 and body["status"] == "ready"
    assert body["environment"]["kind"] == "image" and body["environment"]["digest"].startswith("sha256:")
    result = api.exec(sandbox, "echo out; echo err >&2; id -u; exit 3")
    assert result["exit_code"] == 3
    assert result["stdout"] == "out\n0\n" and result["stderr"] == "err\n"
    assert result["timed_out"] is False and result["truncated"] is False


def test_argv_cwd_env_and_user(api, sandbox):
    result = api.exec(
        sandbox, ["sh", "-c", 'echo "$FOO:$(pwd):$(id -u)"'], cwd="/tmp", env={"FOO": "bar"}, user="nobody"
    )
    assert result["stdout"] == "bar:/tmp:65534\n", result


def test_state_persists_between_execs(api, sandbox):
    assert api.exec(sandbox, "echo hello > /root/note; mkdir -p /work")["exit_code"] == 0
    assert api.exec(sandbox, "cat /root/note")["stdout"] == "hello\n"


def test_an_exec_past_its_timeout_is_killed_with_its_children(api, sandbox):
    result = api.exec(sandbox, "sleep 300 & setsid sleep 301 & sleep 302", timeout_secs=1)
    assert result["timed_out"] is True and result["exit_code"] == 124
    left = api.exec(sandbox, "ps -eo args 2>/dev/null || ls /proc")
    assert "sleep 30" not in left["stdout"]


def test_files_in_and_out(api, sandbox):
    response = api.call("PUT", f"/sandboxes/{sandbox}/files?path=/data/deep/hello.txt", raw=b"hi there")
    assert response.status == 204, response.body
    assert api.exec(sandbox, "cat /data/deep/hello.txt")["stdout"] == "hi there"
    got = api.call("GET", f"/sandboxes/{sandbox}/files?path=/data/deep/hello.txt")
    assert got.status == 200 and got.body == b"hi there"
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        for name, data in (("a.txt", b"A"), ("sub/b.txt", b"BB")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    response = api.call("PUT", f"/sandboxes/{sandbox}/files?path=/tests&extract=tar", raw=packed.getvalue())
    assert response.status == 204, response.body
    assert api.exec(sandbox, "cat /tests/a.txt /tests/sub/b.txt")["stdout"] == "ABB"
    folder = api.call("GET", f"/sandboxes/{sandbox}/files?path=/tests")
    assert folder.status == 200 and folder.headers["Content-Type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(folder.body)) as tar:
        assert sorted(tar.getnames()) == ["a.txt", "sub", "sub/b.txt"]
        assert tar.extractfile("sub/b.txt").read() == b"BB"
    missing = api.call("GET", f"/sandboxes/{sandbox}/files?path=/nope")
    assert missing.status == 404


def test_delete_stops_it_and_later_requests_are_gone(api, image_ref):
    sandbox_id = api.create({"environment": {"image": image_ref}})["sandbox_id"]
    assert api.call("DELETE", f"/sandboxes/{sandbox_id}").status == 204
    status, body = api.json("GET", f"/sandboxes/{sandbox_id}")
    assert body["status"] == "stopped"
    status, body = api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "true"})
    assert status == 410 and body["error"] == "gone"


def test_metrics_count_live_sandboxes_and_their_execs(api, sandbox):
    def figure(text: str, name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))

    before = api.call("GET", "/metrics").body.decode()
    api.exec(sandbox, "true")
    api.exec(sandbox, "true")

    def counted():
        text = api.call("GET", "/metrics").body.decode()
        return (
            text
            if figure(text, "term_executor_sandbox_execs_total")
            >= figure(before, "term_executor_sandbox_execs_total") + 2
            else None
        )

    text = wait_for(counted, timeout=60, what="the execs to be counted")  # recorded after each answer
    assert figure(text, 'term_executor_sandboxes{status="ready"}') >= 1


# An ENTRYPOINT that starts a server as the image's User (daemon), then runs its arguments: Harbor's
# docker backend keeps it and replaces the CMD by sh -c "sleep infinity".
SERVING = 'python3 -m http.server 8000 --directory /etc >/dev/null 2>&1 & echo "first as $(id -un)"; exec "$@"'
PROCESSES = (  # "user argv" of each process of the sandbox (the image has no ps)
    'python3 -c \'import os, pwd\nfor p in filter(str.isdigit, os.listdir("/proc")):\n'
    '    try: print(pwd.getpwuid(os.stat(f"/proc/{p}").st_uid).pw_name, '
    'open(f"/proc/{p}/cmdline", "rb").read().replace(bytes(1), b" ").decode().strip())\n'
    "    except OSError: pass'"
)
FETCH = (
    "for i in $(seq 300); do python3 -c 'import urllib.request; "
    'urllib.request.urlopen("http://127.0.0.1:8000/hostname", timeout=5)\' 2>/dev/null && echo served && exit 0; '
    "sleep 0.1; done; echo never"
)


def test_the_images_entrypoint_runs_as_its_first_process(api, base_image, base_layer):
    """SPEC §23-24: the image's ENTRYPOINT starts with the sandbox, as a container's, as its User, its
    CMD replaced by Harbor's ``sleep infinity``; an exec reaches what it serves on 127.0.0.1. An image
    without one starts nothing."""
    registry, _, _ = base_image
    images_helpers.push_image(
        registry,
        "live/entrypoint:1",
        layers=[base_layer],
        config={
            "Entrypoint": ["sh", "-c", SERVING, "first"],
            "Cmd": ["bash", "-c", "echo never run"],
            "User": "daemon",
        },
    )
    made = api.create({"environment": {"image": f"{registry.host}/live/entrypoint:1"}})["sandbox_id"]
    try:
        assert api.exec(made, FETCH, user="root")["stdout"] == "served\n"
        started = api.exec(made, PROCESSES, user="root")["stdout"].splitlines()
        assert "daemon sleep infinity" in started, started
        assert any(line.startswith("daemon python3 -m http.server 8000") for line in started), started
    finally:
        api.call("DELETE", f"/sandboxes/{made}")
    plain = api.create({"environment": {"image": base_image[1]}})["sandbox_id"]
    try:
        assert not [line for line in api.exec(plain, PROCESSES)["stdout"].splitlines() if "sleep" in line]
    finally:
        api.call("DELETE", f"/sandboxes/{plain}")
