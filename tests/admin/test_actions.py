"""The admin steers evaluations: cancel, re-run; it shows step times, the live log, callbacks, a 24 h summary."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from evaluations import lifecycle
from evaluations.models import CallbackAttempt, Evaluation, Status, Step, Transition

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/evaluations/evaluation/"


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.login(username="ops", password="pw")
    return client


def make(status=Status.PENDING, **fields) -> Evaluation:
    evaluation = Evaluation.objects.create(
        task_url="https://tasks.example.com/t.tgz", agent_code="print(1)", env={"A": "1"},
        metadata={"run": 7}, timeout_secs=30, callback_url="https://cb.example.com/hook", **fields,
    )  # fmt: skip
    Transition.objects.create(evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING)
    if status == Status.RUNNING:
        lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], started_at=timezone.now())
    elif status != Status.PENDING:
        lifecycle.finish(evaluation.id, status)
    evaluation.refresh_from_db()
    return evaluation


def act(client, action, evaluations):
    return client.post(
        CHANGELIST, {"action": action, "_selected_action": [str(e.id) for e in evaluations]}, follow=True
    )


def test_cancel_ends_pending_ones_and_asks_running_ones_to_stop(admin_client):
    pending, running, done = make(), make(Status.RUNNING), make(Status.COMPLETED)
    page = act(admin_client, "cancel_evaluations", [pending, running, done])
    assert "1 cancelled, 1 running asked to stop (within 2 s), 1 had already ended." in page.content.decode()
    pending.refresh_from_db(), running.refresh_from_db(), done.refresh_from_db()
    assert (pending.status, pending.error) == ("cancelled", "queued: cancelled by ops in the admin")
    assert (running.status, running.cancel_requested, running.cancel_reason) == (
        "running", True, "cancelled by ops in the admin"
    )  # fmt: skip
    assert done.status == "completed"


def test_rerun_admits_a_new_pending_evaluation_with_the_same_request(admin_client):
    original = make(Status.FAILED, language="bash", static_assets={"a": {"path": "x"}})
    page = act(admin_client, "rerun_evaluations", [original])
    assert "Re-run as 1 new pending evaluation(s)" in page.content.decode()
    again = Evaluation.objects.exclude(id=original.id).get()
    assert (again.status, again.step) == ("pending", "queued")
    for name in (
        "agent_code",
        "language",
        "task_url",
        "timeout_secs",
        "env",
        "static_assets",
        "callback_url",
        "metadata",
    ):
        assert getattr(again, name) == getattr(original, name), name
    assert list(again.transitions.values_list("step", "status")) == [("queued", "pending")]


def test_rerun_is_refused_at_capacity(admin_client, executor_config):
    executor_config(max_concurrent_evals=1, max_queued_evals=0)
    first, second = make(Status.FAILED), make(Status.FAILED)
    page = act(admin_client, "rerun_evaluations", [first, second])
    html = page.content.decode()
    assert "Re-run as 1 new pending evaluation(s)" in html
    assert "At capacity (1 pending or running): 1 not re-run" in html
    assert Evaluation.objects.filter(status=Status.PENDING).count() == 1


def test_view_only_staff_get_no_actions(client):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_evaluation"))
    client.login(username="viewer", password="pw")
    pending = make()
    page = client.get(CHANGELIST)
    assert page.status_code == 200 and "cancel_evaluations" not in page.content.decode()
    act(client, "cancel_evaluations", [pending])
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_the_changelist_opens_with_the_last_24_hours_and_what_runs_now(admin_client):
    make(Status.COMPLETED), make(Status.COMPLETED), make(Status.FAILED), make(Status.RUNNING), make()
    make(Status.CANCELLED), make(Status.CANCELLED)
    old = make(Status.CANCELLED)
    Evaluation.objects.filter(id=old.id).update(created_at=timezone.now() - timedelta(hours=25))
    old_running = make(Status.RUNNING)
    Evaluation.objects.filter(id=old_running.id).update(created_at=timezone.now() - timedelta(hours=25))
    # Durations: the cancelled ones' must not move the mean.
    Evaluation.objects.filter(status__in=["completed", "failed"]).update(duration_ms=2000)
    Evaluation.objects.filter(status="cancelled").update(duration_ms=60000)
    html = admin_client.get(CHANGELIST).content.decode()
    assert 'id="evaluation-dashboard"' in html and "Last 24 hours: 7 evaluations" in html
    board = html.split('id="evaluation-dashboard"', 1)[1].split("</div>", 1)[0]
    for status, count in (("completed", 2), ("failed", 1), ("cancelled", 2)):
        assert f'<td class="dashboard-{status}"><a href="?status__exact={status}&amp;created_at__gte=' in board
        assert f">{count}</a></td>" in board.split(f'dashboard-{status}"', 1)[1][:200]
    # Passed over passed + failed: 2 of 3, the two cancelled ones shown apart and left out.
    assert '<td class="dashboard-pass-rate">67 % <span class="te-note">(2 of 3)</span></td>' in board
    assert '<td class="dashboard-mean">2.00 s</td>' in board
    # Running and pending once each, now, whenever created (the running one of yesterday too).
    assert '<td class="dashboard-running te-now"><a href="?status__exact=running">2</a></td>' in board
    assert '<td class="dashboard-pending"><a href="?status__exact=pending">1</a></td>' in board
    assert board.count(">running<") == 0 and board.count("running now") == 1


def test_the_detail_page_shows_step_times_the_live_log_and_callbacks(admin_client, executor_config, tmp_path):
    workspace = executor_config(workspace_base=tmp_path / "sessions").workspace_base
    running = make(Status.RUNNING)
    Transition.objects.filter(evaluation=running, step=Step.QUEUED, status=Status.PENDING).update(duration_ms=1500)
    (workspace / str(running.id)).mkdir(parents=True)
    (workspace / str(running.id) / "log.txt").write_text("=== running_agent ===\n<tick> 1\n")
    CallbackAttempt.objects.create(evaluation=running, attempt=1, status_code=502, duration_ms=12)
    html = admin_client.get(f"{CHANGELIST}{running.id}/change/").content.decode()
    assert "Time per step" in html and "1.50 s" in html and "so far" in html
    assert "Live, from the session&#x27;s log file: reload the page to follow it." in html
    assert 'data-source="live"' in html and "&lt;tick&gt; 1" in html
    assert "callback attempts" in html.lower() and "502" in html
    raw = admin_client.get(f"{CHANGELIST}{running.id}/log/")
    assert raw["Content-Type"].startswith("text/plain") and raw.content == b"=== running_agent ===\n<tick> 1\n"
    Evaluation.objects.filter(id=running.id).update(agent_output="done it")
    lifecycle.finish(running.id, Status.COMPLETED)
    html = admin_client.get(f"{CHANGELIST}{running.id}/change/").content.decode()
    assert 'data-source="rebuilt"' in html and "Rebuilt from the stored agent and test outputs" in html
    assert "done it" in html


def test_the_raw_log_needs_a_staff_login(client):
    evaluation = make()
    reply = client.get(f"{CHANGELIST}{evaluation.id}/log/")
    assert reply.status_code == 302 and "/admin/login/" in reply["Location"]
