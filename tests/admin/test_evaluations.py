"""The admin lists, filters, searches and shows evaluations read-only."""

import pytest
from django.contrib.auth.models import User

from evaluations import lifecycle
from evaluations.models import Evaluation, Status, Step, TestResult, Transition

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.login(username="ops", password="pw")
    return client


@pytest.fixture
def finished():
    evaluation = Evaluation.objects.create(
        task_url="https://tasks.example.com/t.tgz", agent_code="print(1)", status=Status.RUNNING,
        agent_output="<agent said>\nline two", test_output="=== t (exit 0) ===\nok",
    )  # fmt: skip
    Transition.objects.create(evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING)
    TestResult.objects.create(
        evaluation=evaluation, position=0, name="t", kind="test", passed=True, exit_code=0, output="ok <b>"
    )
    lifecycle.finish(evaluation.id, Status.COMPLETED)
    return evaluation


def test_changelist_shows_columns_filters_and_search(admin_client, finished):
    page = admin_client.get("/admin/evaluations/evaluation/")
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("tasks.example.com", "completed", "By status", "By step", "By passed", "By language", "By created at"):
        assert text in html
    assert str(finished.id) in admin_client.get(f"/admin/evaluations/evaluation/?q={finished.id}").content.decode()
    assert str(finished.id) in admin_client.get("/admin/evaluations/evaluation/?q=tasks.example").content.decode()
    assert str(finished.id) not in admin_client.get("/admin/evaluations/evaluation/?q=nothing-like-it").content.decode()
    assert (
        str(finished.id) in admin_client.get("/admin/evaluations/evaluation/?status__exact=completed").content.decode()
    )


def test_changelist_filters_by_error_kind_and_the_detail_shows_it(admin_client, finished):
    timed_out = Evaluation.objects.create(task_url="https://tasks.example.com/slow.tgz", status=Status.RUNNING)
    lifecycle.finish(
        timed_out.id, Status.CANCELLED, error="running_agent: agent timed out after 5 s", kind="agent_timeout"
    )
    html = admin_client.get("/admin/evaluations/evaluation/").content.decode()
    assert "By error kind" in html and "agent_timeout" in html
    only = admin_client.get("/admin/evaluations/evaluation/?error_kind__exact=agent_timeout").content.decode()
    assert str(timed_out.id)[:8] in only and str(finished.id)[:8] not in only
    assert '<span class="te-kind">agent_timeout</span>' in only
    passed = admin_client.get("/admin/evaluations/evaluation/?error_kind__isnull=True").content.decode()
    assert str(finished.id)[:8] in passed and str(timed_out.id)[:8] not in passed
    detail = admin_client.get(f"/admin/evaluations/evaluation/{timed_out.id}/change/").content.decode()
    assert '<span class="te-kind">agent_timeout</span> running_agent: agent timed out after 5 s' in detail


def test_detail_is_read_only_with_inlines_and_preformatted_outputs(admin_client, finished):
    page = admin_client.get(f"/admin/evaluations/evaluation/{finished.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<pre" in html and "&lt;agent said&gt;" in html  # escaped, preformatted
    assert "ok &lt;b&gt;" in html
    assert "queued" in html and "done" in html  # transitions inline
    assert 'name="_save"' not in html
    response = admin_client.post(f"/admin/evaluations/evaluation/{finished.id}/change/", {"status": "failed"})
    assert response.status_code == 403
    finished.refresh_from_db()
    assert finished.status == "completed"


def test_detail_shows_the_resources_with_peak_files_and_without_for_older_rows(admin_client, finished):
    figures = {"peak_memory_bytes": 3 * 2**20, "cpu_seconds": 1.5, "peak_processes": 4, "peak_disk_bytes": 2**20}
    Evaluation.objects.filter(id=finished.id).update(resources={**figures, "peak_files": 1234})
    html = admin_client.get(f"/admin/evaluations/evaluation/{finished.id}/change/").content.decode()
    assert "peak processes 4, peak disk 1.0 MiB, peak files 1234" in html
    Evaluation.objects.filter(id=finished.id).update(resources=figures)  # recorded before peak_files existed
    html = admin_client.get(f"/admin/evaluations/evaluation/{finished.id}/change/").content.decode()
    assert "peak disk 1.0 MiB" in html and "peak files" not in html


def test_detail_shows_the_environment_and_the_list_does_not(admin_client, finished):
    detail = f"/admin/evaluations/evaluation/{finished.id}/change/"
    assert (
        "not recorded (the evaluation did not reach preparing_environment)" in admin_client.get(detail).content.decode()
    )
    digest = "sha256:" + "ab" * 32
    Evaluation.objects.filter(id=finished.id).update(
        environment={"kind": "image", "ref": "python:3.12-slim", "digest": digest, "cached": True}
    )
    html = admin_client.get(detail).content.decode()
    assert (
        f'image: python:3.12-slim<br>digest <code class="te-digest">{digest}</code><br>'
        "cached: the image store had it, nothing was pulled"
    ) in html
    assert digest not in admin_client.get("/admin/evaluations/evaluation/").content.decode()
    Evaluation.objects.filter(id=finished.id).update(
        environment={"kind": "dockerfile", "ref": "env/Dockerfile", "digest": digest, "cached": False}
    )
    assert "dockerfile: env/Dockerfile<br>" in admin_client.get(detail).content.decode()
    assert "built now" in admin_client.get(detail).content.decode()
    Evaluation.objects.filter(id=finished.id).update(
        environment={"kind": "name", "ref": "<bookworm>", "digest": None, "cached": True}
    )
    assert "name: &lt;bookworm&gt; (under ENVIRONMENTS_ROOT)" in admin_client.get(detail).content.decode()
    Evaluation.objects.filter(id=finished.id).update(
        environment={"kind": "host", "ref": None, "digest": None, "cached": True}
    )
    assert "host: the executor&#x27;s own system folders" in admin_client.get(detail).content.decode()
