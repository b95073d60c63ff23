"""Django admin: operators see every evaluation, its steps, log, tests and callbacks, and steer them.

1. The detail page is read-only: nothing of an evaluation is edited by hand.
2. Two actions change state, and only through the API's own paths: cancel
   (lifecycle.cancel, as DELETE does) and re-run (admission.admit, as POST
   does: a new pending evaluation with the same request, refused at capacity).
   They need the change permission; view-only staff see no actions.
3. The changelist opens with the last 24 hours' counts by status.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import Avg, Count, Q
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from evaluations import admission, lifecycle, livelog, wakeup
from evaluations.models import (
    CallbackAttempt,
    Evaluation,
    Status,
    TestResult,
    Transition,
    WorkerHeartbeat,
)

LOG_TAIL_BYTES = 64 * 1024
# What POST /evaluate stored; a re-run submits the same.
REQUEST_FIELDS = (
    "agent_code",
    "language",
    "task_url",
    "timeout_secs",
    "env",
    "static_assets",
    "callback_url",
    "metadata",
)


def preformatted(text: str):
    return format_html('<pre style="white-space: pre-wrap; max-height: 40em; overflow: auto">{}</pre>', text or "")


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class TransitionInline(ReadOnlyInline):
    model = Transition
    fields = ("at", "step", "status", "duration_ms")
    readonly_fields = fields


class CallbackAttemptInline(ReadOnlyInline):
    model = CallbackAttempt
    fields = ("attempt", "at", "status_code", "error", "duration_ms")
    readonly_fields = fields
    verbose_name_plural = "callback attempts"


class TestResultInline(ReadOnlyInline):
    model = TestResult
    fields = ("position", "name", "kind", "passed", "exit_code", "timed_out", "duration_ms", "output_pre")
    readonly_fields = fields

    @admin.display(description="output")
    def output_pre(self, obj):
        return preformatted(obj.output)


@admin.register(Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "step", "passed", "language", "task_host", "created_at", "duration")
    list_filter = ("status", "step", "passed", "language", ("created_at", admin.DateFieldListFilter))
    search_fields = ("id", "task_url")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    list_per_page = 100
    show_full_result_count = False
    inlines = [TransitionInline, TestResultInline, CallbackAttemptInline]
    actions = ["cancel_evaluations", "rerun_evaluations"]
    change_list_template = "admin/evaluations/evaluation/change_list.html"
    fieldsets = (
        (None, {"fields": ("id", "status", "step", "passed", "error", "duration_ms", "results_sha256")}),
        ("Steps", {"fields": ("step_durations",)}),
        ("Network and resources", {"fields": ("egress_table", "resources_summary")}),
        ("Log", {"fields": ("live_log",)}),
        (
            "Request",
            {
                "fields": (
                    "task_url",
                    "language",
                    "timeout_secs",
                    "env",
                    "static_assets",
                    "callback_url",
                    "metadata",
                    "idempotency_key",
                    "agent_code_pre",
                )
            },
        ),
        (
            "Times",
            {"fields": ("created_at", "started_at", "finished_at", "worker_id", "cancel_requested", "cancel_reason")},
        ),
        ("Task", {"fields": ("task_prompt_pre", "original_pr_pre")}),
        ("Agent", {"fields": ("agent_exit_code", "agent_output_pre", "agent_patch_pre")}),
        ("Tests", {"fields": ("test_output_pre",)}),
    )

    def get_readonly_fields(self, request, obj=None):
        names = []
        for _, options in self.fieldsets:
            names.extend(options["fields"])
        return names

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        # Staff with view permission get Django's read-only detail page: nothing is saved from it.
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request):
        """Cancel and re-run: staff who may change evaluations (the detail page stays read-only)."""
        return request.user.has_perm("evaluations.change_evaluation")

    # -- actions -----------------------------------------------------------

    @admin.action(description="Cancel selected evaluations", permissions=["operate"])
    def cancel_evaluations(self, request, queryset):
        reason = f"cancelled by {request.user.get_username()} in the admin"
        outcomes = [lifecycle.cancel(eval_id, reason) for eval_id in queryset.values_list("id", flat=True)]
        if Status.RUNNING in outcomes:
            wakeup.notify(settings.EXECUTOR.data_dir)  # the worker forwards the cancel to the evaluation
        cancelled, asked = outcomes.count(Status.CANCELLED), outcomes.count(Status.RUNNING)
        ended = outcomes.count(None)
        self.message_user(
            request,
            f"{cancelled} cancelled, {asked} running asked to stop (within 2 s), {ended} had already ended.",
            messages.SUCCESS if cancelled or asked else messages.WARNING,
        )

    @admin.action(description="Re-run selected evaluations (new pending ones, same request)", permissions=["operate"])
    def rerun_evaluations(self, request, queryset):
        config = settings.EXECUTOR
        created = []
        for evaluation in queryset.order_by("created_at"):
            try:
                new, _ = admission.admit(
                    fields={name: getattr(evaluation, name) for name in REQUEST_FIELDS},
                    limit=config.admission_limit,
                    scope="admin",
                    key=None,
                    request_sha256=evaluation.request_sha256,
                    data_dir=config.data_dir,
                )
            except admission.AtCapacity:
                left = queryset.count() - len(created)
                self.message_user(
                    request,
                    f"At capacity ({config.admission_limit} pending or running): {left} not re-run; try again later.",
                    messages.ERROR,
                )
                break
            created.append(new)
        if created:
            links = format_html_join(
                ", ",
                '<a href="{}">{}</a>',
                ((reverse("admin:evaluations_evaluation_change", args=[e.id]), e.id) for e in created),
            )
            self.message_user(request, format_html("Re-run as {} new pending evaluation(s): {}", len(created), links))

    # -- dashboard -----------------------------------------------------------

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "dashboard": dashboard()}
        return super().changelist_view(request, extra_context=extra_context)

    # -- the raw log -----------------------------------------------------------

    def get_urls(self):
        log_view = self.admin_site.admin_view(self.log_view)
        return [path("<uuid:object_id>/log/", log_view, name="evaluations_evaluation_log"), *super().get_urls()]

    def log_view(self, request, object_id):
        """The whole log as text/plain (live while running), for a browser tab or curl with a session."""
        evaluation = get_object_or_404(Evaluation, id=object_id)
        if not self.has_view_permission(request, evaluation):
            return HttpResponse("forbidden", status=403, content_type="text/plain")
        chunk = livelog.read_log(evaluation, settings.EXECUTOR.workspace_base, 0, limit=64 * 1024 * 1024)
        response = HttpResponse(chunk.data, content_type="text/plain; charset=utf-8")
        response["X-Log-Complete"] = "true" if chunk.complete else "false"
        return response

    # -- detail page -----------------------------------------------------------

    @admin.display(description="egress")
    def egress_table(self, obj):
        """Every connection the evaluation's commands made through the proxy, refused ones too."""
        if not obj.egress:
            return "none"
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}:{}</td><td>{}</td><td>{}</td><td style='text-align:right'>{}</td>"
            "<td style='text-align:right'>{}</td><td style='text-align:right'>{}</td></tr>",
            (
                (
                    e["step"],
                    e["host"],
                    e["port"],
                    "allowed" if e["allowed"] else "refused",
                    e["reason"],
                    e["count"],
                    e["bytes_out"],
                    e["bytes_in"],
                )
                for e in obj.egress
            ),
        )
        return format_html(
            "<table><tr><th>step</th><th>destination</th><th></th><th>reason</th><th>connections</th>"
            "<th>bytes out</th><th>bytes in</th></tr>{}</table>",
            body,
        )

    @admin.display(description="resources")
    def resources_summary(self, obj):
        figures = obj.resources
        if not figures:
            return "-"
        return (
            f"peak memory {figures['peak_memory_bytes'] / 2**20:.1f} MiB, CPU {figures['cpu_seconds']:.2f} s, "
            f"peak processes {figures['peak_processes']}, peak disk {figures['peak_disk_bytes'] / 2**20:.1f} MiB"
        )

    @admin.display(description="time per step")
    def step_durations(self, obj):
        transitions = list(obj.transitions.all())
        if not transitions:
            return "-"
        now = timezone.now()
        rows = []
        for transition in transitions:
            ms = transition.duration_ms
            ongoing = ms is None and transition.status in (Status.PENDING, Status.RUNNING)
            if ongoing:
                ms = int((now - transition.at).total_seconds() * 1000)
            rows.append((transition, ms, ongoing))
        longest = max((ms or 0 for _, ms, _ in rows), default=0) or 1
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td style='text-align:right'>{}</td>"
            "<td><div style='background:#79aec8;height:0.8em;width:{}px'></div></td></tr>",
            (
                (
                    t.step,
                    t.status,
                    "" if ms is None else f"{ms / 1000:.2f} s" + (" so far" if ongoing else ""),
                    int(200 * (ms or 0) / longest),
                )
                for t, ms, ongoing in rows
            ),
        )
        return format_html(
            "<table><thead><tr><th>step</th><th>status</th><th>time</th><th></th></tr></thead><tbody>{}</tbody></table>",
            body,
        )

    @admin.display(description="log")
    def live_log(self, obj):
        text, skipped = livelog.log_tail(obj, settings.EXECUTOR.workspace_base, LOG_TAIL_BYTES)
        raw = reverse("admin:evaluations_evaluation_log", args=[obj.id])
        if obj.is_terminal:
            note = "Final log, rebuilt from the stored agent and test outputs."
        elif text:
            note = "Live: reload the page to follow it."
        else:
            note = "No live log here yet (not started, or the worker runs on another host)."
        if skipped:
            note += f" The first {skipped} bytes are not shown."
        return format_html('{} <a href="{}">Open the whole log</a>{}', note, raw, preformatted(text))

    @admin.display(description="task host")
    def task_host(self, obj):
        return urlsplit(obj.task_url).hostname or obj.task_url[:40]

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, obj):
        return "" if obj.duration_ms is None else f"{obj.duration_ms / 1000:.1f} s"

    @admin.display(description="agent code")
    def agent_code_pre(self, obj):
        return preformatted(obj.agent_code)

    @admin.display(description="prompt")
    def task_prompt_pre(self, obj):
        return preformatted(obj.task_prompt)

    @admin.display(description="original PR")
    def original_pr_pre(self, obj):
        return preformatted(obj.original_pr)

    @admin.display(description="agent output")
    def agent_output_pre(self, obj):
        return preformatted(obj.agent_output)

    @admin.display(description="agent patch")
    def agent_patch_pre(self, obj):
        return preformatted(obj.agent_patch)

    @admin.display(description="test output")
    def test_output_pre(self, obj):
        return preformatted(obj.test_output)


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("worker_id", "hostname", "pid", "capacity", "sandbox", "started_at", "last_beat_at", "stopping")
    readonly_fields = list_display

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def dashboard() -> dict:
    """The changelist header: the last 24 hours by status, and what runs now."""
    since = timezone.now() - timedelta(hours=24)
    recent = Evaluation.objects.filter(created_at__gte=since)
    figures = recent.aggregate(
        total=Count("id"),
        passed=Count("id", filter=Q(passed=True)),
        mean_ms=Avg("duration_ms", filter=Q(duration_ms__isnull=False)),
        **{status: Count("id", filter=Q(status=status)) for status in Status.values},
    )
    ended = figures[Status.COMPLETED] + figures[Status.FAILED] + figures[Status.CANCELLED]
    return {
        "since": since,
        "total": figures["total"],
        "counts": [(status, figures[status]) for status in Status.values],
        "pass_rate": f"{100 * figures['passed'] / ended:.0f} %" if ended else "-",
        "mean_duration": f"{figures['mean_ms'] / 1000:.1f} s" if figures["mean_ms"] else "-",
        "running_now": Evaluation.objects.filter(status=Status.RUNNING).count(),
        "pending_now": Evaluation.objects.filter(status=Status.PENDING).count(),
    }
