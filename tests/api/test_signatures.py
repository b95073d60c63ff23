"""Signed results (SPEC §18), in process: the keyring, what finish and settle sign and store,
verify_result, GET /public-key, rotation, SIGNING_KEY_FILE, the canonical JSON, callbacks."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import stat
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evaluations import VERSION, lifecycle, signing
from evaluations.models import Evaluation, Status, TestResult
from evaluations.worker import callbacks
from evaluations.worker.startup import StartupError, check_signing_key
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.service import PROJECT
from tests.helpers.signatures import tampered

pytestmark = pytest.mark.django_db

# SPEC §18's least list, and what we add to it.
SPEC_EVALUATION_FIELDS = {
    "eval_id", "task_url", "task_sha256", "agent_sha256", "status", "passed", "reward", "error_kind",
    "test_results", "agent_patch_sha256", "environment", "created_at", "finished_at", "executor_version",
}  # fmt: skip


@pytest.fixture
def data_dir(tmp_path, executor_config):
    """A DATA_DIR of this test's own: its keyring starts empty."""
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    executor_config(data_dir=folder)
    return folder


def ended(**fields) -> Evaluation:
    """A running evaluation with two test results, ended failed by lifecycle.finish."""
    evaluation = Evaluation.objects.create(
        task_url="https://example.com/t.tar.gz",
        agent_code="print('hi')",
        agent_sha256="ab" * 32,
        status=Status.RUNNING,
        task_sha256="cd" * 32,
        agent_patch="diff --git a/x b/x\n+é\n",
        environment={"kind": "image", "ref": "debian:13", "digest": "sha256:" + "e" * 64, "cached": True},
    )
    TestResult.objects.create(evaluation=evaluation, name="fail_to_pass_a", kind="fail_to_pass", passed=True,
                              exit_code=0, position=0, output="ok ✓\u2028")  # fmt: skip
    TestResult.objects.create(evaluation=evaluation, name="pass_to_pass_b", kind="pass_to_pass", passed=False,
                              exit_code=1, position=1, output="no")  # fmt: skip
    assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: 1 of 2 tests failed", **fields)
    return evaluation


def saved(tmp_path, document, name="result.json"):
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def verify_result(*args) -> tuple[int, str]:
    """manage.py verify_result in process: (exit status, what it said)."""
    out = []
    try:
        call_command("verify_result", *args, stdout=_Lines(out))
    except CommandError as exc:
        return exc.returncode, str(exc)
    return 0, "".join(out)


class _Lines:
    def __init__(self, into):
        self.into = into

    def write(self, text):
        self.into.append(text)

    def flush(self):
        pass


# -- the key ----------------------------------------------------------------------------------


def test_the_first_signature_makes_a_key_0600_and_public_key_lists_it(api, data_dir):
    evaluation = ended()
    private = data_dir / "signing" / "current.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE((data_dir / "signing").stat().st_mode) == 0o700
    key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    reply = api.get("/public-key")  # public: no token
    assert reply.status_code == 200
    (listed,) = reply.json()["keys"]
    assert set(listed) == {"key_id", "alg", "public_key_pem", "created_at"}
    assert listed["key_id"] == hashlib.sha256(raw).hexdigest()[:16] and listed["alg"] == "ed25519"
    assert (
        signing.load_public_key(listed["public_key_pem"].encode()).public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        == raw
    )
    document = api.get(f"/evaluate/{evaluation.id}").json()
    assert document["signature"]["key_id"] == listed["key_id"]


def test_public_key_is_open_with_auth_enabled(api, data_dir, executor_config):
    executor_config(auth_tokens=("secret",))
    assert api.get("/public-key").status_code == 200
    assert api.get("/evaluations").status_code == 401


def test_two_processes_making_the_key_at_once_end_with_one(tmp_path):
    """Eight processes, each ready (imported) and then released together, make the keyring's first key."""
    for round_ in range(3):
        folder = tmp_path / f"ring{round_}"
        script = (
            "import sys; from pathlib import Path; from evaluations.signing import Keyring\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            f"print(Keyring(Path({str(folder)!r})).current()[1])\n"
        )
        makers = [
            subprocess.Popen(
                [sys.executable, "-c", script], cwd=PROJECT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )  # fmt: skip
            for _ in range(8)
        ]
        assert all(maker.stdout.readline() == "ready\n" for maker in makers)
        for maker in makers:
            maker.stdin.write("go\n")
            maker.stdin.flush()
        ids = {maker.communicate(timeout=60)[0].strip() for maker in makers}
        assert all(maker.returncode == 0 for maker in makers)
        assert len(ids) == 1, ids
        assert [p.name for p in (folder / "public").iterdir()] == [f"{ids.pop()}.json"]
        assert not [p for p in folder.iterdir() if p.name.startswith(".tmp")]


def test_rotation_keeps_the_old_key_listed_second_and_old_results_verify(api, data_dir, tmp_path):
    before = api.get(f"/evaluate/{ended().id}").json()
    old_id = before["signature"]["key_id"]
    rotated = subprocess.run(  # another process: this one notices without a restart
        [sys.executable, "manage.py", "signing_key", "rotate"],
        cwd=PROJECT,
        env={**os.environ, "DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
    )
    assert rotated.returncode == 0, rotated.stderr
    after = api.get(f"/evaluate/{ended().id}").json()
    new_id = after["signature"]["key_id"]
    assert new_id != old_id and new_id in rotated.stdout
    assert [k["key_id"] for k in api.get("/public-key").json()["keys"]] == [new_id, old_id]
    assert verify_result(saved(tmp_path, before, "before.json"))[0] == 0
    assert verify_result(saved(tmp_path, after, "after.json"))[0] == 0
    # The old private key is gone; the new one is 0600.
    private = data_dir / "signing" / "current.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert signing.key_id(serialization.load_pem_private_key(private.read_bytes(), None).public_key()) == new_id
    assert [p.name for p in (data_dir / "signing").iterdir() if p.suffix == ".pem"] == ["current.pem"]
    listing = []
    call_command("signing_key", "list", stdout=_Lines(listing))
    lines = "".join(listing).splitlines()
    assert lines[0].startswith(new_id) and lines[0].endswith("current") and lines[1].startswith(old_id)


def operator_key(tmp_path):
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "operator.pem"
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path, signing.key_id(key.public_key())


def test_signing_key_file_signs_and_rotate_refuses(api, data_dir, tmp_path, executor_config):
    path, expected = operator_key(tmp_path)
    config = executor_config(signing_key_file=path)
    check_signing_key(config)
    document = api.get(f"/evaluate/{ended().id}").json()
    assert document["signature"]["key_id"] == expected
    assert [k["key_id"] for k in api.get("/public-key").json()["keys"]] == [expected]
    assert not (data_dir / "signing" / "current.pem").exists()  # no key of ours beside the operator's
    with pytest.raises(CommandError, match="SIGNING_KEY_FILE is set .*replacing that file"):
        call_command("signing_key", "rotate")
    # The operator replaces the file: the new key signs, the old one's public half stays listed.
    replaced, newer = operator_key(tmp_path / "..")
    os.replace(replaced, path)
    assert api.get(f"/evaluate/{ended().id}").json()["signature"]["key_id"] == newer
    assert [k["key_id"] for k in api.get("/public-key").json()["keys"]] == [newer, expected]
    assert verify_result(saved(tmp_path, document))[0] == 0


def bad_key_files(tmp_path):
    ec_key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "ec.pem").write_bytes(ec_key)
    (tmp_path / "junk.pem").write_text("not a key\n")
    (tmp_path / "folder.pem").mkdir()
    return {
        "missing": (tmp_path / "none.pem", "does not exist"),
        "not Ed25519": (tmp_path / "ec.pem", "not an Ed25519 private key"),
        "not PEM": (tmp_path / "junk.pem", "not an unencrypted PEM private key"),
        "unreadable": (tmp_path / "folder.pem", "cannot be read"),
    }


@pytest.mark.parametrize("case", ["missing", "not Ed25519", "not PEM", "unreadable"])
def test_a_bad_signing_key_file_stops_start_up_naming_it(tmp_path, data_dir, executor_config, case):
    path, words = bad_key_files(tmp_path)[case]
    with pytest.raises(StartupError, match=f"^SIGNING_KEY_FILE: {path}: .*{words}"):
        check_signing_key(executor_config(signing_key_file=path))


def test_run_worker_refuses_a_bad_signing_key_file_with_one_line(tmp_path, workspace_base):
    path, _words = bad_key_files(tmp_path)["not Ed25519"]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST_"))}
    env.update(DATA_DIR=str(tmp_path / "data"), SIGNING_KEY_FILE=str(path), SANDBOX="none",
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", WORKSPACE_BASE=str(workspace_base))  # fmt: skip
    run = subprocess.run([sys.executable, "manage.py", "run_worker"], cwd=PROJECT, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert re.fullmatch(
        f"term-executor: configuration error: SIGNING_KEY_FILE: {re.escape(str(path))}: is an? \\w+, "
        "not an Ed25519 private key",
        line,
    ), line


# -- what is signed ---------------------------------------------------------------------------


def test_an_ended_evaluation_is_signed_once_and_stored(api, data_dir, tmp_path):
    evaluation = ended()
    evaluation.refresh_from_db()
    assert evaluation.executor_version == VERSION and evaluation.signature
    document = api.get(f"/evaluate/{evaluation.id}").json()
    assert document["signature"] == evaluation.signature  # the stored one, as GET shows it
    assert SPEC_EVALUATION_FIELDS <= set(document["signature"]["fields"])
    assert set(document["signature"]["fields"]) == set(signing.EVALUATION_FIELDS)
    assert document["executor_version"] == VERSION and document["task_sha256"] == "cd" * 32
    assert document["agent_patch_sha256"] == hashlib.sha256("diff --git a/x b/x\n+é\n".encode()).hexdigest()
    code, said = verify_result(saved(tmp_path, document))
    assert code == 0 and said.startswith(f"valid: signed by key {document['signature']['key_id']}")


@pytest.mark.parametrize("patch", ["", "diff --git a/x b/x\n+\u00e9\u241e\U0001f600\u2028\n" * 5000])
def test_the_seal_reads_only_what_it_signs_and_signs_as_the_whole_object_does(api, data_dir, patch):
    """Issue 38: finish's seal reads none of the large text columns (the patch only through its digest,
    computed by the database), and its signature is the one the whole object gets when read."""
    evaluation = Evaluation.objects.create(
        task_url="https://example.com/t.tar.gz", agent_code="x", status=Status.RUNNING, agent_sha256="ab" * 32,
        agent_output="o\u241e" * 20000, agent_patch=patch, test_output="t" * 20000, log="l\u241e" * 20000,
        task_prompt="p" * 20000, environment={"kind": "host", "ref": None, "digest": None, "cached": False},
    )  # fmt: skip
    TestResult.objects.create(evaluation=evaluation, name="fail_to_pass_a", kind="fail_to_pass", passed=False,
                              exit_code=1, position=0, output="out \u2028\u00e9")  # fmt: skip
    staged = {
        "rewards": {"reward": 0.5, "tiny": 1e-7},
        "system_changes": {"count": 1, "paths": ["/etc/\u00e9"], "suspicious": False},
        "artifacts": [{"path": "a.txt", "size_bytes": 3, "sha256": "f" * 64}],
        "limits_applied": {"cpus": 1.5, "network": False},
    }
    with CaptureQueriesContext(connection) as queries:
        assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: 1 of 1 tests failed",
                                kind="tests_failed", reward=0.5, **staged)  # fmt: skip
    seal_read = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT") and "patch_sha256" in q["sql"]
    ]
    assert len(seal_read) == 1
    for column in ("agent_output", "test_output", "log", "task_prompt", "agent_code", "metadata"):
        assert f'"evaluations_evaluation"."{column}"' not in seal_read[0]
    assert seal_read[0].count('"evaluations_evaluation"."agent_patch"') == 1  # inside the digest alone
    stored = Evaluation.objects.get(id=evaluation.id).signature
    Evaluation.objects.filter(id=evaluation.id).update(signature=None)
    whole = api.get(f"/evaluate/{evaluation.id}").json()  # signed when read, from the whole object
    assert whole["signature"] == stored
    assert whole["agent_patch_sha256"] == (hashlib.sha256(patch.encode()).hexdigest() if patch else None)


def test_unfinished_objects_have_a_null_signature(api, data_dir):
    pending = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    body = api.get(f"/evaluate/{pending.id}").json()
    assert (body["signature"], body["executor_version"], body["agent_patch_sha256"]) == (None, None, None)
    batch = api.post("/batches", data=json.dumps(BATCH), content_type="application/json").json()
    assert api.get(f"/batches/{batch['batch_id']}").json()["signature"] is None


def test_a_pending_evaluation_cancelled_by_delete_is_signed(api, data_dir, tmp_path):
    pending = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    assert api.delete(f"/evaluate/{pending.id}").status_code == 202
    document = api.get(f"/evaluate/{pending.id}").json()
    assert document["status"] == "cancelled" and document["signature"]["alg"] == "ed25519"
    assert Evaluation.objects.get(id=pending.id).signature == document["signature"]
    assert verify_result(saved(tmp_path, document))[0] == 0


@pytest.mark.parametrize("field", signing.EVALUATION_FIELDS)
def test_a_changed_byte_in_any_signed_evaluation_field_fails(api, data_dir, tmp_path, field):
    document = api.get(f"/evaluate/{ended(reward=0.5).id}").json()
    public = signing.load_public_key(api.get("/public-key").json()["keys"][0]["public_key_pem"].encode())
    assert signing.verify(document, public).valid
    changed = tampered(document, field)
    assert not signing.verify(changed, public).valid
    code, said = verify_result(saved(tmp_path, changed))
    assert code == 1 and f"key {document['signature']['key_id']}" in said and "eval_id, task_url" in said
    removed = {k: v for k, v in document.items() if k != field}
    assert verify_result(saved(tmp_path, removed, "removed.json"))[0] == 1


def test_a_row_changed_after_its_end_no_longer_verifies(api, data_dir, tmp_path):
    """Tamper-evident at rest: the stored signature is over the row as it ended."""
    evaluation = ended()
    Evaluation.objects.filter(id=evaluation.id).update(passed=True, status=Status.COMPLETED)
    document = api.get(f"/evaluate/{evaluation.id}").json()
    assert document["passed"] is True
    assert verify_result(saved(tmp_path, document))[0] == 1


def test_an_ended_row_without_a_signature_is_signed_when_read_and_not_stored(api, data_dir, tmp_path):
    evaluation = ended()
    Evaluation.objects.filter(id=evaluation.id).update(signature=None, executor_version="")  # ended before 0017
    first = api.get(f"/evaluate/{evaluation.id}").json()
    assert first["signature"] and first["executor_version"] is None
    assert api.get(f"/evaluate/{evaluation.id}").json()["signature"] == first["signature"]  # deterministic
    assert Evaluation.objects.get(id=evaluation.id).signature is None
    assert verify_result(saved(tmp_path, first))[0] == 0


def test_the_cli_and_the_api_show_the_same_signed_object(data_dir, tmp_path):
    """representation.evaluation_json (callbacks, the CLI) and the API's fast read (db/rows.py) agree."""
    from evaluations.api.views import evaluation_body
    from evaluations.representation import evaluation_json

    evaluation = ended()

    class Operator:
        @staticmethod
        def may_see(owner):
            return True

    fast = evaluation_body(str(evaluation.id), Operator())
    slow = evaluation_json(Evaluation.objects.prefetch_related("transitions", "test_results").get(id=evaluation.id))
    assert json.dumps(fast, sort_keys=True) == json.dumps(slow, sort_keys=True)


# -- verify_result ----------------------------------------------------------------------------


def test_verify_result_with_a_public_key_file_and_from_stdin(api, data_dir, tmp_path, monkeypatch):
    document = api.get(f"/evaluate/{ended().id}").json()
    pem = tmp_path / "key.pem"
    pem.write_text(api.get("/public-key").json()["keys"][0]["public_key_pem"])
    assert verify_result(saved(tmp_path, document), "--public-key", str(pem))[0] == 0
    other = tmp_path / "other.pem"
    other.write_bytes(signing.public_pem(Ed25519PrivateKey.generate().public_key()).encode())
    code, said = verify_result(saved(tmp_path, document), "--public-key", str(other))
    assert code == 1 and "was signed with key" in said
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(document)))
    assert verify_result("-")[0] == 0


def test_verify_result_says_2_for_what_is_not_a_signed_document(api, data_dir, tmp_path):
    pending = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
    unsigned = api.get(f"/evaluate/{pending.id}").json()
    (tmp_path / "bad.json").write_text("{not json")
    assert verify_result(str(tmp_path / "missing.json"))[0] == 2
    assert verify_result(str(tmp_path / "bad.json"))[0] == 2
    code, said = verify_result(saved(tmp_path, unsigned))
    assert code == 2 and "signature is null" in said
    assert verify_result(saved(tmp_path, [1, 2], "list.json"))[0] == 2
    document = api.get(f"/evaluate/{ended().id}").json()
    unknown = {**document, "signature": {**document["signature"], "key_id": "0" * 16}}
    code, said = verify_result(saved(tmp_path, unknown))
    assert code == 1 and "not one of this service's keys" in said


# -- the canonical JSON -----------------------------------------------------------------------


def test_the_canonical_json_is_rfc_8785():
    """Numbers as ECMAScript prints them, keys by UTF-16 code units (😀, U+1F600, is D83D DE00: before
    U+FB01, unlike by code points), text as UTF-8 unescaped (U+2028 too)."""
    document = {
        "reward": 1.0,
        "half": 0.5,
        "big": 1e21,
        "text": "é ✓ \u2028 😀",
        "\ufb01": 3,
        "😀": 2,
        "€": 1,
        "a": None,
    }
    fields = list(document)
    assert signing.canonical(document, fields) == (
        '{"a":null,"big":1e+21,"half":0.5,"reward":1,"text":"é ✓ \u2028 😀","€":1,"😀":2,"\ufb01":3}'.encode()
    )
    assert signing.canonical(document, fields[:2]) == b'{"half":0.5,"reward":1}'  # only the fields listed


def test_a_reward_of_one_read_back_as_an_integer_still_verifies(api, data_dir):
    """A platform's JSON parser may read 1.0 as 1: both are 1 in the canonical form."""
    document = api.get(f"/evaluate/{ended(reward=1.0).id}").json()
    public = signing.load_public_key(api.get("/public-key").json()["keys"][0]["public_key_pem"].encode())
    assert document["reward"] == 1.0
    assert signing.verify({**document, "reward": 1}, public).valid
    assert signing.verify(json.loads(json.dumps(document, ensure_ascii=True)), public).valid  # \\u escapes too
    value = base64.b64decode(document["signature"]["value"])
    assert len(value) == 64


# -- batches ----------------------------------------------------------------------------------

BATCH = {
    "agent_code": "print('hi')",
    "agent_language": "python",
    "task_urls": ["https://e.com/a.tgz", "https://e.com/b.tgz"],
}


def ended_batch(api) -> str:
    batch_id = api.post("/batches", data=json.dumps(BATCH), content_type="application/json").json()["batch_id"]
    first, second = Evaluation.objects.filter(batch_id=batch_id).order_by("created_at")
    assert lifecycle.finish(first.id, Status.COMPLETED, expect=[Status.PENDING], reward=1.0)
    assert lifecycle.finish(second.id, Status.FAILED, expect=[Status.PENDING], kind="tests_failed", reward=0.25)
    assert lifecycle.settle(batch_id)  # the test's transaction holds finish's on_commit back
    return batch_id


def test_an_ended_batch_is_signed_and_stored(api, data_dir, tmp_path):
    batch_id = ended_batch(api)
    document = api.get(f"/batches/{batch_id}").json()
    assert (document["executor_version"], document["mean_reward"]) == (VERSION, 0.625)
    assert document["agent_sha256"] == hashlib.sha256(b"print('hi')").hexdigest()
    assert document["signature"]["fields"] == list(signing.BATCH_FIELDS)
    from evaluations.models import Batch

    assert Batch.objects.get(id=batch_id).signature == document["signature"]
    code, said = verify_result(saved(tmp_path, document))
    assert code == 0 and said.startswith("valid")
    assert "signature" not in api.get("/batches").json()[0]  # a summary is not the signed object


@pytest.mark.parametrize("field", signing.BATCH_FIELDS)
def test_a_changed_byte_in_any_signed_batch_field_fails(api, data_dir, tmp_path, field):
    document = api.get(f"/batches/{ended_batch(api)}").json()
    assert verify_result(saved(tmp_path, document))[0] == 0
    code, said = verify_result(saved(tmp_path, tampered(document, field)))
    assert code == 1 and "batch_id, status" in said


# -- callbacks --------------------------------------------------------------------------------


def test_callback_bodies_carry_the_signed_objects(api, data_dir, tmp_path, settings):
    received = []

    def record(req):
        received.append(req.rfile.read(int(req.headers["Content-Length"])))
        req.send_response(200)
        req.send_header("Content-Length", "0")
        req.end_headers()

    config = dataclasses.replace(settings.EXECUTOR, allowed_private_hosts=("127.0.0.1",))
    with TestHTTPServer() as server:
        server.routes["/hook"] = record
        hook = server.url("/hook")
        evaluation = Evaluation.objects.create(task_url="https://e.com/t.tgz", agent_code="x", callback_url=hook,
                                               status=Status.RUNNING)  # fmt: skip
        assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: failed", kind="tests_failed")
        assert callbacks.deliver(evaluation.id, config) == "delivered"
        batch_id = api.post("/batches", data=json.dumps({**BATCH, "callback_url": hook}),
                            content_type="application/json").json()["batch_id"]  # fmt: skip
        for eval_id in Evaluation.objects.filter(batch_id=batch_id).values_list("id", flat=True):
            lifecycle.finish(eval_id, Status.CANCELLED, expect=[Status.PENDING])
        assert lifecycle.settle(batch_id)
        assert callbacks.deliver(batch_id, config, callbacks.BATCHES) == "delivered"
    evaluation_body, batch_body = (json.loads(body) for body in received)
    assert evaluation_body["eval_id"] == str(evaluation.id) and batch_body["batch_id"] == batch_id
    for name, body in (("evaluation.json", evaluation_body), ("batch.json", batch_body)):
        code, said = verify_result(saved(tmp_path, body, name))
        assert code == 0, said
    assert verify_result(saved(tmp_path, tampered(evaluation_body, "status")))[0] == 1
