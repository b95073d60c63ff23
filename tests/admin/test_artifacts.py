"""The admin's artifact download: a kept file to a logged-in staff user with the view permission, as the API's
route serves it (attachment, octet-stream, nosniff, ETag), only a listed path, nobody else.

The artifacts are really kept (artifacts.keep on a folder in tmp_path) into a data folder in tmp_path.
"""

from __future__ import annotations

import hashlib
import html as htmllib
import os
import re
import shutil
import uuid
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Permission, User

from evaluations import artifacts
from evaluations.models import Evaluation
from tests.helpers.unsafe_paths import UNSAFE_ARTIFACT_PATHS

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/evaluations/evaluation/"
FILES = {
    "trajectory.json": b'{"steps": []}',
    "sub/dir/notes.md": b"# notes\n",
    "page.html": b"<script>alert(1)</script>",
    "été résumé.txt": "déjà".encode(),
    "runs/step 1 <x>?#%.txt": b"odd but safe",
}


@pytest.fixture
def config(executor_config, tmp_path):
    return executor_config(data_dir=tmp_path / "data")


@pytest.fixture
def evaluation(config, tmp_path) -> Evaluation:
    made = Evaluation.objects.create(task_url="https://t.example/t.tgz", agent_code="x", status="failed")
    folder = tmp_path / "agent"
    for relpath, data in FILES.items():
        (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
        (folder / relpath).write_bytes(data)
    kept = artifacts.keep(made.id, folder, config, owner_uid=os.getuid())
    assert sorted(a["path"] for a in kept.artifacts) == sorted(FILES), kept.summary()
    Evaluation.objects.filter(id=made.id).update(artifacts=kept.artifacts)
    made.refresh_from_db()
    return made


def staff(client, *, view: bool):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    if view:
        user.user_permissions.add(Permission.objects.get(codename="view_evaluation"))
    assert client.login(username="viewer", password="pw")
    return client


def get(client, eval_id, path: str, **headers):
    return client.get(f"{CHANGELIST}{eval_id}/artifact/{path}", **headers)


def body(reply) -> bytes:
    return b"".join(reply.streaming_content) if reply.streaming else reply.content


def test_a_view_only_staff_user_downloads_each_kept_artifact_from_the_detail_page(client, evaluation):
    staff(client, view=True)
    page = client.get(f"{CHANGELIST}{evaluation.id}/change/").content.decode()
    links = dict(
        (htmllib.unescape(text), htmllib.unescape(href))
        for href, text in re.findall(r'<tr><td><a href="([^"]+)">([^<]*)</a></td>', page)
    )
    assert sorted(links) == sorted(FILES)
    for path, data in FILES.items():
        reply = client.get(links[path])
        assert reply.status_code == 200, (path, body(reply))
        assert body(reply) == data, path
        assert reply["Content-Type"] == "application/octet-stream"
        assert reply["Content-Length"] == str(len(data))
        assert reply["X-Content-Type-Options"] == "nosniff"
        assert reply["ETag"] == f'"{hashlib.sha256(data).hexdigest()}"'
        assert reply["Content-Disposition"].startswith("attachment; filename")
        assert "private" in reply["Cache-Control"]
    assert (
        links["runs/step 1 <x>?#%.txt"] == f"{CHANGELIST}{evaluation.id}/artifact/runs/step%201%20%3Cx%3E%3F%23%25.txt"
    )
    assert get(client, evaluation.id, "sub/dir/notes.md")["Content-Disposition"] == 'attachment; filename="notes.md"'
    disposition = get(client, evaluation.id, "été résumé.txt")["Content-Disposition"]
    assert disposition == "attachment; filename*=utf-8''%C3%A9t%C3%A9%20r%C3%A9sum%C3%A9.txt"


def test_the_admin_and_the_api_send_the_same_headers(client, api, evaluation):
    staff(client, view=True)
    for path in FILES:
        quoted = quote(path)  # '?', '#' and '%' are the path's own
        mine, theirs = get(client, evaluation.id, quoted), api.get(f"/evaluate/{evaluation.id}/artifacts/{quoted}")
        assert mine.status_code == theirs.status_code == 200, path
        for header in ("Content-Type", "Content-Length", "Content-Disposition", "X-Content-Type-Options", "ETag"):
            assert mine[header] == theirs[header], (path, header)


def test_if_none_match_answers_304(client, evaluation):
    staff(client, view=True)
    etag = get(client, evaluation.id, "trajectory.json")["ETag"]
    reply = get(client, evaluation.id, "trajectory.json", HTTP_IF_NONE_MATCH=etag)
    assert (reply.status_code, reply.content, reply["ETag"]) == (304, b"", etag)
    assert get(client, evaluation.id, "trajectory.json", HTTP_IF_NONE_MATCH='"other"').status_code == 200


def test_anonymous_users_non_staff_and_staff_without_view_permission_get_nothing(client, evaluation):
    reply = get(client, evaluation.id, "trajectory.json")
    assert reply.status_code == 302 and "/admin/login/" in reply["Location"]
    User.objects.create_user("someone", password="pw")  # logged in, not staff
    assert client.login(username="someone", password="pw")
    reply = get(client, evaluation.id, "trajectory.json")
    assert reply.status_code == 302 and "/admin/login/" in reply["Location"]
    client.logout()
    staff(client, view=False)
    reply = get(client, evaluation.id, "trajectory.json")
    assert (reply.status_code, reply.content) == (403, b"forbidden")


# A newline matches no admin route at all (a 404, tested below): the rest are refused by name.
@pytest.mark.parametrize("path, why", [case for case in UNSAFE_ARTIFACT_PATHS if case[0] != "a%0Ab"])
def test_unsafe_names_are_400(client, evaluation, path, why):
    staff(client, view=True)
    reply = get(client, evaluation.id, path)
    assert (reply.status_code, reply["Content-Type"]) == (400, "text/plain"), reply.content
    assert reply.content.decode().startswith("not a safe artifact name: ") and why in reply.content.decode()


def test_unlisted_paths_and_unknown_evaluations_are_404(client, config, evaluation):
    staff(client, view=True)
    (artifacts.store_root(config) / str(evaluation.id) / "planted").write_text("in the store, not on the list")
    for path, says in (
        ("absent.txt", "has no artifact absent.txt"),
        ("planted", "has no artifact planted"),
        ("sub", "has no artifact sub"),  # a folder is not listed
        ("%FF", "has no artifact"),  # undecodable: re-quoted by Django, then not listed
    ):
        reply = get(client, evaluation.id, path)
        assert (reply.status_code, reply["Content-Type"]) == (404, "text/plain"), path
        assert says in reply.content.decode() and b"not on the list" not in reply.content, path
    assert get(client, evaluation.id, "a%0Ab").status_code == 404  # a newline: no route matches
    assert get(client, uuid.uuid4(), "trajectory.json").status_code == 404
    shutil.rmtree(artifacts.store_root(config) / str(evaluation.id))  # listed, but gone from the store
    reply = get(client, evaluation.id, "trajectory.json")
    assert reply.status_code == 404 and b"is no longer stored" in reply.content
