"""Client: what it puts on the wire, how it reads answers and errors, redirects, the wait for a
starting sandbox. Against a real HTTP server on 127.0.0.1 (RecordingServer)."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import threading

import httpx
import pytest

from term_executor_client import AsyncClient, Client, Sandbox, TermExecutorError

from recording_server import Answer, as_answer

READY = {"sandbox_id": "sb1", "status": "ready", "environment": {"kind": "image", "ref": "debian:bookworm"}}
STARTING = {**READY, "status": "starting"}
EXEC_RESULT = {"exit_code": 0, "stdout": "hi\n", "stderr": "", "timed_out": False, "truncated": False}


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def names_in(archive: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        return tar.getnames()


@pytest.fixture
def client(server):
    with Client(server.url, "secret") as made:
        yield made


# -- settings ------------------------------------------------------------


def test_url_and_token_come_from_the_environment_when_not_given(server, monkeypatch):
    monkeypatch.setenv("TERM_EXECUTOR_URL", server.url + "/")
    monkeypatch.setenv("TERM_EXECUTOR_TOKEN", "from-env")
    server.answer("GET", "/sandboxes", 200, [])
    with Client() as client:
        assert client.list_sandboxes() == []
    request = server.requests[0]
    assert request.path == "/sandboxes"  # the trailing / of the URL is not doubled
    assert request.headers["authorization"] == "Bearer from-env"


def test_no_url_is_a_clear_error():
    with pytest.raises(ValueError, match="TERM_EXECUTOR_URL"):
        Client()
    with pytest.raises(ValueError, match="TERM_EXECUTOR_URL"):
        AsyncClient(token="t")


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="http:// or https://"):
        Client("ftp://127.0.0.1/", "t")
    with pytest.raises(ValueError, match="http:// or https://"):
        Client("127.0.0.1:8000", "t")


def test_without_a_token_no_authorization_header_is_sent(server):
    server.answer("GET", "/sandboxes", 200, [])
    with Client(server.url) as client:
        client.list_sandboxes()
    assert "authorization" not in server.requests[0].headers


# -- create --------------------------------------------------------------


def test_create_without_context_posts_the_spec_as_json(client, server):
    server.answer("POST", "/sandboxes", 201, READY)
    spec = {"environment": {"image": "debian:bookworm"}, "cpus": 1.5, "network": {"mode": "no-network"}}
    assert client.create_sandbox(spec) == READY
    (request,) = server.requests
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer secret"
    assert request.json() == spec


def test_create_with_context_bytes_posts_multipart_spec_and_context(client, server):
    server.answer("POST", "/sandboxes", 201, READY)
    context = tar_of({"Dockerfile": b"FROM debian:bookworm\n"})
    client.create_sandbox({"environment": {"dockerfile": "Dockerfile"}}, context)
    request = server.requests[0]
    assert request.headers["content-type"].startswith("multipart/form-data; boundary=")
    parts = request.parts()
    assert set(parts) == {"spec", "context"}
    spec_filename, spec = parts["spec"]
    assert spec_filename is None  # a plain form field, not a file
    assert json.loads(spec) == {"environment": {"dockerfile": "Dockerfile"}}
    assert parts["context"] == ("context.tar", context)


def test_create_with_a_folder_sends_it_as_a_gzipped_tar(client, server, tmp_path):
    server.answer("POST", "/sandboxes", 201, READY)
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("a")
    client.create_sandbox({"environment": {"dockerfile": "Dockerfile"}}, tmp_path)
    _, archive = server.requests[0].parts()["context"]
    assert archive[:2] == b"\x1f\x8b"
    assert names_in(archive) == ["Dockerfile", "files", "files/a.txt"]


def test_create_with_a_tar_file_sends_its_bytes(client, server, tmp_path):
    server.answer("POST", "/sandboxes", 201, READY)
    context = tar_of({"Dockerfile": b"FROM x\n"})
    (tmp_path / "context.tar").write_bytes(context)
    client.create_sandbox({"environment": {"dockerfile": "Dockerfile"}}, str(tmp_path / "context.tar"))
    assert server.requests[0].parts()["context"][1] == context


def test_create_with_a_missing_context_path_fails_before_any_request(client, server, tmp_path):
    with pytest.raises(FileNotFoundError, match="no build context"):
        client.create_sandbox({"environment": {"dockerfile": "Dockerfile"}}, tmp_path / "nowhere")
    with pytest.raises(TypeError, match="spec is a dict"):
        client.create_sandbox('{"environment": {}}')
    assert server.requests == []


def test_a_starting_sandbox_is_polled_until_ready(client, server):
    server.answer("POST", "/sandboxes", 202, STARTING)
    server.answer_in_turn("GET", "/sandboxes/sb1", [(200, STARTING), (200, STARTING), (200, READY)])
    assert client.create_sandbox({"environment": {"image": "x"}})["status"] == "ready"
    assert len(server.received("GET", "/sandboxes/sb1")) == 3


def test_without_wait_create_answers_starting_at_once(client, server):
    server.answer("POST", "/sandboxes", 202, STARTING)
    assert client.create_sandbox({"environment": {"image": "x"}}, wait=False)["status"] == "starting"
    assert server.received("GET") == []


def test_a_sandbox_that_fails_while_starting_raises_its_error_kind(client, server):
    failed = {**STARTING, "status": "failed", "error": "the Dockerfile's RUN exited 2", "error_kind": "task_invalid"}
    server.answer("POST", "/sandboxes", 202, STARTING)
    server.answer_in_turn("GET", "/sandboxes/sb1", [(200, STARTING), (200, failed)])
    with pytest.raises(TermExecutorError) as raised:
        client.create_sandbox({"environment": {"image": "x"}})
    assert raised.value.error == "task_invalid"
    assert raised.value.status is None
    assert "RUN exited 2" in raised.value.detail


def test_a_wait_past_its_bound_deletes_the_sandbox_and_raises(client, server):
    server.answer("POST", "/sandboxes", 202, STARTING)
    server.answer("GET", "/sandboxes/sb1", 200, STARTING)
    server.answer("DELETE", "/sandboxes/sb1", 204)
    with pytest.raises(TermExecutorError, match="still starting after 0.3 s") as raised:
        client.create_sandbox({"environment": {"image": "x"}}, wait_secs=0.3)
    assert raised.value.error == "timeout"
    assert len(server.received("DELETE", "/sandboxes/sb1")) == 1


def test_sandbox_object_runs_calls_on_its_id_and_deletes_on_exit(client, server):
    server.answer("POST", "/sandboxes", 201, READY)
    server.answer("POST", "/sandboxes/sb1/exec", 200, EXEC_RESULT)
    server.answer("DELETE", "/sandboxes/sb1", 204)
    with client.sandbox({"environment": {"image": "x"}}) as box:
        assert isinstance(box, Sandbox) and box.id == "sb1"
        assert box.exec("echo hi")["stdout"] == "hi\n"
    assert [(r.method, r.path) for r in server.requests] == [
        ("POST", "/sandboxes"),
        ("POST", "/sandboxes/sb1/exec"),
        ("DELETE", "/sandboxes/sb1"),
    ]


# -- calls on one sandbox ------------------------------------------------


def test_exec_sends_only_the_options_given(client, server):
    server.answer("POST", "/sandboxes/sb1/exec", 200, EXEC_RESULT)
    assert client.exec("sb1", "echo hi") == EXEC_RESULT
    client.exec("sb1", ["ls", "-l"], cwd="/tmp", env={"A": "1"}, timeout_secs=5, user=1000)
    client.exec("sb1", "id", user="root")
    bodies = [r.json() for r in server.requests]
    assert bodies == [
        {"command": "echo hi"},
        {"command": ["ls", "-l"], "cwd": "/tmp", "env": {"A": "1"}, "timeout_secs": 5, "user": 1000},
        {"command": "id", "user": "root"},
    ]


@pytest.mark.parametrize(
    ("command", "options", "error", "message"),
    [
        ([], {}, ValueError, "non-empty list of strings"),
        (["ls", 3], {}, ValueError, "non-empty list of strings"),
        (b"ls", {}, TypeError, "string .* or a list"),
        ("ls", {"timeout_secs": 0}, ValueError, "timeout_secs must be positive"),
        ("ls", {"timeout_secs": -1}, ValueError, "timeout_secs must be positive"),
    ],
)
def test_exec_refuses_bad_input_before_any_request(client, server, command, options, error, message):
    with pytest.raises(error, match=message):
        client.exec("sb1", command, **options)
    assert server.requests == []


def test_sandbox_ids_are_quoted_into_one_path_segment(client, server):
    with pytest.raises(TermExecutorError):
        client.get_sandbox("../evaluate")
    assert server.requests[0].path == "/sandboxes/..%2Fevaluate"
    with pytest.raises(ValueError, match="sandbox id"):
        client.get_sandbox("")


def test_put_file_sends_the_bytes_with_the_path_in_the_query(client, server):
    server.answer("PUT", "/sandboxes/sb1/files", 204)
    client.put_file("sb1", "/work/a b.txt", b"\x00\x01data")
    (request,) = server.requests
    assert request.query == {"path": "/work/a b.txt"}
    assert request.headers["content-type"] == "application/octet-stream"
    assert request.body == b"\x00\x01data"


def test_paths_in_a_sandbox_must_be_absolute(client, server, tmp_path):
    for call in (
        lambda: client.put_file("sb1", "work/a.txt", b""),
        lambda: client.put_dir("sb1", "relative", tmp_path),
        lambda: client.get_file("sb1", "etc/passwd"),
        lambda: client.get_dir("sb1", "", tmp_path),
    ):
        with pytest.raises(ValueError, match="absolute"):
            call()
    with pytest.raises(TypeError, match="bytes"):
        client.put_file("sb1", "/a", "text")
    assert server.requests == []


def test_put_dir_sends_a_tar_of_the_folder_to_extract(client, server, tmp_path):
    server.answer("PUT", "/sandboxes/sb1/files", 204)
    (tmp_path / "test.sh").write_text("#!/bin/sh\n")
    (tmp_path / "test.sh").chmod(0o755)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("x")
    (tmp_path / "link").symlink_to("data/x")
    client.put_dir("sb1", "/tests", tmp_path)
    (request,) = server.requests
    assert request.query == {"path": "/tests", "extract": "tar"}
    assert request.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(request.body)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["data", "data/x", "link", "test.sh"]
    assert members["link"].issym() and members["link"].linkname == "data/x"
    assert members["test.sh"].mode & 0o777 == 0o755
    assert {(m.uid, m.gid, m.uname) for m in members.values()} == {(0, 0, "root")}


def test_put_dir_of_a_missing_folder_is_refused(client, server, tmp_path):
    with pytest.raises(NotADirectoryError):
        client.put_dir("sb1", "/tests", tmp_path / "missing")
    assert server.requests == []


def test_get_file_returns_the_bytes(client, server):
    server.answer("GET", "/sandboxes/sb1/files", 200, b"\x00binary\xff", {"Content-Type": "application/octet-stream"})
    assert client.get_file("sb1", "/logs/agent/oracle.txt") == b"\x00binary\xff"
    assert server.requests[0].query == {"path": "/logs/agent/oracle.txt"}


def test_get_dir_unpacks_the_tar_into_the_folder(client, server, tmp_path):
    archive = tar_of({"reward.txt": b"1\n", "sub/out.log": b"log"})
    server.answer("GET", "/sandboxes/sb1/files", 200, archive, {"Content-Type": "application/x-tar"})
    assert client.get_dir("sb1", "/logs/verifier", tmp_path / "verifier") == []
    assert (tmp_path / "verifier" / "reward.txt").read_bytes() == b"1\n"
    assert (tmp_path / "verifier" / "sub" / "out.log").read_bytes() == b"log"


def test_set_network_sends_mode_and_hosts(client, server):
    server.answer("PUT", "/sandboxes/sb1/network", 200, {"mode": "allowlist"})
    client.set_network("sb1", "allowlist", ["pypi.org", "*.example.com", "10.0.0.0/8"])
    client.set_network("sb1", "no-network")
    assert [r.json() for r in server.requests] == [
        {"mode": "allowlist", "allowed_hosts": ["pypi.org", "*.example.com", "10.0.0.0/8"]},
        {"mode": "no-network", "allowed_hosts": []},
    ]


def test_set_network_refuses_a_bad_mode_or_hosts_outside_allowlist(client, server):
    with pytest.raises(ValueError, match="none of public, no-network, allowlist"):
        client.set_network("sb1", "offline")
    with pytest.raises(ValueError, match="allowed_hosts is for mode 'allowlist'"):
        client.set_network("sb1", "public", ["pypi.org"])
    assert server.requests == []


def test_stop_service_posts_to_the_services_stop_route(client, server):
    server.answer("POST", "/sandboxes/sb1/services/main/stop", 204)
    server.answer("POST", "/sandboxes/sb1/services/web%2F1/stop", 204)
    assert client.stop_service("sb1", "main") is None
    Sandbox(client, READY).stop_service("web/1")  # quoted into one path segment
    assert [(r.method, r.path, r.body) for r in server.requests] == [
        ("POST", "/sandboxes/sb1/services/main/stop", b""),
        ("POST", "/sandboxes/sb1/services/web%2F1/stop", b""),
    ]
    with pytest.raises(ValueError, match="non-empty string"):
        client.stop_service("sb1", "")
    server.answer("POST", "/sandboxes/sb1/services/db/stop", 404, {"error": "not_found", "detail": "no service 'db'"})
    with pytest.raises(TermExecutorError, match="no service 'db'") as raised:
        client.stop_service("sb1", "db")
    assert raised.value.status == 404


def test_delete_answers_none_on_204(client, server):
    server.answer("DELETE", "/sandboxes/sb1", 204)
    assert client.delete_sandbox("sb1") is None


# -- errors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "envelope"),
    [
        (404, {"error": "not_found", "detail": "no sandbox sb1"}),
        (410, {"error": "gone", "detail": "sandbox sb1 is stopped"}),
        (503, {"error": "at_capacity", "detail": "32 sandboxes are running (MAX_SANDBOXES)"}),
    ],
)
def test_an_error_envelope_becomes_term_executor_error(client, server, status, envelope):
    server.answer("POST", "/sandboxes/sb1/exec", status, envelope)
    with pytest.raises(TermExecutorError) as raised:
        client.exec("sb1", "true")
    assert (raised.value.status, raised.value.error, raised.value.detail) == (
        status,
        envelope["error"],
        envelope["detail"],
    )
    assert str(raised.value) == f"HTTP {status} {envelope['error']}: {envelope['detail']}"


def test_an_invalid_request_carries_its_fields(client, server):
    envelope = {"error": "invalid_request", "detail": "the request is invalid: cpus", "fields": {"cpus": ["too many"]}}
    server.answer("POST", "/sandboxes", 400, envelope)
    with pytest.raises(TermExecutorError) as raised:
        client.create_sandbox({"environment": {"image": "x"}, "cpus": 999})
    assert raised.value.fields == {"cpus": ["too many"]}


def test_an_answer_without_an_envelope_keeps_its_text(client, server):
    server.answer("GET", "/sandboxes", 502, b"<html>Bad Gateway</html>", {"Content-Type": "text/html"})
    with pytest.raises(TermExecutorError) as raised:
        client.list_sandboxes()
    assert (raised.value.status, raised.value.error) == (502, "http_502")
    assert "Bad Gateway" in raised.value.detail


def test_a_success_that_is_not_json_is_an_error(client, server):
    server.answer("GET", "/sandboxes/sb1", 200, b"not json")
    with pytest.raises(TermExecutorError, match="bad_answer"):
        client.get_sandbox("sb1")


# -- redirects (a fleet) -------------------------------------------------


def test_a_307_is_followed_with_method_body_query_and_token(client, server, other_server):
    server.respond(
        "PUT",
        "/sandboxes/sb1/files",
        lambda request: _redirect(other_server.url + "/sandboxes/sb1/files?path=%2Fwork%2Fa.txt"),
    )
    other_server.answer("PUT", "/sandboxes/sb1/files", 204)
    client.put_file("sb1", "/work/a.txt", b"content")
    (first,) = server.requests
    (second,) = other_server.requests
    assert second.body == first.body == b"content"
    assert second.query == {"path": "/work/a.txt"}
    assert second.headers["authorization"] == "Bearer secret"
    assert second.headers["host"] == other_server.url.removeprefix("http://")


def test_a_307_to_a_location_without_the_query_keeps_the_query(client, server, other_server):
    server.respond("POST", "/sandboxes/sb1/exec", lambda request: _redirect("/moved/exec"))
    server.answer("POST", "/moved/exec", 200, EXEC_RESULT)
    client.exec("sb1", "true")
    assert [(r.method, r.path, r.json()) for r in server.requests] == [
        ("POST", "/sandboxes/sb1/exec", {"command": "true"}),
        ("POST", "/moved/exec", {"command": "true"}),  # a relative Location, same body
    ]


def test_a_multipart_create_is_sent_again_whole_after_a_307(client, server, other_server):
    server.respond("POST", "/sandboxes", lambda request: _redirect(other_server.url + "/sandboxes"))
    other_server.answer("POST", "/sandboxes", 201, READY)
    client.create_sandbox({"environment": {"dockerfile": "Dockerfile"}}, tar_of({"Dockerfile": b"FROM x\n"}))
    assert other_server.requests[0].parts()["context"] == server.requests[0].parts()["context"]


def test_redirects_are_bounded(client, server):
    server.respond("GET", "/sandboxes/sb1", lambda request: _redirect("/sandboxes/sb1"))
    with pytest.raises(TermExecutorError, match="too_many_redirects"):
        client.get_sandbox("sb1")
    assert len(server.requests) == 6


def test_a_redirect_without_location_or_to_another_scheme_is_an_error(client, server):
    server.respond("GET", "/sandboxes/a", lambda request: _redirect(None))
    server.respond("GET", "/sandboxes/b", lambda request: _redirect("file:///etc/passwd"))
    with pytest.raises(TermExecutorError, match="without a Location"):
        client.get_sandbox("a")
    with pytest.raises(TermExecutorError, match="a redirect to 'file:///etc/passwd'"):
        client.get_sandbox("b")


def test_httpx_own_redirects_would_drop_the_token_across_origins(server, other_server):
    """Why the client follows redirects itself (httpx 0.28's _redirect_headers)."""
    server.respond("GET", "/sandboxes", lambda request: _redirect(other_server.url + "/sandboxes"))
    other_server.answer("GET", "/sandboxes", 200, [])
    with httpx.Client(headers={"Authorization": "Bearer secret"}, follow_redirects=True) as plain:
        plain.get(server.url + "/sandboxes")
    assert "authorization" not in other_server.requests[0].headers


def _redirect(location):
    return Answer(307, b"", {"Location": location} if location else {})


# -- async ---------------------------------------------------------------


def test_async_client_makes_the_same_requests(server, other_server, tmp_path):
    server.answer("POST", "/sandboxes", 202, STARTING)
    server.answer_in_turn("GET", "/sandboxes/sb1", [(200, STARTING), (200, READY)])
    server.respond("POST", "/sandboxes/sb1/exec", lambda request: _redirect(other_server.url + "/sandboxes/sb1/exec"))
    other_server.answer("POST", "/sandboxes/sb1/exec", 200, EXEC_RESULT)
    server.answer("GET", "/sandboxes/sb1/files", 200, tar_of({"reward.txt": b"1"}))
    server.answer("PUT", "/sandboxes/sb1/files", 204)
    server.answer("POST", "/sandboxes/sb1/services/main/stop", 204)
    server.answer("DELETE", "/sandboxes/sb1", 204)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "f").write_text("f")

    async def scenario():
        async with AsyncClient(server.url, "secret") as client:
            async with await client.sandbox({"environment": {"image": "x"}}) as box:
                result = await box.exec(["echo", "hi"], timeout_secs=3)
                await box.put_dir("/tests", tmp_path / "up")
                refused = await box.get_dir("/logs/verifier", tmp_path / "down")
                await box.stop_service("main")
            with pytest.raises(TermExecutorError, match="not_found"):
                await client.get_sandbox("missing")
        return result, refused

    result, refused = asyncio.run(scenario())
    assert result == EXEC_RESULT and refused == []
    assert (tmp_path / "down" / "reward.txt").read_text() == "1"
    assert other_server.requests[0].json() == {"command": ["echo", "hi"], "timeout_secs": 3}
    assert other_server.requests[0].headers["authorization"] == "Bearer secret"
    assert [(r.method, r.path) for r in server.requests] == [
        ("POST", "/sandboxes"),
        ("GET", "/sandboxes/sb1"),
        ("GET", "/sandboxes/sb1"),
        ("POST", "/sandboxes/sb1/exec"),
        ("PUT", "/sandboxes/sb1/files"),
        ("GET", "/sandboxes/sb1/files"),
        ("POST", "/sandboxes/sb1/services/main/stop"),
        ("DELETE", "/sandboxes/sb1"),
        ("GET", "/sandboxes/missing"),
    ]
    assert names_in(server.received("PUT")[0].body) == ["f"]


def test_async_exec_cancelled_closes_its_request(server):
    """Harbor wraps exec in asyncio.wait_for: a cancelled exec must end, not wait for the answer."""
    arrived, release = threading.Event(), threading.Event()

    def slow(request):
        arrived.set()
        release.wait(30)
        return as_answer(200, EXEC_RESULT)

    server.respond("POST", "/sandboxes/sb1/exec", slow)

    async def scenario():
        async with AsyncClient(server.url, "secret") as client:
            task = asyncio.ensure_future(client.exec("sb1", "sleep 100"))
            await asyncio.get_running_loop().run_in_executor(None, arrived.wait, 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    try:
        asyncio.run(scenario())
    finally:
        release.set()
    assert arrived.is_set()
