"""Django admin for live sandboxes (SPEC §24): each sandbox, and each exec it ran, read-only.

1. The rows are the API's: nothing is added, edited or deleted here. One action changes state,
   "Stop selected sandboxes", through the API's own ``stop`` (api/sandboxes.py, as
   DELETE /sandboxes/{id}): a live sandbox of this host is stopped; one living on another host of
   the fleet is left to that host (only it reaches the sandbox's process), and the message says so.
   The action needs the change permission; each stop is written to Django's admin log with the user.
2. The list never reads the egress or the resources; the environment column is the one the
   sandbox runs in once ready, else the one its spec asked for; ready and ended are the time
   after its creation (the moment in the tooltip, and on the detail page to the second).
3. The detail page shows the spec, environment, network, egress, resources and error, and the last
   EXEC_ROWS execs inline, newest last, each command one shell-quoted line clipped at
   COMMAND_CHARS; every exec, whole, is one text/plain link away, as is the spec. An exec's output
   is the caller's alone (it is not kept), so none is shown.
"""

from __future__ import annotations

import ipaddress
import shlex
import uuid
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib import admin, messages
from django.http import Http404, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from evaluations.admin import format as fmt
from evaluations.admin.detail import DetailFields, OwnerColumn, OwnerFilter, ReadOnlyDetail, ReadOnlyInline
from evaluations.admin.evaluations import forbidden
from evaluations.api import sandboxes as api
from evaluations.models import Sandbox, SandboxExec, SandboxStatus
from evaluations.tasks.compose import MAIN

EXEC_ROWS = 100  # the last execs on the page; all of them in the text/plain list
COMMAND_CHARS = 240  # a command's shell line in the inline; the whole in the list
SPEC_BYTES = 8 * fmt.KIB  # its env may be long; the whole is a link away
LIST_COLUMNS = ("id", "status", "owner", "spec", "environment", "node", "created_at", "ready_at", "ended_at",
                "exec_count", "error", "error_kind")  # fmt: skip
TIME_FIELDS = ("created", "ready", "last_active", "expires", "ended", "idle_timeout_secs", "max_lifetime_secs")
ENVIRONMENT_CHARS = 32
ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})  # one exec a line in the text list
NODE_CHARS = 24


def detail_url(sandbox_id) -> str:
    return reverse("admin:evaluations_sandbox_change", args=[sandbox_id])


def command_line(argv) -> str:
    """The argv as one line a shell reads back to the same argv (``sh -c 'cd /app && make'``)."""
    if isinstance(argv, list) and all(isinstance(item, str) for item in argv):
        return shlex.join(argv)
    return str(argv)  # a row written by hand: shown as it is


def environment_ref(obj: Sandbox) -> tuple[str, str]:
    """(kind, ref): what it runs in once ready, else what its spec asked for."""
    env = obj.environment or {}
    if env.get("kind"):
        return env["kind"], env.get("ref") or ""
    asked = {k: v for k, v in ((obj.spec or {}).get("environment") or {}).items() if k != "build_args"}
    kind, ref = next(iter(asked.items()), ("", ""))
    return kind, str(ref)


def node_label(node: str) -> str:
    """A PUBLIC_URL as its host's first name and its port (what tells a fleet's hosts apart),
    else host:DATA_DIR (fleet.node), cut in the middle."""
    parts = urlsplit(node)
    label = node
    if parts.scheme in ("http", "https") and parts.hostname:
        name = parts.hostname if _is_address(parts.hostname) else parts.hostname.split(".")[0]
        label = f"{name}:{parts.port}" if parts.port else name
    return fmt.truncate(label, NODE_CHARS, middle=True)


class SandboxExecInline(ReadOnlyInline):
    model = SandboxExec
    fields = (
        "position", "service_text", "command_text", "user_text", "cwd", "exit_code_text", "timed_out_text",
        "oom_killed_text", "time_taken", "started",
    )  # fmt: skip
    readonly_fields = fields
    ordering = ("position",)  # newest last: the page reads as the session went
    verbose_name_plural = "execs"

    def get_queryset(self, request):
        """The last EXEC_ROWS of the sandbox the page shows (its id is the page's URL's)."""
        queryset = super().get_queryset(request)
        match = request.resolver_match
        try:
            sandbox_id = uuid.UUID(str(match.kwargs["object_id"]))
        except (AttributeError, KeyError, ValueError):
            return queryset
        newest = queryset.filter(sandbox_id=sandbox_id).order_by("-position").values_list("position", flat=True)
        first = next(iter(newest[EXEC_ROWS - 1 : EXEC_ROWS]), None)
        return queryset if first is None else queryset.filter(position__gte=first)

    @admin.display(description="command")
    def command_text(self, obj):
        line = command_line(obj.command)
        shown = fmt.truncate(line, COMMAND_CHARS)
        if shown == line:
            return format_html("<code>{}</code>", line)
        return format_html(
            '<code>{}</code> <span class="te-note">({} more characters: <a href="{}">all execs</a>)</span>',
            shown,
            len(line) - len(shown) + 1,  # the ellipsis stands for them
            reverse("admin:evaluations_sandbox_execs", args=[obj.sandbox_id]),
        )

    @admin.display(description="service")
    def service_text(self, obj):
        return obj.service or MAIN

    @admin.display(description="user")
    def user_text(self, obj):
        return obj.user or "default"

    @admin.display(description="exit code")
    def exit_code_text(self, obj):
        return "-" if obj.exit_code is None else obj.exit_code

    @admin.display(description="timed out")
    def timed_out_text(self, obj):
        return fmt.yes_no(obj.timed_out)

    @admin.display(description="OOM killed")
    def oom_killed_text(self, obj):
        return fmt.yes_no(obj.oom_killed)

    @admin.display(description="time")
    def time_taken(self, obj):
        return fmt.seconds(obj.duration_ms)

    @admin.display(description="started")
    def started(self, obj):
        return fmt.when(obj.started_at)


@admin.register(Sandbox)
class SandboxAdmin(OwnerColumn, ReadOnlyDetail, admin.ModelAdmin):
    list_columns = LIST_COLUMNS
    list_display = (
        "short_id", "state", "owner_text", "environment_text", "node_text", "created_short", "ready_after",
        "ended_after", "execs", "error_kind_text",
    )  # fmt: skip
    list_display_links = ("short_id",)
    list_filter = ("status", "error_kind", OwnerFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("id",)
    ordering = ("-created_at",)
    list_per_page = 50
    show_full_result_count = False
    inlines = [SandboxExecInline]
    actions = ["stop_sandboxes"]

    change_list_template = "admin/evaluations/sandbox/change_list.html"
    change_form_template = "admin/evaluations/sandbox/change_form.html"
    fieldsets = (
        (None, {"fields": ("id", "state", "error_text", "owner", "execs_summary")}),
        ("Environment", {"fields": ("environment_summary",)}),
        ("Network and resources", {"fields": ("network_text", "egress_text", "resources_text")}),
        ("Spec", {"fields": ("spec_pre",)}),
        ("Times", {"fields": TIME_FIELDS}),
        ("Host", {"fields": ("node", "public_url", "worker_id")}),
    )

    def get_object(self, request, object_id, from_field=None):
        """404 for a sandbox that is not there (Django's default sends the operator to the index)."""
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            raise Http404(f"no sandbox {object_id}")
        return obj

    def has_add_permission(self, request):
        return False  # POST /sandboxes makes them

    def has_change_permission(self, request, obj=None):
        return False  # Django's read-only detail page for view permission

    def has_delete_permission(self, request, obj=None):
        return False  # a row is the record of a sandbox, kept after it ends

    def has_operate_permission(self, request):
        """Stop: staff who may change sandboxes (the detail page stays read-only)."""
        return request.user.has_perm("evaluations.change_sandbox")

    # -- the action -----------------------------------------------------------------------------

    @admin.action(description="Stop selected sandboxes", permissions=["operate"])
    def stop_sandboxes(self, request, queryset):
        """Each live one of this host stopped as DELETE stops it (this request waits for each
        sandbox's teardown); another host's named, not touched."""
        stopped, ended, elsewhere = 0, 0, []
        for row in queryset.only("id", "status", "node", "public_url").order_by("created_at"):
            try:
                if api.stop(row):
                    stopped += 1
                    self.log_change(request, row, f"Stopped it (it was {row.status}).")
                else:
                    ended += 1
            except api.NotHere:
                elsewhere.append(row)
        self.message_user(
            request,
            f"{stopped} stopped, {ended} had already ended.",
            messages.SUCCESS if stopped else messages.WARNING,
        )
        if elsewhere:
            hosts = sorted({row.public_url or row.node for row in elsewhere})
            self.message_user(
                request,
                f"{len(elsewhere)} live on another host, not stopped: stop them in that host's admin, or with "
                f"DELETE /sandboxes/{{id}} (redirected there): {', '.join(hosts)}.",
                messages.WARNING,
            )
        selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
        if request.POST.get("_from_detail") and len(selected) == 1:
            return HttpResponseRedirect(detail_url(selected[0]))
        return None

    # -- pages ----------------------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "can_operate": self.has_operate_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context=extra_context)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<uuid:object_id>/execs/", view(self.execs_view), name="evaluations_sandbox_execs"),
            path("<uuid:object_id>/spec/", view(self.spec_view), name="evaluations_sandbox_spec"),
            *super().get_urls(),
        ]

    def _viewable(self, request, object_id, *fields) -> Sandbox | None:
        row = get_object_or_404(Sandbox.objects.only("id", *fields), id=object_id)
        return row if self.has_view_permission(request, row) else None

    def execs_view(self, request, object_id):
        """Every exec of the sandbox as text/plain, one a line, tab-separated, oldest first; the
        command last, a newline, return or tab in it written as \\n, \\r, \\t."""
        row = self._viewable(request, object_id)
        if row is None:
            return forbidden()
        columns = (
            "position", "started_at", "service", "exit_code", "timed_out", "oom_killed", "duration_ms", "user", "cwd",
        )  # fmt: skip

        def lines():
            yield "\t".join((*columns, "command")) + "\n"
            for record in SandboxExec.objects.filter(sandbox_id=row.id).order_by("position").iterator():
                values = [record.position, fmt.when(record.started_at), record.service or MAIN, record.exit_code,
                          record.timed_out, record.oom_killed, record.duration_ms, record.user or "default",
                          record.cwd]  # fmt: skip
                values = ["-" if value is None else str(value) for value in values]
                yield "\t".join([*values, command_line(record.command).translate(ESCAPES)]) + "\n"

        return StreamingHttpResponse(lines(), content_type="text/plain; charset=utf-8")

    def spec_view(self, request, object_id):
        row = self._viewable(request, object_id, "spec")
        if row is None:
            return forbidden()
        return HttpResponse(fmt.json_text(row.spec), content_type="text/plain; charset=utf-8")

    # -- list columns ---------------------------------------------------------------------------

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return format_html('<span title="{}">{}</span>', obj.id, fmt.short_id(obj.id))

    @admin.display(description="status", ordering="status")
    def state(self, obj):
        return obj.status  # the API's value, not its label

    @admin.display(description="environment")
    def environment_text(self, obj):
        kind, ref = environment_ref(obj)
        if not kind:
            return "-"
        label = fmt.task_label(ref) if kind == "task_url" else fmt.truncate(ref, ENVIRONMENT_CHARS, middle=True)
        return format_html('<span title="{}: {}">{}</span>', kind, ref, label)

    @admin.display(description="node", ordering="node")
    def node_text(self, obj):
        return format_html('<span title="{}">{}</span>', obj.node, node_label(obj.node))

    @admin.display(description=f"created ({settings.TIME_ZONE})", ordering="created_at")
    def created_short(self, obj):
        return fmt.when(obj.created_at, zone=False)

    @admin.display(description="ready after", ordering="ready_at")
    def ready_after(self, obj):
        return _after(obj.created_at, obj.ready_at)

    @admin.display(description="ended after", ordering="ended_at")
    def ended_after(self, obj):
        return _after(obj.created_at, obj.ended_at)

    @admin.display(description="execs", ordering="exec_count")
    def execs(self, obj):
        return obj.exec_count

    @admin.display(description="error kind", ordering="error_kind")
    def error_kind_text(self, obj):
        if not obj.error_kind:
            return ""
        return format_html('<span class="te-kind" title="{}">{}</span>', obj.error, obj.error_kind)

    # -- detail fields --------------------------------------------------------------------------

    @admin.display(description="error")
    def error_text(self, obj):
        if not obj.error and not obj.error_kind:
            return "none"
        badge = format_html('<span class="te-kind">{}</span> ', obj.error_kind) if obj.error_kind else ""
        return format_html("{}{}", badge, obj.error)

    @admin.display(description="execs")
    def execs_summary(self, obj):
        count = obj.execs.count()
        if not count:
            return "none"
        shown = f"the last {EXEC_ROWS} below" if count > EXEC_ROWS else "below, newest last"
        url = reverse("admin:evaluations_sandbox_execs", args=[obj.id])
        return format_html('{} recorded ({}); <a href="{}">all of them as text</a>', count, shown, url)

    @admin.display(description="environment")
    def environment_summary(self, obj):
        """What its commands run in, as its process recorded it once ready: kind, reference, the
        image's digest, and whether the image store had it."""
        env = obj.environment
        if not env:
            kind, ref = environment_ref(obj)
            asked = format_html("{}: {}", kind, ref) if kind else "-"
            if obj.status == SandboxStatus.STARTING:
                return format_html("asked for {}; not ready yet (a pull or a build may be under way)", asked)
            return format_html("asked for {}; it never became ready", asked)
        cached = (
            "cached: the image store had it" if env.get("cached") else "not cached: pulled or built for this sandbox"
        )
        return format_html(
            '{}: {}<br>digest <code class="te-digest">{}</code><br>{}',
            env.get("kind"),
            env.get("ref") or "-",
            env.get("digest") or "-",
            cached,
        )

    @admin.display(description="network")
    def network_text(self, obj):
        """The egress policy now (PUT /network changes it), and the one asked for at creation when it differs."""
        now = obj.network or (obj.spec or {}).get("network") or {}
        asked = (obj.spec or {}).get("network") or {}
        text = _network_words(now)
        if asked and asked != now:
            return format_html("{} <span class='te-note'>(made with {})</span>", text, _network_words(asked))
        return text

    @admin.display(description="egress")
    def egress_text(self, obj):
        if obj.is_live:
            return "recorded when it ends"
        return DetailFields.egress_table(self, obj)

    @admin.display(description="resources")
    def resources_text(self, obj):
        if obj.is_live:
            return "recorded when it ends"
        return DetailFields.resources_summary(self, obj)

    @admin.display(description="spec (the POST /sandboxes body, as checked)")
    def spec_pre(self, obj):
        url = reverse("admin:evaluations_sandbox_spec", args=[obj.id])
        return fmt.clipped_pre(fmt.json_text(obj.spec), SPEC_BYTES, keep="head", whole_url=url)

    @admin.display(description="created")
    def created(self, obj):
        return fmt.when(obj.created_at)

    @admin.display(description="ready")
    def ready(self, obj):
        return fmt.when(obj.ready_at)

    @admin.display(description="last active")
    def last_active(self, obj):
        return fmt.when(obj.last_active_at)

    @admin.display(description="expires")
    def expires(self, obj):
        return fmt.when(obj.expires_at)

    @admin.display(description="ended")
    def ended(self, obj):
        return fmt.when(obj.ended_at)


def _after(start, end):
    """How long after ``start`` (its creation) ``end`` came, the moment itself in the title: three
    timestamps would not fit the list at 1400 px beside its filters."""
    if end is None:
        return "-"
    ms = max(0, int((end - start).total_seconds() * 1000))
    return format_html('<span title="{}">{}</span>', fmt.when(end), fmt.seconds(ms))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _network_words(network: dict) -> str:
    mode = network.get("mode") or "-"
    hosts = network.get("allowed_hosts") or []
    if mode != "allowlist":
        return mode
    return f"allowlist: {', '.join(hosts)}" if hosts else "allowlist: no host (nothing is reachable)"
