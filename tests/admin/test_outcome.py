"""The evaluation detail page's SPEC §17 fields: batch and attempt, reward and rewards, the task's format,
limits and metadata, what the agent changed outside its folder (the suspicious first), its artifacts."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from django.contrib.auth.models import User

from evaluations import lifecycle
from evaluations.admin import format as fmt
from evaluations.models import Evaluation, Status, Step, Transition

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/evaluations/evaluation/"
PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.login(username="ops", password="pw")
    return client


def ended(**fields) -> Evaluation:
    evaluation = Evaluation.objects.create(
        task_url="https://tasks.example.com/harbor/hello.tar.gz", agent_code="print(1)", status=Status.RUNNING
    )
    Transition.objects.create(evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING)
    lifecycle.finish(evaluation.id, Status.FAILED, error="tests failed", kind="tests_failed", **fields)
    evaluation.refresh_from_db()
    return evaluation


def field(html: str, name: str) -> str:
    """The read-only value of one detail field (its <div class="readonly">)."""
    match = re.search(rf'<div class="[^"]*field-{name}[^"]*">.*?<div class="readonly">(.*?)</div>\s*</div>', html, re.S)
    assert match, f"no field {name} on the page"
    return match.group(1)


def page(client, evaluation) -> str:
    reply = client.get(f"{CHANGELIST}{evaluation.id}/change/")
    assert reply.status_code == 200
    return reply.content.decode()


def test_the_detail_shows_reward_format_limits_changes_and_artifacts(admin_client):
    evaluation = ended(
        reward=0.5,
        rewards={"reward": 0.5, "accuracy": 0.75, "<b>": 1},
        task_format="harbor",
        limits_applied={"network": "allowlist", "allowed_hosts": ["pypi.org", "files.pythonhosted.org"], "cpus": 2},
        task_metadata={"difficulty": "easy", "tags": ["<script>"]},
        system_changes={
            "count": 3,
            "paths": ["/etc/motd", "/usr/bin/python3", "/usr/lib/python3/site-packages/sitecustomize.py"],
            "suspicious": ["/usr/bin/python3", "/usr/lib/python3/site-packages/sitecustomize.py"],
        },
        artifacts=[
            {"path": "trajectory.json", "size_bytes": 2048, "sha256": "a" * 64},
            {"path": "runs/step 1 <x>.txt", "size_bytes": 5, "sha256": "b" * 64},
        ],
    )
    html = page(admin_client, evaluation)
    assert field(html, "reward_text") == "0.500"
    rewards = field(html, "rewards_table")
    assert "<td>accuracy</td><td class='te-num'>0.750</td>" in rewards and "<td>&lt;b&gt;</td>" in rewards
    assert field(html, "task_format_text") == "harbor"
    limits = field(html, "limits_table")
    assert limits.index("cpus") < limits.index("network") < limits.index("allowed_hosts")  # LIMIT_KEYS' order
    assert "pypi.org, files.pythonhosted.org" in limits
    metadata = field(html, "task_metadata_pre")
    assert "&quot;difficulty&quot;: &quot;easy&quot;" in metadata and "<script>" not in metadata
    changes = field(html, "system_changes_summary")
    assert changes.startswith("3 files and folders created, changed or removed (sorted):")
    suspicious = re.search(r'<p class="te-suspicious">2 suspicious.*?</p><pre[^>]*>(.*?)</pre>', changes, re.S)
    assert suspicious.group(1).split("\n") == evaluation.system_changes["suspicious"]
    artifacts = field(html, "artifacts_table")
    assert f'<a href="{CHANGELIST}{evaluation.id}/artifact/trajectory.json">trajectory.json</a>' in artifacts
    assert (
        f'<a href="{CHANGELIST}{evaluation.id}/artifact/runs/step%201%20%3Cx%3E.txt">runs/step 1 &lt;x&gt;.txt</a>'
        in artifacts
    )
    assert "2 files, 2 KiB" in artifacts and "b" * 64 in artifacts
    assert field(html, "batch_attempt") == "none (a single evaluation)"
    whole = admin_client.get(f"{CHANGELIST}{evaluation.id}/whole/system_changes/")
    assert json.loads(whole.content) == evaluation.system_changes
    assert json.loads(admin_client.get(f"{CHANGELIST}{evaluation.id}/whole/task_metadata/").content) == {
        "difficulty": "easy",
        "tags": ["<script>"],
    }


def test_what_an_earlier_or_unfinished_evaluation_lacks_says_so(admin_client):
    evaluation = Evaluation.objects.create(task_url="https://tasks.example.com/t.tgz", agent_code="print(1)")
    Transition.objects.create(evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING)
    html = page(admin_client, evaluation)
    assert field(html, "reward_text") == "-"  # not graded yet
    assert field(html, "rewards_table") == "none"
    assert field(html, "task_format_text").startswith("not recorded")
    assert field(html, "limits_table") == "none (the operator&#x27;s settings)"
    assert '<span class="te-none">none</span>' in field(html, "task_metadata_pre")
    assert field(html, "system_changes_summary").startswith("not recorded")
    assert field(html, "artifacts_table") == "none"
    lifecycle.finish(evaluation.id, Status.FAILED, error="worker lost")
    html = page(admin_client, evaluation)
    assert field(html, "reward_text") == "none (nothing was graded)"
    nothing = ended(system_changes={"count": 0, "paths": [], "suspicious": []})
    assert field(page(admin_client, nothing), "system_changes_summary").startswith("nothing: the agent changed no")


def test_a_batch_evaluation_names_its_attempt_and_links_its_batch(admin_client, api):
    body = {"agent_code": "print(1)", "attempts": 2, "task_urls": ["https://tasks.example.com/t.tgz"]}
    made = api.post("/batches", data=json.dumps(body), content_type="application/json").json()
    second = Evaluation.objects.get(id=made["eval_ids"][1])
    shown = field(page(admin_client, second), "batch_attempt")
    assert shown == (
        f'attempt 2 of 2 in batch <a href="/admin/evaluations/batch/{made["batch_id"]}/change/" '
        f'title="{made["batch_id"]}">{made["batch_id"][:8]}</a>'
    )


def test_many_changes_rewards_and_artifacts_stay_within_the_page_budget(admin_client):
    paths = sorted(f"/usr/lib/python3/site-packages/pkg{i:03d}/" + "x" * 900 for i in range(200))
    evaluation = ended(
        rewards={f"metric_{i}": i / 100 for i in range(120)},
        task_metadata={"notes": "y" * 100_000},
        system_changes={"count": 5000, "paths": paths, "suspicious": paths},
        artifacts=[{"path": f"f{i}.txt", "size_bytes": 1, "sha256": "c" * 64} for i in range(300)],
    )
    html = page(admin_client, evaluation)
    ours = field(html, "task_metadata_pre") + field(html, "system_changes_summary")
    shipped = sum(len(htmllib.unescape(body).encode()) for body in PRE.findall(ours))
    budget = fmt.TASK_METADATA_BYTES + fmt.SYSTEM_PATHS_BYTES + fmt.SUSPICIOUS_PATHS_BYTES
    assert budget - 1024 < shipped <= budget, shipped
    changes = field(html, "system_changes_summary")
    assert changes.startswith("5000 files and folders created, changed or removed (the first 200, sorted):")
    assert changes.count(f'href="{CHANGELIST}{evaluation.id}/whole/system_changes/"') == 2  # both lists clipped
    assert "and 70 more keys" in field(html, "rewards_table")
    artifacts = field(html, "artifacts_table")
    assert artifacts.count("<tr>") == 1 + fmt.TABLE_ROWS and "300 files, 300 bytes; the first 50 shown" in artifacts
    assert len(html.encode()) < 120 * 1024
