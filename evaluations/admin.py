"""Django admin: operators see every evaluation, its transitions and test results, read-only."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.contrib import admin
from django.utils.html import format_html

from evaluations.models import Evaluation, TestResult, Transition, WorkerHeartbeat


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
    inlines = [TransitionInline, TestResultInline]
    fieldsets = (
        (None, {"fields": ("id", "status", "step", "passed", "error", "duration_ms", "results_sha256")}),
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
