"""What one tenant may take of what all share (SPEC §21; issue 34, items 6 and 9).

The holes: with MAX_EVENT_STREAMS=8 one named token held all 8 event streams and everyone
else, operators included, got 503; GET /images listed every image of the host to every token,
another tenant's private references too; and a token made in the admin, with AUTH_TOKEN and
AUTH_TOKENS unset, left the API open to anyone without a token. Now a named token holds at most
MAX_EVENT_STREAMS_PER_TOKEN streams (flock'd files the kernel frees with a dead process, as the
host's), a tenant lists only the images its evaluations ran in, and a token row turns auth on.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from evaluations.api import auth
from evaluations.events import slots
from evaluations.images.store import ImageRecord, ImageStore, now_iso
from evaluations.models import Evaluation, Token
from tests.helpers.http import request
from tests.helpers.polling import wait_for
from tests.helpers.service import PROJECT
from tests.security.test_tenants import ALICE, BOB, GOOD, OPERATOR, TENANTS, add_token, bearer

pytestmark = pytest.mark.django_db


@pytest.fixture
def callers(executor_config, tmp_path):
    """An operator and two tenants, with a DATA_DIR of the test's own."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    return executor_config(auth_tokens=(OPERATOR,), tenant_tokens=TENANTS, data_dir=data, max_queued_evals=100)


def submit(api, token) -> str:
    reply = api.post("/evaluate", data=json.dumps(GOOD), content_type="application/json", **bearer(token))
    assert reply.status_code == 202, reply.content
    return reply.json()["eval_id"]


# -- event streams ---------------------------------------------------------------------------------


class Streams:
    """Event streams opened on a live service (gunicorn, two sync workers: the slots are shared by
    processes, as in production), each on its own connection, closed at the test's end."""

    def __init__(self, service):
        self.service, self.held = service, []

    def open(self, token: str, eval_id: str) -> httpx.Response:
        client = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"})
        reply = client.send(client.build_request("GET", self.service.url(f"/evaluate/{eval_id}/events")), stream=True)
        if reply.status_code == 200:
            self.held.append((client, reply))
        else:
            reply.read()
            client.close()
        return reply

    def close(self, index: int) -> None:
        client, reply = self.held.pop(index)
        reply.close()
        client.close()

    def close_all(self) -> None:
        while self.held:
            self.close(-1)


def refused(reply, names: str) -> None:
    assert reply.status_code == 503, reply.status_code
    assert reply.json()["error"] == "at_capacity" and names in reply.json()["detail"], reply.json()
    assert int(reply.headers["Retry-After"]) >= 1


@pytest.mark.slow
def test_a_named_token_at_its_quota_is_refused_while_others_still_open_streams(live_service):
    service = live_service(env={"AUTH_TOKEN": OPERATOR, "AUTH_TOKENS": f"alice:{ALICE},bob:{BOB}",
                                "MAX_EVENT_STREAMS": "8", "MAX_EVENT_STREAMS_PER_TOKEN": "3", "EVENT_KEEPALIVE_SECS": "1"})  # fmt: skip

    def submitted(token):
        headers = {"Authorization": f"Bearer {token}"}
        return request("POST", service.url("/evaluate"), json_body=GOOD, headers=headers).json()["eval_id"]

    alices, bobs = submitted(ALICE), submitted(BOB)  # pending for good: no worker runs here
    streams = Streams(service)
    try:
        assert [streams.open(ALICE, alices).status_code for _ in range(3)] == [200] * 3
        refused(streams.open(ALICE, alices), "3 event streams open (MAX_EVENT_STREAMS_PER_TOKEN)")
        assert streams.open(BOB, bobs).status_code == 200  # another tenant
        assert [streams.open(OPERATOR, alices).status_code for _ in range(4)] == [200] * 4  # the host's cap only
        refused(streams.open(OPERATOR, bobs), "8 event streams are open on this host (MAX_EVENT_STREAMS)")
        refused(streams.open(BOB, bobs), "(MAX_EVENT_STREAMS)")  # bob is under his quota; the host is not
        streams.close(-1)  # an operator's stream ends
        wait_for(lambda: _opened(streams, BOB, bobs), timeout=30, what="the closed stream's host slot to be free")
        refused(streams.open(ALICE, alices), "(MAX_EVENT_STREAMS_PER_TOKEN)")  # her own cap, whatever the host has
        streams.close(0)  # one of alice's
        streams.close(-1)  # and one more of the host's
        wait_for(lambda: _opened(streams, ALICE, alices), timeout=30, what="alice's closed stream's slot to be free")
    finally:
        streams.close_all()


def _opened(streams: Streams, token: str, eval_id: str) -> bool:
    """Whether a stream opens now (a closed one frees its slots at its next write: a keep-alive)."""
    reply = streams.open(token, eval_id)
    return reply.status_code == 200


def test_a_dead_process_frees_its_tenants_slot(tmp_path):
    """A web process killed while it streams frees its slots: the kernel drops its flocks."""
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys; from pathlib import Path; from evaluations.events import slots\n"
            f"slot = slots.take(Path({str(tmp_path)!r}), 8, tenant='alice', tenant_limit=1)\n"
            "print('held', flush=True); sys.stdin.read()\n"
        )],
        cwd=PROJECT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(slots.Full) as full:
            slots.take(tmp_path, 8, tenant="alice", tenant_limit=1)
        assert full.value.cap == slots.TENANT
        slots.take(tmp_path, 8, tenant="bob", tenant_limit=1).release()  # another tenant's
    finally:
        holder.kill()
        holder.wait()
    slots.take(tmp_path, 8, tenant="alice", tenant_limit=1).release()


# -- GET /images, per tenant -----------------------------------------------------------------------

DEBIAN, SECRET, PRIVATE, BUILT = ("sha256:" + c * 64 for c in "abcd")


@pytest.fixture
def images(executor_config, tmp_path, callers):
    """A store of four images: debian (also tagged under bob's private name), bob's private one, one
    built from alice's Dockerfile, and one nobody here ran."""
    store = ImageStore(tmp_path / "images")
    executor_config(images_dir=store.root)
    stamp = now_iso()
    for digest, refs in (
        (DEBIAN, ["docker.io/library/debian:13", "registry.example.com/bob/secret-name:v1"]),
        (PRIVATE, ["registry.example.com/bob/private:v2"]),
        (BUILT, []),
        (SECRET, ["docker.io/library/unused:1"]),
    ):
        store.save_image(ImageRecord(digest, [], {}, [], 1000, "pull", stamp, stamp), refs=refs)
    ran = [
        ("alice", {"kind": "image", "ref": "debian:13", "digest": DEBIAN, "cached": False}),
        ("alice", {"kind": "dockerfile", "ref": "environment/Dockerfile", "digest": BUILT, "cached": False}),
        ("alice", {"kind": "image", "ref": "never-pulled:1", "digest": None, "cached": False}),
        ("alice", {"kind": "host", "ref": None, "digest": None, "cached": True}),
        ("bob", {"kind": "image", "ref": "registry.example.com/bob/secret-name:v1", "digest": DEBIAN, "cached": True}),
        ("bob", {"kind": "image", "ref": "registry.example.com/bob/private:v2", "digest": PRIVATE, "cached": False}),
    ]
    for owner, environment in ran:
        Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x", owner=owner,
                                  environment=environment)  # fmt: skip
    return store


def listed(api, token) -> list[tuple]:
    reply = api.get("/images", **bearer(token))
    assert reply.status_code == 200, reply.content
    return sorted(((row["ref"] or ""), row["digest"]) for row in reply.json())


def test_a_tenant_lists_only_the_images_its_evaluations_ran_in(api, images):
    assert listed(api, ALICE) == [("", BUILT), ("docker.io/library/debian:13", DEBIAN)]
    assert listed(api, BOB) == [
        ("registry.example.com/bob/private:v2", PRIVATE),
        ("registry.example.com/bob/secret-name:v1", DEBIAN),
    ]
    everything = api.get("/images", **bearer(OPERATOR)).json()
    assert everything == images.listing() and len(everything) == 5


def test_an_image_run_only_under_anothers_name_shows_without_it(api, images):
    Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x", owner="carol",
                              environment={"kind": "image", "ref": "debian@" + DEBIAN, "digest": DEBIAN})  # fmt: skip
    Token.objects.create(name="carol", sha256=auth.token_sha256("carol-token"))
    assert listed(api, "carol-token") == [("", DEBIAN)]


# -- a token made in the admin turns auth on -------------------------------------------------------


def test_a_token_made_in_the_admin_alone_turns_auth_on(api, admin_client):
    assert api.get("/status").json()["auth"] == "disabled"
    before = submit(api, "anything")  # auth off: open to all, a header ignored
    assert api.get("/evaluations").status_code == 200
    carol = add_token(admin_client, "carol")
    assert api.get("/status").json()["auth"] == "enabled"
    for reply in (api.get("/evaluations"), api.get(f"/evaluate/{before}"), api.get("/images")):
        assert (reply.status_code, reply.json()["error"]) == (401, "unauthorized")
    post = api.post("/evaluate", data=json.dumps(GOOD), content_type="application/json")
    assert post.status_code == 401 and Evaluation.objects.count() == 1
    assert api.get("/evaluations", **bearer("a-guess")).status_code == 401
    mine = submit(api, carol)
    assert Evaluation.objects.get(id=mine).owner == "carol"
    assert [row["eval_id"] for row in api.get("/evaluations", **bearer(carol)).json()] == [mine]
    assert api.get(f"/evaluate/{before}", **bearer(carol)).status_code == 404  # no owner: not the tenant's
    page = admin_client.get("/admin/evaluations/token/").content.decode()
    assert "authentication is off" not in page
    Token.objects.all().delete()  # the last one revoked: open again, as configured
    assert api.get("/evaluations").status_code == 200
    assert api.get("/status").json()["auth"] == "disabled"
