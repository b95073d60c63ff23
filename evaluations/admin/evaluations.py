"""Django admin: operators see every evaluation, its steps, log, tests and callbacks, and steer them.

1. The detail page is read-only: nothing of an evaluation is edited by hand.
2. Two actions change state, and only through the API's own paths: cancel
   (lifecycle.cancel, as DELETE does) and re-run (retry.retry, as
   POST /evaluate/{id}/retry does: a new pending evaluation with the same
   request, linked by ``retry_of``, refused at capacity). They need the change
   permission; view-only staff see no actions. Each is written to Django's
   admin log (History, Recent actions) with the user.
3. The changelist opens with the last 24 hours' figures (admin_dashboard.py).
   Batches have their own read-only list and page (admin_batches.py).
4. Pages stay fast with large outputs: the list never loads the output columns,
   and the detail page ships at most ~128 KiB of them (admin_format.py); the
   whole of each is a text/plain link away.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from evaluations import artifacts, lifecycle, livelog
from evaluations.admin import format as fmt
from evaluations.admin.dashboard import dashboard
from evaluations.admin.detail import (
    CallbackAttemptInline,
    DetailFields,
    OwnerColumn,
    OwnerFilter,
    ReadOnlyDetail,
    TestResultInline,
    TransitionInline,
    detail_url,
)
from evaluations.admin.outcome import OutcomeFields
from evaluations.api import admission
from evaluations.api.artifacts import artifact_response
from evaluations.api.retry import REQUEST_FIELDS, retry
from evaluations.models import (
    Evaluation,
    Status,
    TestResult,
    WorkerHeartbeat,
)
from evaluations.worker import wakeup

admin.site.site_header = "term-executor"
admin.site.site_title = "term-executor admin"
admin.site.site_url = "/api/docs"  # the header's "View site": the service has no other site
admin.site.enable_nav_sidebar = False  # three models: the sidebar cost the list a fifth of a 1400 px screen

# The columns the list reads, and no others: on SQLite, a column stored after the outputs costs
# a walk through their overflow pages (MiBs a row), so even those are left out.
LIST_COLUMNS = ("id", "status", "step", "passed", "error", "error_kind", "task_url", "language", "created_at",
                "started_at", "duration_ms", "owner")  # fmt: skip
# What "Open the whole text" serves for an evaluation, as text/plain (a JSON column indented).
# Never the agent's code (SPEC §14: size and hash only).
WHOLE_FIELDS = ("agent_output", "agent_patch", "test_output", "task_prompt", "original_pr")
WHOLE_JSON_FIELDS = ("task_metadata", "system_changes")


@admin.register(Evaluation)
class EvaluationAdmin(OwnerColumn, ReadOnlyDetail, DetailFields, OutcomeFields, admin.ModelAdmin):
    list_columns = LIST_COLUMNS
    list_display = (
        "short_id", "state", "passed_text", "task", "language", "error_text", "owner_text", "created_short", "time",
    )  # fmt: skip
    list_display_links = ("short_id",)
    list_filter = (
        "status", "error_kind", "step", "passed", "language", OwnerFilter, ("created_at", admin.DateFieldListFilter),
    )  # fmt: skip
    search_fields = ("id", "task_url")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)

    list_per_page = 50  # pages of 1 MiB outputs stay fast (bench/admin.py, bench/RESULTS.md)
    show_full_result_count = False
    inlines = [TransitionInline, TestResultInline, CallbackAttemptInline]
    actions = ["cancel_evaluations", "rerun_evaluations"]

    change_list_template = "admin/evaluations/evaluation/change_list.html"
    change_form_template = "admin/evaluations/evaluation/change_form.html"
    fieldsets = (
        (
            None,
            {"fields": ("id", "status", "step", "passed_text", "error_text_full", "time", "reruns", "batch_attempt")},
        ),
        ("Reward", {"fields": ("reward_text", "rewards_table")}),
        ("Steps", {"fields": ("step_durations",)}),
        ("Environment", {"fields": ("environment_summary",)}),
        ("Task format and limits", {"fields": ("task_format_text", "limits_table", "task_metadata_pre")}),
        ("Network and resources", {"fields": ("egress_table", "resources_summary")}),
        ("What the agent left", {"fields": ("system_changes_summary", "artifacts_table")}),
        ("Log", {"fields": ("log_box",)}),
        (
            "Request",
            {
                "fields": (
                    "owner",
                    "task_url",
                    "language",
                    "timeout_secs",
                    "env",
                    "static_assets",
                    "callback_url",
                    "metadata",
                    "idempotency_key",
                    "agent_summary",
                )
            },
        ),
        (
            "Times",
            {
                "fields": (
                    "created",
                    "started",
                    "finished",
                    "worker_id",
                    "cancel_requested_text",
                    "cancel_reason",
                )
            },
        ),
        ("Task", {"fields": ("task_prompt_pre", "original_pr_pre")}),
        ("Agent", {"fields": ("agent_exit_code", "agent_output_pre", "agent_patch_pre", "test_output_link")}),
    )

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
        outcomes = []
        for evaluation in queryset.only("id", "status"):
            outcome = lifecycle.cancel(evaluation.id, reason)
            outcomes.append(outcome)
            if outcome == Status.CANCELLED:
                self.log_change(request, evaluation, "Cancelled it (it was pending).")
            elif outcome == Status.RUNNING:
                self.log_change(request, evaluation, "Asked it to stop (it was running).")
        if Status.RUNNING in outcomes:
            wakeup.notify(settings.EXECUTOR.data_dir)  # the worker forwards the cancel to the evaluation
        cancelled, asked = outcomes.count(Status.CANCELLED), outcomes.count(Status.RUNNING)
        ended = outcomes.count(None)
        self.message_user(
            request,
            f"{cancelled} cancelled, {asked} running asked to stop (within 2 s), {ended} had already ended.",
            messages.SUCCESS if cancelled or asked else messages.WARNING,
        )
        return self._back_to_detail(request)

    @admin.action(description="Re-run selected evaluations (new pending ones, same request)", permissions=["operate"])
    def rerun_evaluations(self, request, queryset):
        config = settings.EXECUTOR
        created = []
        for evaluation in queryset.only("id", "request_sha256", "owner", *REQUEST_FIELDS).order_by("created_at"):
            try:
                new = retry(evaluation, config=config, scope="admin")
            except admission.AtCapacity:
                left = queryset.count() - len(created)
                self.message_user(
                    request,
                    f"At capacity ({config.admission_limit} pending or running): {left} not re-run; try again later.",
                    messages.ERROR,
                )
                break
            self.log_addition(request, new, f"Re-run of {evaluation.id}.")
            self.log_change(request, evaluation, f"Re-run as {new.id}.")
            created.append(new)
        if created:
            links = format_html_join(
                ", ", '<a href="{}">{}</a>', ((detail_url(e.id), fmt.short_id(e.id)) for e in created)
            )
            self.message_user(request, format_html("Re-run as {} new pending evaluation(s): {}", len(created), links))
            if len(created) == 1 and request.POST.get("_from_detail"):
                return HttpResponseRedirect(detail_url(created[0].id))
        return self._back_to_detail(request)

    def _back_to_detail(self, request):
        """A button of the detail page brings the operator back to that page."""
        selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
        if request.POST.get("_from_detail") and len(selected) == 1:
            return HttpResponseRedirect(detail_url(selected[0]))
        return None

    # -- pages -----------------------------------------------------------

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "dashboard": dashboard()}
        return super().changelist_view(request, extra_context=extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "can_operate": self.has_operate_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context=extra_context)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<uuid:object_id>/log/", view(self.log_view), name="evaluations_evaluation_log"),
            path("<uuid:object_id>/whole/<str:field>/", view(self.whole_view), name="evaluations_evaluation_whole"),
            path(
                "<uuid:object_id>/artifact/<path:path>",
                view(self.artifact_view),
                name="evaluations_evaluation_artifact",
            ),
            path(
                "<uuid:object_id>/test/<int:position>/",
                view(self.test_output_view),
                name="evaluations_evaluation_test_output",
            ),
            *super().get_urls(),
        ]

    def _viewable(self, request, object_id, *fields) -> Evaluation:
        evaluation = get_object_or_404(Evaluation.objects.only("id", "status", *fields), id=object_id)
        if not self.has_view_permission(request, evaluation):
            raise PermissionError
        return evaluation

    def log_view(self, request, object_id):
        """The whole log as text/plain (live while running), for a browser tab or curl with a session."""
        try:
            evaluation = self._viewable(request, object_id)
        except PermissionError:
            return forbidden()
        chunk = livelog.read_log(evaluation, settings.EXECUTOR.workspace_base, 0, limit=64 * 1024 * 1024)
        response = text_response(chunk.data)
        response["X-Log-Complete"] = "true" if chunk.complete else "false"
        return response

    def whole_view(self, request, object_id, field):
        if field not in WHOLE_FIELDS + WHOLE_JSON_FIELDS:
            return HttpResponse("no such field", status=404, content_type="text/plain")
        try:
            evaluation = self._viewable(request, object_id, field)
        except PermissionError:
            return forbidden()
        value = getattr(evaluation, field)
        return text_response(fmt.json_text(value) if field in WHOLE_JSON_FIELDS else value)

    def artifact_view(self, request, object_id, path):
        """One kept artifact, as GET /evaluate/{id}/artifacts/{path} serves it (an attachment, never
        rendered), to staff with the view permission: the API's route needs its token, a browser has none.
        Only a path the evaluation lists; a name no listed path can have (a control character, ``..``)
        is 400, one the route never matches (a newline) 404."""
        try:
            evaluation = self._viewable(request, object_id, "artifacts")
        except PermissionError:
            return forbidden()
        try:
            return artifact_response(request, evaluation.id, evaluation.artifacts, path)
        except artifacts.UnsafeName as exc:
            return HttpResponse(f"not a safe artifact name: {exc}", status=400, content_type="text/plain")
        except artifacts.NotListed as exc:
            return HttpResponse(str(exc), status=404, content_type="text/plain")
        except FileNotFoundError:
            message = f"artifact {path} of evaluation {evaluation.id} is no longer stored"
            return HttpResponse(message, status=404, content_type="text/plain")

    def test_output_view(self, request, object_id, position):
        try:
            self._viewable(request, object_id)
        except PermissionError:
            return forbidden()
        result = get_object_or_404(TestResult.objects.only("output"), evaluation_id=object_id, position=position)
        return text_response(result.output)

    # -- list columns -----------------------------------------------------------

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return format_html('<span title="{}">{}</span>', obj.id, fmt.short_id(obj.id))

    @admin.display(description="status", ordering="status")
    def state(self, obj):
        """The status, and the step while it runs: an ended one's step is always "done"."""
        if obj.status == Status.RUNNING:
            return f"running: {obj.step}"
        return obj.status

    @admin.display(description="passed", ordering="passed")
    def passed_text(self, obj):
        if not obj.is_terminal:
            return "pending"
        return fmt.yes_no(obj.passed)

    @admin.display(description="task", ordering="task_url")
    def task(self, obj):
        return format_html('<span title="{}">{}</span>', obj.task_url, fmt.task_label(obj.task_url))

    @admin.display(description="error")
    def error_text(self, obj):
        kind = obj.error_kind
        sentence = fmt.truncate(obj.error, fmt.ERROR_CHARS) if obj.error else ""
        if not kind and not sentence:
            return ""
        badge = format_html('<span class="te-kind">{}</span> ', kind) if kind else ""
        return format_html('{}<span title="{}">{}</span>', badge, obj.error, sentence)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return fmt.when(obj.created_at)

    @admin.display(description=f"created ({settings.TIME_ZONE})", ordering="created_at")
    def created_short(self, obj):
        return fmt.when(obj.created_at, zone=False)

    @admin.display(description="time", ordering="duration_ms")
    def time(self, obj):
        if obj.status == Status.RUNNING and obj.started_at:
            elapsed = int((timezone.now() - obj.started_at).total_seconds() * 1000)
            return f"{fmt.seconds(elapsed)} so far"
        if obj.status == Status.PENDING:
            return "queued"
        return fmt.seconds(obj.duration_ms)


def text_response(content) -> HttpResponse:
    return HttpResponse(content, content_type="text/plain; charset=utf-8")


def forbidden() -> HttpResponse:
    return HttpResponse("forbidden", status=403, content_type="text/plain")


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    """The workers' heartbeats, read-only: a row goes when its worker stops, not by hand."""

    list_display = ("worker_id", "hostname", "pid", "capacity", "sandbox", "state", "started", "last_beat")
    fields = list_display
    readonly_fields = list_display
    actions = None

    def get_queryset(self, request):
        # Judged by the database's clock, as the reaper judges it (hosts' clocks may differ).
        cutoff = Now() - timezone.timedelta(seconds=settings.EXECUTOR.worker_stale_secs)
        alive = ExpressionWrapper(Q(last_beat_at__gte=cutoff), output_field=BooleanField())
        return super().get_queryset(request).annotate(alive=alive)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="state", ordering="last_beat_at")
    def state(self, obj):
        stale_secs = settings.EXECUTOR.worker_stale_secs
        if not obj.alive:
            return format_html('<span class="te-stale">stale</span> (silent over {} s)', stale_secs)
        return "alive, stopping" if obj.stopping else "alive"

    @admin.display(description="started", ordering="started_at")
    def started(self, obj):
        return fmt.when(obj.started_at)

    @admin.display(description="last beat", ordering="last_beat_at")
    def last_beat(self, obj):
        return fmt.when(obj.last_beat_at)
