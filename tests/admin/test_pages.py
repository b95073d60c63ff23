"""What the admin's pages say and ship: audit trail, re-run links, neutral values, bounded outputs,
read-only workers, the root page, the icon. (The browser test, tests/admin/test_browser.py,
checks the layout and the log's scroll position on a live service.)"""

from __future__ import annotations

import hashlib
import html as htmllib
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from evaluations import agents, lifecycle
from evaluations.admin import format as fmt
from evaluations.admin.evaluations import EvaluationAdmin
from evaluations.api.retry import retry
from evaluations.models import Evaluation, Status, Step, TestResult, Transition, WorkerHeartbeat
from tests.helpers.archives import archive_bytes

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/evaluations/evaluation/"
MIB = 1024 * 1024
PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.login(username="ops", password="pw")
    return client


def make(status=Status.PENDING, **fields) -> Evaluation:
    fields.setdefault("agent_code", "print(1)")
    evaluation = Evaluation.objects.create(task_url="https://tasks.example.com/swe/django-1234.tar.gz", **fields)
    Transition.objects.create(evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING)
    if status == Status.RUNNING:
        lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], started_at=timezone.now())
    elif status != Status.PENDING:
        lifecycle.finish(
            evaluation.id, status, error="running_tests: 1 of 1 tests failed (t)" if status == "failed" else ""
        )
    evaluation.refresh_from_db()
    return evaluation


def act(client, action, evaluations, **extra):
    data = {"action": action, "_selected_action": [str(e.id) for e in evaluations], **extra}
    return client.post(CHANGELIST, data, follow=True)


def detail(client, evaluation) -> str:
    reply = client.get(f"{CHANGELIST}{evaluation.id}/change/")
    assert reply.status_code == 200
    return reply.content.decode()


# -- audit trail -----------------------------------------------------------------


def test_cancel_and_rerun_are_in_the_admin_log_with_the_user(admin_client):
    pending, running, done = make(), make(Status.RUNNING), make(Status.FAILED)
    act(admin_client, "cancel_evaluations", [pending, running, done])
    entries = {e.object_id: e for e in LogEntry.objects.all()}
    assert entries[str(pending.id)].get_change_message() == "Cancelled it (it was pending)."
    assert entries[str(running.id)].get_change_message() == "Asked it to stop (it was running)."
    assert str(done.id) not in entries  # nothing happened to it: nothing is recorded
    assert {e.user.username for e in entries.values()} == {"ops"}
    assert {e.action_flag for e in entries.values()} == {CHANGE}

    act(admin_client, "rerun_evaluations", [done])
    new = Evaluation.objects.get(retry_of=done)
    added = LogEntry.objects.get(object_id=str(new.id))
    assert (added.action_flag, added.get_change_message(), added.user.username) == (
        ADDITION, f"Re-run of {done.id}.", "ops"
    )  # fmt: skip
    assert LogEntry.objects.get(object_id=str(done.id)).get_change_message() == f"Re-run as {new.id}."
    history = admin_client.get(f"{CHANGELIST}{done.id}/history/").content.decode()
    assert f"Re-run as {new.id}." in history and "ops" in history
    recent = admin_client.get("/admin/").content.decode().split('id="recent-actions-module"', 1)[1]
    assert str(new.id) in recent and str(done.id) in recent


def test_a_rerun_links_to_its_original_both_ways(admin_client):
    original = make(Status.FAILED, env={"A": "1"}, metadata={"run": 7})
    act(admin_client, "rerun_evaluations", [original])
    new = Evaluation.objects.get(retry_of=original)
    assert (new.env, new.metadata, new.task_url, new.idempotency_key) == (
        {"A": "1"},
        {"run": 7},
        original.task_url,
        None,
    )
    assert f're-run of <a href="{CHANGELIST}{original.id}/change/">{original.id}</a>' in detail(admin_client, new)
    assert f'<a href="{CHANGELIST}{new.id}/change/">{str(new.id)[:8]}</a>' in detail(admin_client, original)


def test_the_agent_is_shown_as_its_size_and_hash_never_its_code(admin_client):
    code = "SECRET_AGENT_LINE = 1\n" * 100
    one_file = make(Status.FAILED, **agents.model_fields({"agent_code": code}))
    html = detail(admin_client, one_file)
    assert "SECRET_AGENT_LINE" not in html
    assert "one file, 2 KiB" in html and hashlib.sha256(code.encode()).hexdigest() in html
    data = archive_bytes({"agent.py": "SECRET_AGENT_LINE = 2\n"})
    project = make(Status.FAILED, **agents.model_fields({"agent_archive": data, "agent_entrypoint": "agent.py"}))
    html = detail(admin_client, project)
    assert "SECRET_AGENT_LINE" not in html
    assert f"project archive, {len(data)} bytes, entry point <code>agent.py</code>" in html
    assert hashlib.sha256(data).hexdigest() in html


def test_a_retry_of_an_agent_project_runs_the_same_archive(settings):
    data = archive_bytes({"main.py": "print(1)\n"})
    original = make(Status.FAILED, **agents.model_fields({"agent_archive": data, "agent_entrypoint": "main.py"}))
    new = retry(original, config=settings.EXECUTOR, scope="token-a")
    assert (new.agent_code, new.agent_archive.data, new.agent_entrypoint) == ("", data, "main.py")
    assert new.agent_sha256 == original.agent_sha256 == hashlib.sha256(data).hexdigest()


def test_retry_is_one_function_for_the_admin_and_the_api(settings):
    original = make(Status.FAILED, timeout_secs=30, callback_url="https://cb.example.com/h")
    new = retry(original, config=settings.EXECUTOR, scope="token-a")
    assert (new.retry_of_id, new.status, new.idempotency_scope) == (original.id, "pending", "token-a")
    assert (new.timeout_secs, new.callback_url) == (30, "https://cb.example.com/h")
    assert list(new.transitions.values_list("step", "status")) == [("queued", "pending")]


def test_the_detail_page_buttons_act_on_that_evaluation_and_come_back(admin_client):
    running = make(Status.RUNNING)
    page = admin_client.post(
        CHANGELIST, {"action": "cancel_evaluations", "_selected_action": [str(running.id)], "_from_detail": "1"}
    )
    assert page.status_code == 302 and page["Location"] == f"{CHANGELIST}{running.id}/change/"
    html = detail(admin_client, running)
    assert ">Cancel</button>" in html and ">Re-run</button>" in html
    page = admin_client.post(
        CHANGELIST, {"action": "rerun_evaluations", "_selected_action": [str(running.id)], "_from_detail": "1"}
    )
    new = Evaluation.objects.get(retry_of=running)
    assert page["Location"] == f"{CHANGELIST}{new.id}/change/"


def test_view_only_staff_see_no_buttons(client):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_evaluation"))
    client.login(username="viewer", password="pw")
    html = detail(client, make(Status.RUNNING))
    assert ">Cancel</button>" not in html and ">Re-run</button>" not in html


# -- list ----------------------------------------------------------------------


def test_the_list_never_reads_the_output_columns(admin_client):
    make(Status.FAILED, agent_output="o" * MIB, log="l" * MIB)
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(CHANGELIST).status_code == 200
    selects = [q["sql"] for q in queries if "evaluations_evaluation" in q["sql"] and "SELECT" in q["sql"]]
    assert selects and not any(column in sql for sql in selects for column in ('"agent_output"', '"log"'))


def test_the_list_shows_short_ids_task_names_errors_and_elapsed_time(admin_client):
    failed = make(Status.FAILED)
    running = make(Status.RUNNING)
    Evaluation.objects.filter(id=running.id).update(started_at=timezone.now() - timedelta(seconds=75))
    html = admin_client.get(CHANGELIST).content.decode()
    assert f'<span title="{failed.id}">{str(failed.id)[:8]}</span>' in html
    assert str(failed.id) + "<" not in html  # the whole id only in the title
    assert f'title="{failed.task_url}">django-1234</span>' in html
    assert "running_tests: 1 of 1 tests failed (t)" in html
    assert "running: queued" in html and re.search(r"1 min 1[5-9] s so far", html)
    assert "Created (UTC)" in html


def test_the_error_column_shows_the_error_kind():
    evaluation = Evaluation(error="downloading_task: could not fetch " + "x" * 200)
    shown = str(EvaluationAdmin.error_text(None, evaluation))
    assert "te-kind" not in shown and "…" in shown
    evaluation.error_kind = "infrastructure"
    assert '<span class="te-kind">infrastructure</span>' in str(EvaluationAdmin.error_text(None, evaluation))


@pytest.mark.parametrize(
    ("url", "label"),
    [
        ("http://127.0.0.1:8000/task-3f2a1b9c.tar.gz", "task-3f2a1b9c"),
        ("https://h.example/swe/django__django-11099.tgz", "django__django-11099"),
        ("https://h.example/tasks/flask-42/task.tar.gz", "flask-42/task"),
        ("https://h.example/a.zip?sig=abc", "a"),
        ("https://h.example/", "h.example"),
        ("https://h.example/" + "n" * 80 + ".tar.gz", "n" * 17 + "…" + "n" * 18),
    ],
)
def test_task_labels_tell_tasks_apart(url, label):
    assert fmt.task_label(url) == label


# -- detail ----------------------------------------------------------------------


def test_detail_values_are_neutral_to_the_second_and_say_none(admin_client):
    running = make(Status.RUNNING)
    html = detail(admin_client, running)
    assert re.search(r'<div class="readonly">pending</div>', html)  # passed, while it runs
    lifecycle.finish(running.id, Status.COMPLETED)
    TestResult.objects.create(
        evaluation=running, position=0, name="t", kind="test", passed=True, exit_code=0, timed_out=False, output="ok"
    )
    html = detail(admin_client, running)
    assert "icon-no.svg" not in html and "icon-yes.svg" not in html
    assert '<td class="field-timed_out_text">no</td>' in html and '<td class="field-passed_text">yes</td>' in html
    assert re.search(r'<div class="readonly">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</div>', html)
    assert '<td class="field-at_time">' in html and " UTC</td>" in html
    assert "queued/pending at" not in html  # no per-row caption repeating the row
    assert '<p class="te-none te-inline-empty">none</p>' in html  # no callback attempts
    assert re.search(r'Agent patch:</label>\s*<div class="readonly"><span class="te-none">none</span>', html)


def test_the_detail_page_ships_at_most_128_kib_of_output_and_links_the_whole(admin_client):
    big = "".join(f"line {i:07d} " + "x" * 80 + "\n" for i in range(MIB // 94))
    paths = [f"/usr/lib/python3/site-packages/p{i:03d}/" + "x" * 900 for i in range(200)]
    evaluation = make(
        Status.RUNNING, agent_output=big, agent_patch=big, test_output=big, task_prompt=big, original_pr=big,
        agent_code=big, log=big + "END OF LOG\n", task_metadata={"notes": big},
        system_changes={"count": 200, "paths": paths, "suspicious": paths},
    )  # fmt: skip
    for position in range(40):
        TestResult.objects.create(
            evaluation=evaluation, position=position, name=f"t{position}", kind="test", passed=False, output=big
        )
    lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: 40 of 40 tests failed")
    html = detail(admin_client, evaluation)
    shipped = sum(len(htmllib.unescape(body).encode()) for body in PRE.findall(html))
    assert 64 * 1024 < shipped <= 128 * 1024, shipped
    assert len(html.encode()) < 200 * 1024
    assert "END OF LOG" in html and 'data-source="stored"' in html
    for field in ("agent_output", "agent_patch", "test_output", "task_prompt", "original_pr"):
        url = f"{CHANGELIST}{evaluation.id}/whole/{field}/"
        assert f'href="{url}"' in html, field
        whole = admin_client.get(url)
        assert whole["Content-Type"] == "text/plain; charset=utf-8" and whole.content.decode() == big, field
    test_url = f"{CHANGELIST}{evaluation.id}/test/3/"
    assert f'href="{test_url}"' in html and admin_client.get(test_url).content.decode() == big
    log = admin_client.get(f"{CHANGELIST}{evaluation.id}/log/")
    assert log.content.decode() == big + "END OF LOG\n"


def test_the_whole_text_views_refuse_other_fields_and_strangers(admin_client, client):
    evaluation = make(Status.FAILED)
    assert admin_client.get(f"{CHANGELIST}{evaluation.id}/whole/idempotency_scope/").status_code == 404
    assert admin_client.get(f"{CHANGELIST}{evaluation.id}/whole/agent_code/").status_code == 404  # never shown
    assert admin_client.get(f"{CHANGELIST}{evaluation.id}/test/0/").status_code == 404
    client.logout()
    for path in ("whole/agent_output/", "test/0/", "log/"):
        reply = client.get(f"{CHANGELIST}{evaluation.id}/{path}")
        assert reply.status_code == 302 and "/admin/login/" in reply["Location"], path


def test_the_log_caption_names_its_source(admin_client, executor_config, tmp_path):
    executor_config(workspace_base=tmp_path / "sessions")
    pending = make()
    assert 'data-source="none"' in detail(admin_client, pending)
    lifecycle.finish(pending.id, Status.CANCELLED, error="queued: cancelled by DELETE")
    html = detail(admin_client, pending)
    assert (
        'data-source="rebuilt"' in html
        and (
            '<span class="te-exec">␞ === cancelled ===</span>\n<span class="te-exec">␞ queued: cancelled by DELETE</span>'
        )
        in html
    )


def test_clip_keeps_whole_characters_and_counts_what_it_left_out():
    text = "é" * 10  # 20 bytes
    assert fmt.clip(text, 100) == (text, 0, 20)
    assert fmt.clip(text, 5, keep="head") == ("éé", 15, 20)
    assert fmt.clip(text, 5, keep="tail") == ("éé", 15, 20)


# -- workers, site ----------------------------------------------------------------


def test_workers_are_read_only_and_judged_alive_or_stale(admin_client, executor_config):
    executor_config(worker_stale_secs=30)
    WorkerHeartbeat.objects.create(worker_id="w-alive", hostname="a", pid=1, capacity=2, sandbox="bwrap")
    WorkerHeartbeat.objects.create(
        worker_id="w-stale", hostname="b", pid=2, capacity=2, sandbox="bwrap",
        last_beat_at=timezone.now() - timedelta(seconds=31),
    )  # fmt: skip
    html = admin_client.get("/admin/evaluations/workerheartbeat/").content.decode()
    rows = {m[0]: m[1] for m in re.findall(r">(w-alive|w-stale)</a>.*?field-state\">(.*?)</td>", html, re.S)}
    assert rows["w-alive"] == "alive" and rows["w-stale"].startswith('<span class="te-stale">stale</span>')
    assert "delete_selected" not in html and "Add worker heartbeat" not in html
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", html)
    assert admin_client.post("/admin/evaluations/workerheartbeat/w-stale/delete/", {"post": "yes"}).status_code == 403
    assert WorkerHeartbeat.objects.filter(worker_id="w-stale").exists()


def test_view_site_goes_to_the_api_docs(admin_client):
    assert '<a href="/api/docs">View site</a>' in admin_client.get("/admin/").content.decode()


def test_the_root_is_a_short_page_and_the_icon_is_there(client):
    home = client.get("/")
    assert home.status_code == 200 and home["Content-Type"].startswith("text/html")
    assert b'href="/api/docs"' in home.content and b'href="/admin/"' in home.content
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon["Content-Type"] == "image/x-icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00" and b"\x89PNG" in icon.content
