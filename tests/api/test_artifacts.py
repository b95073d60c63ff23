"""GET /evaluate/{eval_id}/artifacts/{path}: a kept file as an attachment, only a listed one, only to who may see it.

The evaluations are real rows and their artifacts are really kept (artifacts.keep on a folder in
tmp_path); the last test asks the real service over HTTP with paths a browser would never send.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import uuid

import pytest

from evaluations import artifacts
from evaluations.models import Evaluation
from tests.helpers.unsafe_paths import UNSAFE_ARTIFACT_PATHS

pytestmark = pytest.mark.django_db

FILES = {
    "trajectory.json": b'{"steps": []}',
    "sub/dir/notes.md": b"# notes\n",
    "page.html": b"<script>alert(1)</script>",
    "été résumé.txt": "déjà".encode(),
}
OPERATOR, ALICE, BOB = "operator-token", "alice-token", "bob-token"


@pytest.fixture
def config(executor_config, tmp_path):
    return executor_config(data_dir=tmp_path / "data")


def with_artifacts(config, tmp_path, owner=None, files=FILES) -> Evaluation:
    evaluation = Evaluation.objects.create(task_url="https://t.example/t.tgz", agent_code="x", owner=owner)
    folder = tmp_path / f"agent-{evaluation.id}"
    for relpath, data in files.items():
        (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
        (folder / relpath).write_bytes(data)
    kept = artifacts.keep(evaluation.id, folder, config, owner_uid=os.getuid())
    Evaluation.objects.filter(id=evaluation.id).update(artifacts=kept.artifacts)
    evaluation.refresh_from_db()
    return evaluation


def get(api, eval_id, path, **headers):
    return api.get(f"/evaluate/{eval_id}/artifacts/{path}", **headers)


def assert_error(reply, status, code, *words):
    assert reply.status_code == status, reply.content
    assert reply["Content-Type"] == "application/json"
    body = reply.json()
    assert body["error"] == code, body
    for word in words:
        assert word in body["detail"], body


def test_a_listed_artifact_is_served_as_an_attachment(api, config, tmp_path):
    evaluation = with_artifacts(config, tmp_path)
    assert api.get(f"/evaluate/{evaluation.id}").json()["artifacts"] == evaluation.artifacts
    for path, data in FILES.items():
        reply = get(api, evaluation.id, path)
        assert reply.status_code == 200, reply.content
        assert b"".join(reply.streaming_content) == data
        assert reply["Content-Type"] == "application/octet-stream"
        assert reply["Content-Length"] == str(len(data))
        assert reply["X-Content-Type-Options"] == "nosniff"
        assert reply["ETag"] == f'"{hashlib.sha256(data).hexdigest()}"'
        assert reply["Content-Disposition"].startswith("attachment; filename")
    assert get(api, evaluation.id, "sub/dir/notes.md")["Content-Disposition"] == 'attachment; filename="notes.md"'
    disposition = get(api, evaluation.id, "été résumé.txt")["Content-Disposition"]
    assert disposition == "attachment; filename*=utf-8''%C3%A9t%C3%A9%20r%C3%A9sum%C3%A9.txt"
    html = get(api, evaluation.id, "page.html", HTTP_ACCEPT="text/html")  # never rendered as a page
    assert (html["Content-Type"], html["X-Content-Type-Options"]) == ("application/octet-stream", "nosniff")


def test_an_encoded_slash_is_a_slash(api, config, tmp_path):
    """The server decodes the path before routing (WSGI's PATH_INFO): %2F names the same listed file."""
    evaluation = with_artifacts(config, tmp_path)
    reply = get(api, evaluation.id, "sub%2Fdir%2Fnotes.md")
    assert reply.status_code == 200 and b"".join(reply.streaming_content) == FILES["sub/dir/notes.md"]


def test_if_none_match_answers_304(api, config, tmp_path):
    evaluation = with_artifacts(config, tmp_path)
    etag = get(api, evaluation.id, "trajectory.json")["ETag"]
    reply = get(api, evaluation.id, "trajectory.json", HTTP_IF_NONE_MATCH=etag)
    assert (reply.status_code, reply.content, reply["ETag"]) == (304, b"", etag)
    assert get(api, evaluation.id, "trajectory.json", HTTP_IF_NONE_MATCH='"other"').status_code == 200


@pytest.mark.parametrize("path, why", UNSAFE_ARTIFACT_PATHS)
def test_unsafe_names_are_400_in_the_envelope(api, config, tmp_path, path, why):
    evaluation = with_artifacts(config, tmp_path)
    reply = get(api, evaluation.id, path, HTTP_ACCEPT="application/octet-stream")
    assert_error(reply, 400, "invalid_request", "not a safe artifact name", why)
    assert list(reply.json()["fields"]) == ["path"]


def test_unknown_evaluations_and_unlisted_paths_are_404(api, config, tmp_path):
    evaluation = with_artifacts(config, tmp_path)
    assert_error(get(api, uuid.uuid4(), "trajectory.json"), 404, "not_found", "no evaluation")
    assert_error(get(api, "not-a-uuid", "trajectory.json"), 404, "not_found", "no evaluation")
    assert_error(get(api, evaluation.id, "absent.txt"), 404, "not_found", "has no artifact absent.txt")
    assert_error(get(api, evaluation.id, "sub"), 404, "not_found", "has no artifact sub")  # a folder is not listed
    assert_error(get(api, evaluation.id, "%FF"), 404, "not_found")  # undecodable: re-quoted, then not listed
    # Listed, but its file is gone from the store (removed by hand, or a crash during purge).
    shutil.rmtree(artifacts.store_root(config) / str(evaluation.id))
    assert_error(get(api, evaluation.id, "trajectory.json"), 404, "not_found", "no longer stored")


def test_a_file_in_the_store_but_not_listed_is_not_served(api, config, tmp_path):
    evaluation = with_artifacts(config, tmp_path)
    (artifacts.store_root(config) / str(evaluation.id) / "planted").write_text("not on the list")
    assert_error(get(api, evaluation.id, "planted"), 404, "not_found", "has no artifact planted")


def test_artifacts_need_the_token_and_belong_to_their_tenant(api, config, executor_config, tmp_path):
    executor_config(auth_tokens=(OPERATOR,), tenant_tokens=(("alice", ALICE), ("bob", BOB)))
    evaluation = with_artifacts(config, tmp_path, owner="alice")
    assert_error(get(api, evaluation.id, "trajectory.json"), 401, "unauthorized")
    assert_error(get(api, evaluation.id, "trajectory.json", HTTP_AUTHORIZATION="Bearer wrong"), 401, "unauthorized")
    mine = get(api, evaluation.id, "trajectory.json", HTTP_AUTHORIZATION=f"Bearer {ALICE}")
    assert mine.status_code == 200 and b"".join(mine.streaming_content) == FILES["trajectory.json"]
    theirs = get(api, evaluation.id, "trajectory.json", HTTP_AUTHORIZATION=f"Bearer {BOB}")
    assert_error(theirs, 404, "not_found")
    assert theirs.json() == {"error": "not_found", "detail": f"no evaluation {evaluation.id}"}  # as a missing one
    assert get(api, evaluation.id, "trajectory.json", HTTP_AUTHORIZATION=f"Bearer {OPERATOR}").status_code == 200


def test_unsafe_paths_over_real_http(live_service):
    """Through gunicorn, with the request line as sent (http.client normalizes nothing)."""
    service = live_service()
    eval_id = json.loads(
        service.manage(
            "shell",
            "-c",
            "import json, os, pathlib, shutil, tempfile; from django.conf import settings; "
            "from evaluations import artifacts; from evaluations.models import Evaluation; "
            "e = Evaluation.objects.create(task_url='https://t.example/t.tgz', agent_code='x'); "
            "d = pathlib.Path(tempfile.mkdtemp()); (d / 'sub').mkdir(); (d / 'sub' / 'f.txt').write_text('kept'); "
            "os.symlink('/etc/passwd', d / 'passwd'); "
            "k = artifacts.keep(e.id, d, settings.EXECUTOR, owner_uid=os.getuid()); "
            "Evaluation.objects.filter(id=e.id).update(artifacts=k.artifacts); shutil.rmtree(d); "
            "print(json.dumps(str(e.id)))",
        ).stdout.splitlines()[-1]  # after any log line the start-up checks print
    )

    def raw_get(path: str) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
        try:
            conn.request("GET", f"/evaluate/{eval_id}/artifacts/{path}")
            reply = conn.getresponse()
            return reply.status, dict(reply.getheaders()), reply.read()
        finally:
            conn.close()

    status, headers, body = raw_get("sub/f.txt")
    assert (status, body, headers["Content-Type"]) == (200, b"kept", "application/octet-stream")
    assert raw_get("sub%2Ff.txt")[2] == b"kept"
    for path in ("../../../../etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd", "%2e%2e/%2e%2e/etc/passwd", "sub/./f.txt"):
        status, headers, body = raw_get(path)
        assert status == 400 and json.loads(body)["error"] == "invalid_request", (path, body)
    status, _, body = raw_get("passwd")  # the agent's link was never kept
    assert status == 404 and b"root:" not in body
