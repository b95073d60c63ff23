"""Tenants (SPEC §20; issue 23, item 11): a tenant's token cannot see, list, cancel or retry another's work.

The hole: any valid token could list, read and cancel every other token's evaluations and
batches. Now tokens may be named (AUTH_TOKENS=name:token,...); every evaluation and batch
records its ``owner``; a tenant's token reaches only its own, and anything else answers 404
``not_found`` exactly as an id that does not exist (never 403: ids do not leak). Operators'
tokens (AUTH_TOKEN) see everything, as before. Two tenants and an operator, on every route.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid

import pytest

from evaluations import lifecycle
from evaluations.api import auth
from evaluations.models import Batch, ErrorKind, Evaluation, Status, Token
from evaluations.representation import evaluation_json
from tests.helpers.http import request

pytestmark = pytest.mark.django_db

OPERATOR = "operator-token"
ALICE, BOB = "alice-token-1", "bob:token-2"  # a token may hold a colon: the name ends at the first one
TENANTS = (("alice", ALICE), ("bob", BOB))
GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}
URLS = [f"https://example.com/task{i}.tar.gz" for i in range(2)]
BATCH = {"agent_code": "print('hi')", "task_urls": URLS}


@pytest.fixture
def tokens(executor_config, tmp_path):
    executor_config(
        auth_tokens=(OPERATOR,), tenant_tokens=TENANTS, workspace_base=tmp_path / "sessions", max_queued_evals=100
    )


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def submit(api, token, body=GOOD, **headers) -> str:
    reply = api.post("/evaluate", data=json.dumps(body), content_type="application/json", **bearer(token), **headers)
    assert reply.status_code == 202, reply.content
    return reply.json()["eval_id"]


def submit_batch(api, token, body=BATCH, **headers) -> dict:
    reply = api.post("/batches", data=json.dumps(body), content_type="application/json", **bearer(token), **headers)
    assert reply.status_code == 202, reply.content
    return reply.json()


def end(eval_id):
    assert lifecycle.record(eval_id, status=Status.RUNNING, expect=[Status.PENDING])
    assert lifecycle.finish(eval_id, Status.FAILED, error="cloning_repo: executor worker lost",
                            kind=ErrorKind.INFRASTRUCTURE)  # fmt: skip


def assert_not_found(reply, missing_reply, own_id: str, missing_id: str) -> None:
    """404 not_found, word for word what an id that does not exist gets."""
    assert reply.status_code == 404, reply.content
    assert reply.json() == json.loads(missing_reply.content.decode().replace(missing_id, own_id))
    assert reply.json()["error"] == "not_found"


# -- who owns what ---------------------------------------------------------------------------


def test_each_evaluation_and_batch_records_the_tenant_that_created_it(api, tokens):
    mine, theirs, operators = submit(api, ALICE), submit(api, BOB), submit(api, OPERATOR)
    batch = submit_batch(api, ALICE)
    owners = dict(Evaluation.objects.filter(batch=None).values_list("id", "owner"))
    assert {str(k): v for k, v in owners.items()} == {mine: "alice", theirs: "bob", operators: None}
    assert Batch.objects.get(id=batch["batch_id"]).owner == "alice"
    assert set(Evaluation.objects.filter(batch_id=batch["batch_id"]).values_list("owner", flat=True)) == {"alice"}
    assert api.get(f"/evaluate/{mine}", **bearer(ALICE)).json()["owner"] == "alice"
    assert api.get(f"/evaluate/{operators}", **bearer(OPERATOR)).json()["owner"] is None
    assert api.get(f"/batches/{batch['batch_id']}", **bearer(ALICE)).json()["owner"] == "alice"
    assert evaluation_json(Evaluation.objects.get(id=mine))["owner"] == "alice"  # the callback's body


# -- every evaluation route, both ways ----------------------------------------------------------


def _route(api, method, eval_id, token):
    path = {"read": f"/evaluate/{eval_id}", "logs": f"/evaluate/{eval_id}/logs",
            "cancel": f"/evaluate/{eval_id}", "retry": f"/evaluate/{eval_id}/retry"}[method]  # fmt: skip
    call = {"read": api.get, "logs": api.get, "cancel": api.delete, "retry": api.post}[method]
    return call(path, **bearer(token))


@pytest.mark.parametrize("method", ["read", "logs", "cancel", "retry"])
def test_a_tenant_gets_not_found_for_another_tenants_evaluation_and_changes_nothing(api, tokens, method):
    eval_id = submit(api, ALICE)
    if method == "retry":
        end(eval_id)
    before = Evaluation.objects.values("id", "status", "cancel_requested", "cancel_reason").get(id=eval_id)
    missing = str(uuid.uuid4())
    assert_not_found(_route(api, method, eval_id, BOB), _route(api, method, missing, BOB), eval_id, missing)
    assert Evaluation.objects.values("id", "status", "cancel_requested", "cancel_reason").get(id=eval_id) == before
    assert Evaluation.objects.count() == 1  # bob's retry made nothing


@pytest.mark.parametrize("token", [ALICE, OPERATOR])
@pytest.mark.parametrize("method", ["read", "logs", "cancel", "retry"])
def test_the_owner_and_an_operator_reach_the_evaluation(api, tokens, method, token):
    eval_id = submit(api, ALICE)
    if method == "retry":
        end(eval_id)
    reply = _route(api, method, eval_id, token)
    assert reply.status_code == {"read": 200, "logs": 200, "cancel": 202, "retry": 202}[method], reply.content
    if method == "cancel":
        assert Evaluation.objects.get(id=eval_id).status == Status.CANCELLED


def test_a_tenant_cannot_cancel_or_read_another_tenants_batch_evaluations(api, tokens):
    batch = submit_batch(api, ALICE)
    for eval_id in batch["eval_ids"]:
        assert api.get(f"/evaluate/{eval_id}", **bearer(BOB)).status_code == 404
        assert api.delete(f"/evaluate/{eval_id}", **bearer(BOB)).status_code == 404
        assert api.get(f"/evaluate/{eval_id}", **bearer(ALICE)).status_code == 200
    assert set(Evaluation.objects.values_list("status", flat=True)) == {Status.PENDING}


# -- retry: the new evaluation is the original's owner's, whoever asks ------------------------------------------------


def test_a_retry_belongs_to_the_originals_owner(api, tokens):
    eval_id = submit(api, ALICE)
    end(eval_id)
    by_alice = api.post(f"/evaluate/{eval_id}/retry", **bearer(ALICE)).json()["eval_id"]
    by_operator = api.post(f"/evaluate/{eval_id}/retry", **bearer(OPERATOR)).json()["eval_id"]
    assert Evaluation.objects.get(id=by_alice).owner == "alice"
    assert Evaluation.objects.get(id=by_operator).owner == "alice"  # its callback is alice's
    assert api.get(f"/evaluate/{by_alice}", **bearer(ALICE)).status_code == 200
    assert api.get(f"/evaluate/{by_alice}", **bearer(BOB)).status_code == 404
    assert api.get(f"/evaluate/{by_operator}", **bearer(ALICE)).status_code == 200


# -- lists and their filters ------------------------------------------------------------------


def listed(api, path, token, key="eval_id", **query) -> list[str]:
    reply = api.get(path, query, **bearer(token))
    assert reply.status_code == 200, reply.content
    return [row[key] for row in reply.json()]


def test_get_evaluations_lists_only_the_callers_own_with_every_filter(api, tokens):
    alice = [submit(api, ALICE) for _ in range(3)]
    bob = [submit(api, BOB) for _ in range(2)]
    operator = submit(api, OPERATOR)
    end(alice[0])
    end(bob[0])
    assert listed(api, "/evaluations", ALICE) == alice[::-1]
    assert listed(api, "/evaluations", BOB) == bob[::-1]
    assert set(listed(api, "/evaluations", OPERATOR)) == {*alice, *bob, operator}
    assert listed(api, "/evaluations", ALICE, status="failed") == [alice[0]]
    assert listed(api, "/evaluations", BOB, status="pending") == [bob[1]]
    assert {row["owner"] for row in api.get("/evaluations", **bearer(ALICE)).json()} == {"alice"}
    # Paging stays within one's own, and another's id is no anchor: as one that does not exist.
    page = api.get("/evaluations", {"limit": 2}, **bearer(ALICE))
    assert [r["eval_id"] for r in page.json()] == alice[:0:-1] and f"before={alice[1]}" in page["Link"]
    assert listed(api, "/evaluations", ALICE, limit=2, before=alice[1]) == [alice[0]]
    foreign = api.get("/evaluations", {"before": bob[0]}, **bearer(ALICE))
    missing = api.get("/evaluations", {"before": str(uuid.uuid4())}, **bearer(ALICE))
    assert foreign.status_code == 400 and foreign.json() == missing.json()


def test_get_batches_lists_only_the_callers_own_with_every_filter(api, tokens):
    alice = [submit_batch(api, ALICE)["batch_id"] for _ in range(2)]
    bob = submit_batch(api, BOB)["batch_id"]
    operator = submit_batch(api, OPERATOR)["batch_id"]
    assert api.delete(f"/batches/{alice[0]}", **bearer(ALICE)).status_code == 202
    assert listed(api, "/batches", ALICE, key="batch_id") == alice[::-1]
    assert listed(api, "/batches", BOB, key="batch_id") == [bob]
    assert set(listed(api, "/batches", OPERATOR, key="batch_id")) == {*alice, bob, operator}
    assert listed(api, "/batches", ALICE, key="batch_id", status="cancelled") == [alice[0]]
    assert listed(api, "/batches", BOB, key="batch_id", status="cancelled") == []
    assert listed(api, "/batches", ALICE, key="batch_id", status="pending") == [alice[1]]
    assert {row["owner"] for row in api.get("/batches", **bearer(ALICE)).json()} == {"alice"}
    foreign = api.get("/batches", {"before": bob}, **bearer(ALICE))
    missing = api.get("/batches", {"before": str(uuid.uuid4())}, **bearer(ALICE))
    assert foreign.status_code == 400 and foreign.json() == missing.json()


# -- batches: read and cancel, both ways ------------------------------------------------------


@pytest.mark.parametrize("method", ["get", "delete"])
def test_a_tenant_gets_not_found_for_another_tenants_batch_and_cancels_nothing(api, tokens, method):
    batch_id = submit_batch(api, ALICE)["batch_id"]
    missing = str(uuid.uuid4())
    call = getattr(api, method)
    reply = call(f"/batches/{batch_id}", **bearer(BOB))
    assert_not_found(reply, call(f"/batches/{missing}", **bearer(BOB)), batch_id, missing)
    assert not Batch.objects.get(id=batch_id).cancel_requested
    assert set(Evaluation.objects.values_list("status", flat=True)) == {Status.PENDING}


@pytest.mark.parametrize("token", [ALICE, OPERATOR])
def test_the_owner_and_an_operator_read_and_cancel_the_batch(api, tokens, token):
    batch = submit_batch(api, ALICE)
    body = api.get(f"/batches/{batch['batch_id']}", **bearer(token)).json()
    assert [e["eval_id"] for e in body["evaluations"]] == batch["eval_ids"]
    assert api.delete(f"/batches/{batch['batch_id']}", **bearer(token)).status_code == 202
    assert set(Evaluation.objects.values_list("status", flat=True)) == {Status.CANCELLED}


# -- idempotency keys are per owner -------------------------------------------------------------


def test_two_tenants_with_one_idempotency_key_never_meet(api, tokens):
    key = {"HTTP_IDEMPOTENCY_KEY": "job-1"}
    alice = submit(api, ALICE, **key)
    bob = submit(api, BOB, **key)  # the same body and key: not alice's evaluation
    assert bob != alice and Evaluation.objects.get(id=bob).owner == "bob"
    # Another body under the same key is no conflict for bob: a 409 would tell him alice used it.
    other = submit(api, BOB, {**GOOD, "agent_code": "print(2)"}, HTTP_IDEMPOTENCY_KEY="job-2")
    again = submit(api, ALICE, {**GOOD, "agent_code": "print(2)"}, HTTP_IDEMPOTENCY_KEY="job-2")
    assert other != again
    assert submit(api, ALICE, **key) == alice and submit(api, BOB, **key) == bob  # each replays its own
    assert submit(api, OPERATOR, **key) not in (alice, bob)
    conflict = api.post("/evaluate", data=json.dumps({**GOOD, "agent_code": "x"}), content_type="application/json",
                        **bearer(ALICE), **key)  # fmt: skip
    assert conflict.status_code == 409  # within one owner the rule is as before


def test_two_tenants_with_one_batch_idempotency_key_never_meet(api, tokens):
    key = {"HTTP_IDEMPOTENCY_KEY": "batch-1"}
    alice, bob = submit_batch(api, ALICE, **key), submit_batch(api, BOB, **key)
    assert alice["batch_id"] != bob["batch_id"] and not set(alice["eval_ids"]) & set(bob["eval_ids"])
    assert submit_batch(api, BOB, **key) == bob and submit_batch(api, ALICE, **key) == alice


# -- the token itself ---------------------------------------------------------------------------


def test_every_token_is_compared_whichever_matches(monkeypatch):
    """Constant time: each of the operators' and tenants' tokens is compared, none skipped."""
    compared = []
    real = auth.hmac.compare_digest

    def counting(a, b):
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for candidate, owner in ((OPERATOR, None), (ALICE, "alice"), (BOB, "bob")):
        compared.clear()
        caller = auth.identify(candidate, (OPERATOR,), TENANTS)
        assert caller.owner == owner and sorted(compared) == sorted(t.encode() for t in (OPERATOR, ALICE, BOB))
    assert auth.identify("alice", (OPERATOR,), TENANTS) is None  # a name is not a token


def test_an_unknown_token_is_still_refused(api, tokens):
    reply = api.get("/evaluations", **bearer("alice"))
    assert (reply.status_code, reply.json()["error"]) == (401, "unauthorized")


def test_named_tokens_alone_turn_auth_on(api, executor_config):
    executor_config(tenant_tokens=TENANTS)
    assert api.get("/status").json()["auth"] == "enabled"
    assert api.get("/evaluations").status_code == 401
    assert api.get("/evaluations", **bearer(OPERATOR)).status_code == 401
    assert api.get("/evaluations", **bearer(ALICE)).status_code == 200


# -- single-token setups are unchanged ---------------------------------------------------------


def test_without_named_tokens_every_token_sees_everything_and_owns_nothing(api, executor_config):
    executor_config(auth_tokens=("t1", "t2"))
    first = submit(api, "t1")
    assert api.get(f"/evaluate/{first}", **bearer("t2")).json()["owner"] is None
    assert listed(api, "/evaluations", "t2") == [first]
    assert api.delete(f"/evaluate/{first}", **bearer("t2")).status_code == 202


def test_without_auth_rows_have_no_owner_and_all_are_seen(api):
    eval_id = submit(api, "ignored")
    batch = submit_batch(api, "ignored")
    assert Evaluation.objects.get(id=eval_id).owner is None and Batch.objects.get(id=batch["batch_id"]).owner is None
    assert set(listed(api, "/evaluations", "ignored")) == {eval_id, *batch["eval_ids"]}


# -- the admin filters by owner -------------------------------------------------------------------


def test_the_admin_lists_and_filters_by_owner(api, tokens, admin_client):
    alice, bob, operator = submit(api, ALICE), submit(api, BOB), submit(api, OPERATOR)
    alice_batch, bob_batch = submit_batch(api, ALICE)["batch_id"], submit_batch(api, BOB)["batch_id"]
    page = admin_client.get("/admin/evaluations/evaluation/", {"owner": "alice"})
    html = page.content.decode()
    assert page.status_code == 200 and alice in html and bob not in html and operator not in html
    html = admin_client.get("/admin/evaluations/evaluation/", {"owner": "(operator)"}).content.decode()
    assert operator in html and alice not in html and bob not in html
    html = admin_client.get("/admin/evaluations/batch/", {"owner": "bob"}).content.decode()
    assert bob_batch in html and alice_batch not in html
    assert ">alice</a>" in admin_client.get("/admin/evaluations/evaluation/").content.decode()  # the filter's choice


def test_an_admin_rerun_stays_the_owners(api, tokens, admin_client):
    """The re-run sends its result to the owner's callback_url: the owner's token must read it."""
    eval_id = submit(api, ALICE, {**GOOD, "callback_url": "https://alice.example.com/hook"})
    end(eval_id)
    admin_client.post(
        "/admin/evaluations/evaluation/", {"action": "rerun_evaluations", "_selected_action": [eval_id]}, follow=True
    )
    new = Evaluation.objects.get(retry_of_id=eval_id)
    assert (new.owner, new.callback_url) == ("alice", "https://alice.example.com/hook")
    assert api.get(f"/evaluate/{new.id}", **bearer(ALICE)).status_code == 200
    assert api.get(f"/evaluate/{new.id}", **bearer(BOB)).status_code == 404


# -- tokens made in the admin -------------------------------------------------------------------


def add_token(admin_client, name: str) -> str:
    """The token the admin's add page shows once."""
    page = admin_client.post("/admin/evaluations/token/add/", {"name": name})
    assert page.status_code == 200, page.content[:500]
    assert "no-store" in page["Cache-Control"]
    found = re.search(r'<code id="new-token">([^<]+)</code>', page.content.decode())
    assert found, page.content[:2000]
    return found.group(1)


def test_a_token_made_in_the_admin_is_a_tenant_and_only_its_sha256_is_kept(api, tokens, admin_client):
    carol = add_token(admin_client, "carol")
    row = Token.objects.get(name="carol")
    assert row.sha256 == hashlib.sha256(carol.encode()).hexdigest() and len(carol) >= 43
    stored = json.dumps(list(Token.objects.values()), default=str)
    for page in ("/admin/evaluations/token/", f"/admin/evaluations/token/{row.id}/change/"):
        shown = admin_client.get(page)
        assert shown.status_code == 200 and row.sha256[:12] in shown.content.decode()
        assert carol not in shown.content.decode()
    assert carol not in stored
    mine = submit(api, carol)
    alices = submit(api, ALICE)
    assert Evaluation.objects.get(id=mine).owner == "carol"
    assert listed(api, "/evaluations", carol) == [mine]
    assert api.get(f"/evaluate/{alices}", **bearer(carol)).status_code == 404
    assert api.get(f"/evaluate/{mine}", **bearer(ALICE)).status_code == 404
    assert api.get(f"/evaluate/{mine}", **bearer(OPERATOR)).status_code == 200
    admin_client.post(f"/admin/evaluations/token/{row.id}/delete/", {"post": "yes"})
    assert not Token.objects.exists()
    assert api.get("/evaluations", **bearer(carol)).status_code == 401  # revoked at the next request


def test_a_second_token_of_a_configured_tenant_rotates_it(api, tokens, admin_client):
    new_alice = add_token(admin_client, "alice")
    old = submit(api, ALICE)
    assert listed(api, "/evaluations", new_alice) == [old]
    assert submit(api, ALICE, HTTP_IDEMPOTENCY_KEY="k") == submit(api, new_alice, HTTP_IDEMPOTENCY_KEY="k")


@pytest.mark.parametrize("name", ["", "al ice", "a/b", "n" * 65])
def test_the_admin_refuses_a_bad_tenant_name(tokens, admin_client, name):
    page = admin_client.post("/admin/evaluations/token/add/", {"name": name})
    assert page.status_code == 200 and b"errorlist" in page.content and b"new-token" not in page.content
    assert not Token.objects.exists()


def test_the_token_list_warns_when_auth_is_off(admin_client):
    page = admin_client.get("/admin/evaluations/token/").content.decode()
    assert "there is no token here: authentication is off" in page


# -- through the real service ---------------------------------------------------------------------


@pytest.mark.slow
def test_tenants_through_the_live_service(live_service):
    """AUTH_TOKENS as the operator writes it, read at start by gunicorn's workers."""
    service = live_service(env={"AUTH_TOKEN": OPERATOR, "AUTH_TOKENS": f"alice:{ALICE}, bob:{BOB}"})

    def call(method, path, token, body=None):
        return request(method, service.url(path), json_body=body, headers={"Authorization": f"Bearer {token}"})

    eval_id = call("POST", "/evaluate", ALICE, GOOD).json()["eval_id"]
    assert call("GET", f"/evaluate/{eval_id}", ALICE).json()["owner"] == "alice"
    assert call("GET", f"/evaluate/{eval_id}", BOB).status == 404
    assert call("DELETE", f"/evaluate/{eval_id}", BOB).status == 404
    assert call("GET", "/evaluations", BOB).json() == []
    assert [row["eval_id"] for row in call("GET", "/evaluations", OPERATOR).json()] == [eval_id]
    assert call("DELETE", f"/evaluate/{eval_id}", ALICE).status == 202
