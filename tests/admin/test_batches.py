"""The admin lists batches with their reward, mean reward and pass@k and shows one read-only, its tasks and
evaluations inline, the agent as size and sha256 only."""

import json
import re

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
    assert "0.667" in html and "<th>pass@k</th>" in html
    response = admin_client.post(f"/admin/evaluations/batch/{batch.id}/change/", {"status": "pending"})
    assert response.status_code == 403
    assert Batch.objects.get().status == "completed"


@pytest.fixture
def attempts_batch(api):
    """Two tasks, three attempts each: t0 passes once (rewards 1, 0, none), t1 never (0.5, 0.25, cancelled)."""
    body = {
        "agent_code": SECRET_CODE,
        "attempts": 3,
        "task_urls": [f"https://tasks.example.com/t{i}.tgz" for i in (0, 1)],
    }
    made = api.post("/batches", data=json.dumps(body), content_type="application/json").json()
    t0, t1 = made["eval_ids"][0::2], made["eval_ids"][1::2]
    lifecycle.finish(t0[0], Status.COMPLETED)
    lifecycle.finish(t0[1], Status.FAILED, error="tests failed", kind="tests_failed")
    lifecycle.finish(t0[2], Status.FAILED, error="worker lost")
    lifecycle.finish(t1[0], Status.FAILED, error="tests failed", kind="tests_failed", reward=0.5)
    lifecycle.finish(t1[1], Status.FAILED, error="tests failed", kind="tests_failed", reward=0.25)
    return made


def test_the_list_shows_attempts_mean_reward_and_pass_at_k_once_ended(admin_client, attempts_batch):
    html = admin_client.get("/admin/evaluations/batch/").content.decode()
    assert '<td class="field-attempts">3</td>' in html
    assert '<td class="field-mean_reward_text">-</td>' in html and '<td class="field-pass_at_k_text">-</td>' in html
    lifecycle.finish(attempts_batch["eval_ids"][5], Status.CANCELLED, error="cancelled")
    html = admin_client.get("/admin/evaluations/batch/").content.decode()
    assert '<td class="field-reward_text">0.167</td>' in html  # 1 passed of 6
    assert '<td class="field-mean_reward_text">0.292</td>' in html  # (1 + 0.5 + 0.25) / 6
    assert '<td class="field-pass_at_k_text">0.500</td>' in html  # t0 passed once, t1 never


def test_the_detail_shows_the_tasks_and_each_attempt(admin_client, attempts_batch):
    batch_id = attempts_batch["batch_id"]
    html = admin_client.get(f"/admin/evaluations/batch/{batch_id}/change/").content.decode()
    tasks = re.search(r"<th>mean reward</th></tr></thead><tbody>(.*?)</tbody>", html, re.S).group(1)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", tasks)]
    assert [c[1:] for c in cells] == [["3", "1", "1.000", "0.333"], ["3", "0", "-", "-"]]  # t0 ended, t1 not
    assert 'title="https://tasks.example.com/t0.tgz">t0</span>' in cells[0][0]
    lifecycle.finish(attempts_batch["eval_ids"][5], Status.CANCELLED, error="cancelled")
    html = admin_client.get(f"/admin/evaluations/batch/{batch_id}/change/").content.decode()
    tasks = re.search(r"<th>mean reward</th></tr></thead><tbody>(.*?)</tbody>", html, re.S).group(1)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", tasks)]
    assert [c[1:] for c in cells] == [["3", "1", "1.000", "0.333"], ["3", "0", "0.000", "0.250"]]
    attempts = re.findall(r'<td class="field-attempt">(\d+)</td>', html)
    rewards = re.findall(r'<td class="field-reward_text">([^<]*)</td>', html)
    assert attempts == ["1", "1", "2", "2", "3", "3"]
    assert rewards == ["1.000", "0.500", "0.000", "0.250", "-", "-"]
    assert "0.292" in html and "0.500" in html and SECRET_CODE not in html
