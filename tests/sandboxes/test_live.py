"""Live sandboxes over HTTP (SPEC §24), against a real service, worker and registry on 127.0.0.1."""

from __future__ import annotations

import io
import tarfile

import pytest

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
