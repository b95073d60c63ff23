"""The admin lists batches with their reward and shows one read-only, its evaluations inline, the agent as size
and sha256 only."""

import json

import pytest
from django.contrib.auth.models import User

from evaluations import lifecycle
from evaluations.models import Batch, Status

pytestmark = pytest.mark.django_db

SECRET_CODE = "print('the submitter keeps this to themselves')"


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.login(username="ops", password="pw")
    return client


@pytest.fixture
def ended_batch(api):
    body = {"agent_code": SECRET_CODE, "task_urls": [f"https://tasks.example.com/t{i}.tgz" for i in range(3)]}
    made = api.post("/batches", data=json.dumps(body), content_type="application/json").json()
    lifecycle.finish(made["eval_ids"][0], Status.COMPLETED)
    lifecycle.finish(made["eval_ids"][1], Status.FAILED, error="tests failed", kind="tests_failed")
    lifecycle.finish(made["eval_ids"][2], Status.COMPLETED)
    lifecycle.settle(made["batch_id"])
    return made


def test_the_list_shows_progress_and_reward(admin_client, ended_batch):
    page = admin_client.get("/admin/evaluations/batch/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "3 / 3 (2 passed, 1 failed, 0 cancelled)" in html and "0.667" in html and "completed" in html
    assert SECRET_CODE not in html


def test_the_detail_is_read_only_with_evaluations_inline_and_no_code(admin_client, ended_batch):
    batch = Batch.objects.get()
    page = admin_client.get(f"/admin/evaluations/batch/{batch.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    for eval_id in ended_batch["eval_ids"]:
        assert f"/admin/evaluations/evaluation/{eval_id}/change/" in html
    assert "tests_failed" in html and "tasks.example.com" in html
    assert f"sha256 {batch.agent_sha256}" in html and "one file, " in html
    assert SECRET_CODE not in html and 'name="_save"' not in html
    assert "0.667" in html
    response = admin_client.post(f"/admin/evaluations/batch/{batch.id}/change/", {"status": "pending"})
    assert response.status_code == 403
    assert Batch.objects.get().status == "completed"
