"""The admin lists live sandboxes (SPEC §24), filters and searches them, shows one read-only with its
execs inline, and stops live ones through the API's own stop. Rows are made in the database; no
service runs: a sandbox of this host with no process is what DELETE meets when its process died."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from evaluations.admin import format as fmt
from evaluations.admin.sandboxes import node_label
from evaluations.models import Evaluation, Sandbox, SandboxExec, SandboxStatus, Token
from evaluations.sandboxes import fleet

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/evaluations/sandbox/"
DIGEST = "sha256:" + "cd" * 32
SPEC = {
    "environment": {"image": "python:3.12-slim"},
    "cpus": 2.0,
    "memory_mb": 1024,
    "storage_mb": None,
    "network": {"mode": "allowlist", "allowed_hosts": ["pypi.org"]},
    "env": {"GREETING": "<hello>"},
    "workdir": "/app",
    "user": None,
    "idle_timeout_secs": 600,
    "max_lifetime_secs": 86400,
}


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.login(username="ops", password="pw")
    return client


def here() -> str:
    return fleet.node(settings.EXECUTOR)


def make(status=SandboxStatus.READY, **fields) -> Sandbox:
    """A row as the API and the sandbox's process leave it, written directly."""
    now = timezone.now()
    values = {
        "spec": SPEC,
        "network": SPEC["network"],
        "node": here(),
        "created_at": now - timedelta(seconds=30),
        "environment": {"kind": "image", "ref": "python:3.12-slim", "digest": DIGEST, "cached": True},
        "ready_at": now - timedelta(seconds=28),
        "expires_at": now + timedelta(days=1),
    }
    if status == SandboxStatus.STARTING:
        values.update(environment=None, ready_at=None, expires_at=None)
    if status not in (SandboxStatus.STARTING, SandboxStatus.READY):
        values["ended_at"] = now
    values.update(fields)
    return Sandbox.objects.create(status=status, **values)


def add_exec(sandbox: Sandbox, position: int, command, **fields) -> SandboxExec:
    values = {"cwd": "/app", "exit_code": 0, "duration_ms": 1234, "started_at": timezone.now()}
    values.update(fields)
    return SandboxExec.objects.create(sandbox=sandbox, position=position, command=command, **values)


def act(client, sandboxes, **extra):
    data = {"action": "stop_sandboxes", "_selected_action": [str(s.id) for s in sandboxes], **extra}
    return client.post(CHANGELIST, data, follow=True)


def detail(client, sandbox) -> str:
    reply = client.get(f"{CHANGELIST}{sandbox.id}/change/")
    assert reply.status_code == 200
    return reply.content.decode()


def row_of(html: str, sandbox: Sandbox) -> dict[str, str]:
    """The list's cells of one sandbox: field name -> its HTML."""
    found = re.search(rf'<tr>(?:(?!</tr>).)*title="{sandbox.id}"(?:(?!</tr>).)*</tr>', html, re.S)
    assert found, f"no row for {sandbox.id}"
    return dict(re.findall(r'<t[dh] class="field-(\w+)[^"]*">(.*?)</t[dh]>', found.group(0), re.S))


# -- list ----------------------------------------------------------------------------------------


def test_the_list_shows_each_sandbox_and_never_reads_its_egress(admin_client):
    ready = make(exec_count=3, egress=[{"step": "sandbox", "host": "SECRET-EGRESS.example"}])
    failed = make(
        SandboxStatus.FAILED,
        environment=None,
        ready_at=None,
        spec={**SPEC, "environment": {"task_url": "https://tasks.example.com/swe/django-1234.tar.gz"}},
        node="https://host-b.example.com:8000/executor/",
        error="image: pull of python:3.12-slim failed: 404 from the registry",
        error_kind="task_invalid",
    )
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(CHANGELIST)
    assert page.status_code == 200
    html = page.content.decode()
    selects = [q["sql"] for q in queries if "evaluations_sandbox" in q["sql"] and "SELECT" in q["sql"]]
    assert selects and not any(column in sql for sql in selects for column in ('"egress"', '"resources"'))
    assert "SECRET-EGRESS" not in html

    cells = row_of(html, ready)
    assert f'<span title="{ready.id}">{str(ready.id)[:8]}</span>' in cells["short_id"]
    assert f'href="{CHANGELIST}{ready.id}/change/' in cells["short_id"]
    assert cells["state"] == "ready"
    assert cells["environment_text"] == '<span title="image: python:3.12-slim">python:3.12-slim</span>'
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells["created_short"])
    # Ready and ended as the time after its creation, the moment in the title.
    assert cells["ready_after"] == f'<span title="{fmt.when(ready.ready_at)}">2.00 s</span>'
    assert cells["ended_after"] == "-" and cells["execs"] == "3" and cells["error_kind_text"] == "-"
    assert f'title="{here()}"' in cells["node_text"]

    cells = row_of(html, failed)
    assert cells["state"] == "failed" and cells["ready_after"] == "-"
    assert cells["ended_after"] == f'<span title="{fmt.when(failed.ended_at)}">30.0 s</span>'
    # Never ready: the environment its spec asked for, the task told apart by its archive's name.
    assert cells["environment_text"] == (
        '<span title="task_url: https://tasks.example.com/swe/django-1234.tar.gz">django-1234</span>'
    )
    assert cells["error_kind_text"] == (
        '<span class="te-kind" title="image: pull of python:3.12-slim failed: 404 from the registry">'
        "task_invalid</span>"
    )
    assert cells["node_text"] == '<span title="https://host-b.example.com:8000/executor/">host-b:8000</span>'
    assert "Created (UTC)" in html
    assert "Add sandbox" not in html and "delete_selected" not in html


def test_the_list_filters_by_status_error_kind_and_owner_and_searches_by_id(admin_client):
    Token.objects.create(name="acme", sha256="a" * 64)  # a tenant: the owner column and filter appear
    mine = make(owner="acme")
    operators = make(SandboxStatus.STOPPED)
    failed = make(SandboxStatus.FAILED, error="worker lost", error_kind="infrastructure")
    html = admin_client.get(CHANGELIST).content.decode()
    for text in ("By status", "By error kind", "By owner", "By created at", "operator (no tenant)"):
        assert text in html, text
    assert row_of(html, mine)["owner_text"] == "acme" and row_of(html, operators)["owner_text"] == "-"

    def listed(query: str) -> set[Sandbox]:
        page = admin_client.get(f"{CHANGELIST}?{query}")
        assert page.status_code == 200, query
        html = page.content.decode()
        return {s for s in (mine, operators, failed) if f'title="{s.id}"' in html}

    assert listed("status__exact=ready") == {mine}
    assert listed("status__exact=stopped") == {operators}
    assert listed("status__in=starting,ready") == {mine}  # the dashboard's link
    assert listed("error_kind__exact=infrastructure") == {failed}
    assert listed("owner=acme") == {mine}
    assert listed("owner=(operator)") == {operators, failed}
    assert listed(f"q={mine.id}") == {mine}
    assert listed(f"q={str(failed.id)[:8]}") == {failed}
    assert listed(f"q={uuid.uuid4()}") == set()


@pytest.mark.parametrize(
    ("node", "label"),
    [
        ("https://executor-b.example.com:8443/", "executor-b:8443"),
        ("http://10.0.0.7:8000", "10.0.0.7:8000"),
        ("https://[2001:db8::1]/te/", "2001:db8::1"),
        ("worker-3:/var/lib/term-executor", "worker-3:/v…erm-executor"),  # fleet.node without PUBLIC_URL
        ("box:/data", "box:/data"),
    ],
)
def test_node_labels_tell_hosts_apart(node, label):
    assert node_label(node) == label


def test_the_owner_column_shows_only_where_tenants_are(admin_client):
    make()
    html = admin_client.get(CHANGELIST).content.decode()
    assert "field-owner_text" not in html and "By owner" not in html


# -- detail --------------------------------------------------------------------------------------


def test_the_detail_shows_the_sandbox_and_its_execs_newest_last(admin_client):
    sandbox = make(
        SandboxStatus.STOPPED,
        owner="acme",
        network={"mode": "no-network", "allowed_hosts": []},
        egress=[
            {"step": "sandbox", "host": "pypi.org", "port": 443, "allowed": True, "reason": "allowed_hosts",
             "bytes_out": 512, "bytes_in": 40960, "count": 2},
            {"step": "sandbox", "host": "evil.example", "port": 80, "allowed": False, "reason": "not allowed",
             "bytes_out": 0, "bytes_in": 0, "count": 1},
        ],
        resources={"peak_memory_bytes": 3 * 2**20, "cpu_seconds": 1.5, "peak_processes": 4,
                   "peak_disk_bytes": 2**20, "peak_files": 12},
        exec_count=3,
    )  # fmt: skip
    # Written out of order (each exec's row is written by a thread of its own): shown by position.
    add_exec(sandbox, 3, ["python3", "-c", "import time; time.sleep(99)"], exit_code=124, timed_out=True,
             duration_ms=99000, user="nobody")  # fmt: skip
    add_exec(sandbox, 1, ["/bin/sh", "-c", "echo 'it''s' > /tmp/<out>"], user="")
    add_exec(sandbox, 2, ["make", "-j", "4", "all"], exit_code=137, oom_killed=True, cwd="/src", user="1000",
             service="api")  # fmt: skip
    html = detail(admin_client, sandbox)

    positions = re.findall(r'<td class="field-position">(\d+)</td>', html)
    assert positions == ["1", "2", "3"]
    commands = re.findall(r'<td class="field-command_text">(.*?)</td>', html, re.S)
    assert commands == [
        "<code>/bin/sh -c &#x27;echo &#x27;&quot;&#x27;&quot;&#x27;it&#x27;&quot;&#x27;&quot;&#x27;&#x27;&quot;&#x27;"
        "&quot;&#x27;s&#x27;&quot;&#x27;&quot;&#x27; &gt; /tmp/&lt;out&gt;&#x27;</code>",
        "<code>make -j 4 all</code>",
        "<code>python3 -c &#x27;import time; time.sleep(99)&#x27;</code>",
    ]

    def column(name: str) -> list[str]:
        return re.findall(rf'<td class="field-{name}">(.*?)</td>', html, re.S)

    assert column("service_text") == ["main", "api", "main"]  # blank: main's
    assert column("user_text") == ["default", "1000", "nobody"]
    assert column("cwd") == ["/app", "/src", "/app"]
    assert column("exit_code_text") == ["0", "137", "124"]
    assert column("timed_out_text") == ["no", "no", "yes"]
    assert column("oom_killed_text") == ["no", "yes", "no"]
    assert column("time_taken") == ["1.23 s", "1.23 s", "1 min 39 s"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", at) for at in column("started"))

    assert "3 recorded (below, newest last)" in html
    assert (
        f'image: python:3.12-slim<br>digest <code class="te-digest">{DIGEST}</code><br>cached: the image store had it'
    ) in html
    # The policy now (PUT /network changed it), and the one it was made with.
    assert "no-network <span class='te-note'>(made with allowlist: pypi.org)</span>" in html
    assert "<td>pypi.org</td>" not in html and "pypi.org:443" in html and "evil.example:80" in html
    assert "refused" in html and "40960" in html
    assert "peak memory 3.0 MiB, CPU 1.50 s, peak processes 4, peak disk 1.0 MiB, peak files 12" in html
    assert "&quot;GREETING&quot;: &quot;&lt;hello&gt;&quot;" in html  # the spec, escaped
    assert re.search(r'Error:</label>\s*<div class="readonly">none</div>', html)
    assert "acme" in html and here() in html
    assert 'name="_save"' not in html and "icon-yes.svg" not in html


def test_the_detail_says_what_a_failed_or_starting_one_lacks(admin_client):
    failed = make(
        SandboxStatus.FAILED,
        environment=None,
        ready_at=None,
        error="image: pull of python:3.12-slim failed: 404",
        error_kind="task_invalid",
    )
    html = detail(admin_client, failed)
    assert '<span class="te-kind">task_invalid</span> image: pull of python:3.12-slim failed: 404' in html
    assert "asked for image: python:3.12-slim; it never became ready" in html
    assert re.search(r'Execs:</label>\s*<div class="readonly">none</div>', html)
    assert re.search(r'Egress:</label>\s*<div class="readonly">none</div>', html)
    starting = make(SandboxStatus.STARTING)
    html = detail(admin_client, starting)
    assert "asked for image: python:3.12-slim; not ready yet (a pull or a build may be under way)" in html
    assert re.search(r'Egress:</label>\s*<div class="readonly">recorded when it ends</div>', html)
    assert re.search(r'Resources:</label>\s*<div class="readonly">recorded when it ends</div>', html)
    assert '<p class="te-none te-inline-empty">none</p>' in html  # no exec yet


def test_the_detail_shows_the_last_execs_and_links_every_one(admin_client):
    sandbox = make(exec_count=105)
    long_line = "echo " + "x" * 500
    first = add_exec(sandbox, 1, ["printf", "a\tb\nc"], user="nobody")
    for position in range(2, 106):
        command = ["/bin/sh", "-c", long_line if position == 105 else f"echo {position}"]
        add_exec(sandbox, position, command, service="db" if position == 3 else "")
    html = detail(admin_client, sandbox)
    positions = [int(p) for p in re.findall(r'<td class="field-position">(\d+)</td>', html)]
    assert positions == list(range(6, 106))
    assert "105 recorded (the last 100 below)" in html
    execs_url = f"{CHANGELIST}{sandbox.id}/execs/"
    assert f'<a href="{execs_url}">all of them as text</a>' in html
    clipped = re.findall(r'<td class="field-command_text">(.*?)</td>', html, re.S)[-1]
    assert "x" * 500 not in clipped and "…</code>" in clipped
    # The line is 518 characters (/bin/sh -c 'echo xxx...'): 239 and the ellipsis shown.
    assert f'(279 more characters: <a href="{execs_url}">all execs</a>)' in clipped

    whole = admin_client.get(execs_url)
    assert whole["Content-Type"] == "text/plain; charset=utf-8"
    lines = b"".join(whole.streaming_content).decode().splitlines()
    assert lines[0].split("\t") == [
        "position", "started_at", "service", "exit_code", "timed_out", "oom_killed", "duration_ms", "user", "cwd",
        "command",
    ]  # fmt: skip
    assert len(lines) == 106  # one exec a line: a newline or tab in a command is written \\n, \\t
    assert lines[1].split("\t") == ["1", fmt.when(first.started_at), "main", "0", "False", "False", "1234", "nobody",
                                    "/app", "printf 'a\\tb\\nc'"]  # fmt: skip
    assert lines[2].split("\t")[7] == "default"
    assert lines[3].split("\t")[2] == "db"  # a compose service's exec
    assert lines[-1].split("\t")[-1] == f"/bin/sh -c '{long_line}'"
    spec = admin_client.get(f"{CHANGELIST}{sandbox.id}/spec/")
    assert spec["Content-Type"] == "text/plain; charset=utf-8" and '"memory_mb": 1024' in spec.content.decode()


def test_a_missing_sandbox_is_404(admin_client):
    missing = uuid.uuid4()
    assert admin_client.get(f"{CHANGELIST}{missing}/change/").status_code == 404
    assert admin_client.get(f"{CHANGELIST}not-a-uuid/change/").status_code == 404
    assert admin_client.get(f"{CHANGELIST}{missing}/execs/").status_code == 404
    assert admin_client.get(f"{CHANGELIST}{missing}/spec/").status_code == 404


def test_nothing_is_added_changed_or_deleted_here(admin_client):
    sandbox = make()
    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403
    assert admin_client.post(f"{CHANGELIST}add/", {"node": "x", "status": "ready"}).status_code == 403
    assert admin_client.post(f"{CHANGELIST}{sandbox.id}/change/", {"status": "stopped"}).status_code == 403
    assert admin_client.post(f"{CHANGELIST}{sandbox.id}/delete/", {"post": "yes"}).status_code == 403
    act_delete = {"action": "delete_selected", "_selected_action": [str(sandbox.id)], "post": "yes"}
    admin_client.post(CHANGELIST, act_delete)
    sandbox.refresh_from_db()
    assert sandbox.status == "ready" and Sandbox.objects.count() == 1


def test_the_text_views_need_a_staff_login(client):
    sandbox = make()
    for view in ("execs/", "spec/", "change/"):
        reply = client.get(f"{CHANGELIST}{sandbox.id}/{view}")
        assert reply.status_code == 302 and "/admin/login/" in reply["Location"], view


# -- stop ----------------------------------------------------------------------------------------


def test_stop_leaves_an_ended_sandbox_as_it_is(admin_client):
    stopped = make(SandboxStatus.EXPIRED)
    before = Sandbox.objects.filter(id=stopped.id).values().get()
    page = act(admin_client, [stopped])
    assert "0 stopped, 1 had already ended." in page.content.decode()
    assert Sandbox.objects.filter(id=stopped.id).values().get() == before
    assert not LogEntry.objects.exists()


def test_stop_ends_live_ones_of_this_host_and_leaves_another_hosts(admin_client):
    starting = make(SandboxStatus.STARTING)
    # Ready, but no process answers for it on this host (it died): stopped here, as DELETE does.
    orphan = make(SandboxStatus.READY)
    elsewhere = make(SandboxStatus.READY, node="https://host-b.example.com", public_url="https://host-b.example.com")
    page = act(admin_client, [starting, orphan, elsewhere])
    html = page.content.decode()
    assert "2 stopped, 0 had already ended." in html
    assert (
        "1 live on another host, not stopped: stop them in that host&#x27;s admin, or with "
        "DELETE /sandboxes/{id} (redirected there): https://host-b.example.com."
    ) in html
    for sandbox in (starting, orphan, elsewhere):
        sandbox.refresh_from_db()
    assert (starting.status, orphan.status, elsewhere.status) == ("stopped", "stopped", "ready")
    assert starting.ended_at is not None and orphan.ended_at is not None and elsewhere.ended_at is None
    entries = {e.object_id: e for e in LogEntry.objects.all()}
    assert set(entries) == {str(starting.id), str(orphan.id)}
    assert entries[str(starting.id)].get_change_message() == "Stopped it (it was starting)."
    assert entries[str(orphan.id)].get_change_message() == "Stopped it (it was ready)."
    assert {(e.action_flag, e.user.username) for e in entries.values()} == {(CHANGE, "ops")}


def test_stop_from_the_detail_page_comes_back_to_it(admin_client):
    live = make(SandboxStatus.STARTING)
    assert ">Stop</button>" in detail(admin_client, live)
    page = admin_client.post(
        CHANGELIST, {"action": "stop_sandboxes", "_selected_action": [str(live.id)], "_from_detail": "1"}
    )
    assert page.status_code == 302 and page["Location"] == f"{CHANGELIST}{live.id}/change/"
    live.refresh_from_db()
    assert live.status == "stopped"
    assert ">Stop</button>" not in detail(admin_client, live)  # ended: nothing to stop


def test_view_only_staff_see_no_stop(client):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_sandbox"))
    client.login(username="viewer", password="pw")
    live = make(SandboxStatus.STARTING)
    page = client.get(CHANGELIST)
    assert page.status_code == 200 and "stop_sandboxes" not in page.content.decode()
    assert ">Stop</button>" not in detail(client, live)
    act(client, [live])
    live.refresh_from_db()
    assert live.status == "starting"


def test_stop_is_one_function_for_the_admin_and_the_api(api):
    """DELETE /sandboxes/{id} and the action both call api/sandboxes.stop: a starting one here is
    stopped, an ended one left, another host's redirected (the action leaves it)."""
    starting, ended = make(SandboxStatus.STARTING), make(SandboxStatus.STOPPED)
    elsewhere = make(node="https://host-b.example.com", public_url="https://host-b.example.com/")
    assert api.delete(f"/sandboxes/{starting.id}").status_code == 204
    before = Sandbox.objects.filter(id=ended.id).values().get()
    assert api.delete(f"/sandboxes/{ended.id}").status_code == 204
    assert Sandbox.objects.filter(id=ended.id).values().get() == before
    moved = api.delete(f"/sandboxes/{elsewhere.id}")
    assert moved.status_code == 307 and moved["Location"] == f"https://host-b.example.com/sandboxes/{elsewhere.id}"
    starting.refresh_from_db(), elsewhere.refresh_from_db()
    assert (starting.status, elsewhere.status) == ("stopped", "ready")


# -- the dashboard -------------------------------------------------------------------------------


def test_the_evaluations_dashboard_counts_live_sandboxes(admin_client):
    make(SandboxStatus.STARTING), make(SandboxStatus.READY), make(SandboxStatus.STOPPED), make(SandboxStatus.FAILED)
    Evaluation.objects.create(task_url="https://tasks.example.com/t.tgz", agent_code="print(1)")
    html = admin_client.get("/admin/evaluations/evaluation/").content.decode()
    assert (
        '<p id="dashboard-live-sandboxes" class="te-note">Live sandboxes (POST /sandboxes) now: '
        f'<a href="{CHANGELIST}?status__in=starting,ready">2</a></p>'
    ) in html
    index = admin_client.get("/admin/").content.decode()
    assert f'href="{CHANGELIST}"' in index and "Sandboxs" not in index
