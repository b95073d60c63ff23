"""Signed results from the real service (gunicorn, its own database and DATA_DIR): the README's
verify snippet, run as written against GET /public-key, and manage.py verify_result, on every
signed field of an evaluation and a batch; rotation while the service runs."""

import json

import pytest

from evaluations import signing
from tests.helpers.http import request
from tests.helpers.signatures import readme_verify, tampered

pytestmark = pytest.mark.slow

EVALUATION = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}
BATCH = {"agent_code": "print('hi')", "task_urls": ["https://example.com/a.tar.gz", "https://example.com/b.tar.gz"]}


def cancelled_evaluation(service) -> dict:
    """A pending evaluation ended by DELETE: no worker runs it, and it ends signed all the same."""
    eval_id = request("POST", service.url("/evaluate"), json_body=EVALUATION).json()["eval_id"]
    assert request("DELETE", service.url(f"/evaluate/{eval_id}")).status == 202
    return request("GET", service.url(f"/evaluate/{eval_id}")).json()


def cancelled_batch(service) -> dict:
    batch_id = request("POST", service.url("/batches"), json_body=BATCH).json()["batch_id"]
    assert request("DELETE", service.url(f"/batches/{batch_id}")).status == 202
    return request("GET", service.url(f"/batches/{batch_id}")).json()


def test_the_readme_snippet_and_verify_result_check_every_signed_field(live_service, tmp_path):
    service = live_service()
    evaluation, batch = cancelled_evaluation(service), cancelled_batch(service)
    assert evaluation["signature"]["fields"] == list(signing.EVALUATION_FIELDS)
    assert batch["signature"]["fields"] == list(signing.BATCH_FIELDS) and batch["finished_at"]
    changed = [tampered(evaluation, f) for f in signing.EVALUATION_FIELDS] + [
        tampered(batch, f) for f in signing.BATCH_FIELDS
    ]
    verdicts = readme_verify([evaluation, batch, *changed], service.base_url)
    assert verdicts[:2] == [True, True]
    assert verdicts[2:] == [False] * len(changed), [
        field
        for field, valid in zip(signing.EVALUATION_FIELDS + signing.BATCH_FIELDS, verdicts[2:], strict=True)
        if valid
    ]
    for name, document, expected in [
        ("evaluation.json", evaluation, 0),
        ("batch.json", batch, 0),
        ("changed.json", changed[0], 1),
    ]:
        (tmp_path / name).write_text(json.dumps(document))
        run = service.manage("verify_result", str(tmp_path / name), check=False)
        assert run.returncode == expected, run.stderr
        assert (run.stdout if expected == 0 else run.stderr).count("\n") == 1  # one line


def test_a_rotation_while_the_service_runs(live_service):
    service = live_service()
    before = cancelled_evaluation(service)
    rotated = service.manage("signing_key", "rotate")
    after = cancelled_evaluation(service)  # the web processes sign with the new key, not restarted
    keys = [k["key_id"] for k in request("GET", service.url("/public-key")).json()["keys"]]
    assert keys == [after["signature"]["key_id"], before["signature"]["key_id"]]
    assert after["signature"]["key_id"] in rotated.stdout
    assert readme_verify([before, after], service.base_url) == [True, True]
