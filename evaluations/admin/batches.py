"""Django admin for batches (SPEC §14, §17): listed with their reward, mean reward and pass@k, their tasks
and evaluations on their page; read-only.

Like the evaluation admin, nothing is edited by hand. The agent is shown as its size and
sha256, never its code or archive. The figures are the API's own (batches.py), so the admin
and GET /batches/{id} never disagree.
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from evaluations import representation
from evaluations.admin import format as fmt
from evaluations.admin.detail import OwnerColumn, OwnerFilter, ReadOnlyInline, detail_url
from evaluations.models import AgentArchive, Batch, Evaluation


class BatchEvaluationInline(ReadOnlyInline):
    model = Evaluation
    fk_name = "batch"
    fields = ("evaluation_link", "task", "attempt", "status", "passed_text", "reward_text", "error_kind_text")
    readonly_fields = fields
    ordering = ("created_at", "id")  # the queue's order: attempt 1 of every task, then attempt 2...
    verbose_name_plural = "evaluations"

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .only("id", "task_url", "attempt", "status", "passed", "reward", "error_kind", "batch_id")
        )

    @admin.display(description="evaluation")
    def evaluation_link(self, obj):
        return format_html('<a href="{}" title="{}">{}</a>', detail_url(obj.id), obj.id, fmt.short_id(obj.id))

    @admin.display(description="task")
    def task(self, obj):
        return format_html('<span title="{}">{}</span>', obj.task_url, fmt.task_label(obj.task_url))

    @admin.display(description="passed")
    def passed_text(self, obj):
        return fmt.yes_no(obj.passed)

    @admin.display(description="reward")
    def reward_text(self, obj):
        return fmt.figure(obj.reward)

    @admin.display(description="error kind")
    def error_kind_text(self, obj):
        return obj.error_kind or "-"  # the API's value, not its label


@admin.register(Batch)
class BatchAdmin(OwnerColumn, admin.ModelAdmin):
    list_display = (
        "short_id", "state", "attempts", "progress", "reward_text", "mean_reward_text", "pass_at_k_text", "owner_text",
        "created", "finished_time",
    )  # fmt: skip
    list_display_links = ("short_id",)
    list_filter = ("status", OwnerFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("id",)
    ordering = ("-created_at",)
    list_per_page = 50
    show_full_result_count = False
    inlines = [BatchEvaluationInline]
    actions = None
    fields = (
        "id", "owner", "state", "attempts", "progress", "reward_text", "mean_reward_text", "pass_at_k_text",
        "tasks_table", "created", "finished_time", "agent", "language", "timeout_secs", "env", "callback_url",
        "callback_state", "metadata", "idempotency_key",
    )  # fmt: skip
    readonly_fields = fields

    def get_queryset(self, request):
        # The counts in one query with the rows; the agent's code is never read for the list.
        return representation.batch_summaries(super().get_queryset(request))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # Django's read-only detail page for view permission

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return format_html('<span title="{}">{}</span>', obj.id, fmt.short_id(obj.id))

    @admin.display(description="status", ordering="status")
    def state(self, obj):
        return representation.batch_summary(obj)["status"]

    @admin.display(description="finished / total")
    def progress(self, obj):
        counts = f"{obj.passed_count} passed, {obj.failed} failed, {obj.cancelled} cancelled"
        return f"{obj.finished} / {obj.total} ({counts})"

    @admin.display(description="reward")
    def reward_text(self, obj):
        return fmt.figure(representation.batch_summary(obj)["reward"])

    @admin.display(description="mean reward")
    def mean_reward_text(self, obj):
        return fmt.figure(representation.batch_summary(obj)["mean_reward"])

    @admin.display(description="pass@k")
    def pass_at_k_text(self, obj):
        return fmt.figure(representation.batch_summary(obj)["pass_at_k"])

    @admin.display(description="tasks")
    def tasks_table(self, obj):
        """Per task URL, as GET /batches/{id}'s tasks: its attempts, passes, pass@k and mean reward."""
        tasks = representation.batch_tasks(representation.batch_evaluations(obj.id))
        body = format_html_join(
            "",
            '<tr><td><span title="{}">{}</span></td><td class="te-num">{}</td><td class="te-num">{}</td>'
            '<td class="te-num">{}</td><td class="te-num">{}</td></tr>',
            (
                (
                    t["task_url"],
                    fmt.task_label(t["task_url"]),
                    t["attempts"],
                    t["passes"],
                    fmt.figure(t["pass_at_k"]),
                    fmt.figure(t["mean_reward"]),
                )
                for t in tasks
            ),
        )
        return format_html(
            "<table><thead><tr><th>task</th><th>attempts</th><th>passes</th><th>pass@k</th><th>mean reward</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            body,
        )

    @admin.display(description="agent")
    def agent(self, obj):
        """Size and sha256 only: the code is the submitter's, not the operator's to read."""
        if obj.agent_archive_id:
            size = AgentArchive.objects.values_list("size", flat=True).get(sha256=obj.agent_archive_id)
            return f"archive, {fmt.size(size)}, sha256 {obj.agent_sha256}"
        code = Batch.objects.values_list("agent_code", flat=True).get(id=obj.id)  # deferred by the queryset
        size = len(code.encode("utf-8", errors="surrogatepass"))
        return f"one file, {fmt.size(size)}, sha256 {obj.agent_sha256}"

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return fmt.when(obj.created_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished_time(self, obj):
        return fmt.when(obj.finished_at) if obj.finished_at else "-"
