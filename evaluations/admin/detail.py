"""The evaluation detail page's read-only fields and inlines, and the pieces the evaluation and batch
admins share (the admin itself is evaluations/admin.py).

Each shows a value as an operator reads it: yes/no rather than icons, times to the
second, "none" when empty, and at most its share of ~128 KiB of output (admin_format.py).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from evaluations import livelog
from evaluations.admin import format as fmt
from evaluations.models import AgentArchive, CallbackAttempt, Status, TestResult, Token, Transition

LOG_SOURCES = {
    livelog.LIVE: "Live, from the session's log file: reload the page to follow it.",
    livelog.STORED: "The log as it was written while the evaluation ran, stored when it ended.",
    livelog.REBUILT: "Rebuilt from the stored agent and test outputs (no log was kept: the evaluation "
    "ended before its first step, or its process died).",
    livelog.NONE: "No log on this host yet (not started, or the worker runs on another host).",
}


def detail_url(eval_id) -> str:
    return reverse("admin:evaluations_evaluation_change", args=[eval_id])


def whole_url(eval_id, field: str) -> str:
    return reverse("admin:evaluations_evaluation_whole", args=[eval_id, field])


def tenant_names() -> list[str]:
    """The tenants AUTH_TOKENS and the Token rows name, sorted; empty on a single-tenant executor."""
    stored = Token.objects.values_list("name", flat=True).distinct()
    return sorted({name for name, _token in settings.EXECUTOR.tenant_tokens} | set(stored))


class OwnerFilter(admin.SimpleListFilter):
    """Filter a list by owner: the tenants AUTH_TOKENS and the Token rows name, and "operator" for rows
    no tenant owns.

    From the configuration, not a SELECT DISTINCT over the table (Django's default for a text
    column), which would read every row at each load of the list. A tenant since removed from
    AUTH_TOKENS is still found by ?owner=<name> in the address.
    """

    title = "owner"
    parameter_name = "owner"
    OPERATOR = "(operator)"  # no tenant name holds parentheses

    def lookups(self, request, model_admin):
        return [(self.OPERATOR, "operator (no tenant)"), *((name, name) for name in tenant_names())]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(owner=None) if value == self.OPERATOR else queryset.filter(owner=value)


class OwnerColumn:
    """A list's owner column and filter (``owner_text``, ``OwnerFilter``), the evaluations' and the
    batches' alike: shown only where a tenant is configured. Every owner is null otherwise, and the
    column would only cost the width a 1024 px screen lacks."""

    @admin.display(description="owner", ordering="owner")
    def owner_text(self, obj):
        return fmt.owner(obj.owner)

    def get_list_display(self, request):
        return self._without_owner(super().get_list_display(request))

    def get_list_filter(self, request):
        return self._without_owner(super().get_list_filter(request))

    @staticmethod
    def _without_owner(fields) -> tuple:
        if tenant_names():
            return tuple(fields)
        return tuple(f for f in fields if f not in ("owner_text", OwnerFilter))


class ReadOnlyDetail:
    """A detail page of read-only fieldsets, and a list that reads only ``list_columns`` (its
    large text and JSON columns are read by the detail page alone)."""

    list_columns: tuple[str, ...] = ()

    def get_readonly_fields(self, request, obj=None):
        return [name for _, options in self.fieldsets for name in options["fields"]]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        match = request.resolver_match
        opts = self.model._meta
        if match is not None and match.url_name == f"{opts.app_label}_{opts.model_name}_changelist":
            queryset = queryset.only(*self.list_columns)
        return queryset


class ReadOnlyInline(admin.TabularInline):
    """A plain table: no per-row caption (the object's str), "none" when empty."""

    template = "admin/evaluations/readonly_tabular.html"
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class TransitionInline(ReadOnlyInline):
    model = Transition
    fields = ("at_time", "step", "status", "time_spent")
    readonly_fields = fields

    @admin.display(description="at")
    def at_time(self, obj):
        return fmt.when(obj.at)

    @admin.display(description="time spent")
    def time_spent(self, obj):
        return fmt.seconds(obj.duration_ms)


class CallbackAttemptInline(ReadOnlyInline):
    model = CallbackAttempt
    fields = ("attempt", "at_time", "status_code", "error", "time_taken")
    readonly_fields = fields
    verbose_name_plural = "callback attempts"

    @admin.display(description="at")
    def at_time(self, obj):
        return fmt.when(obj.at)

    @admin.display(description="time taken")
    def time_taken(self, obj):
        return fmt.seconds(obj.duration_ms)


class TestResultInline(ReadOnlyInline):
    model = TestResult
    fields = ("position", "name", "kind", "passed_text", "exit_code", "timed_out_text", "time_taken", "output_pre")
    readonly_fields = fields

    def get_formset(self, request, obj=None, **kwargs):
        # Each test's share of the inline budget: a thousand tests must not ship a thousand tails.
        count = obj.test_results.count() if obj is not None else 0
        self.per_test_bytes = max(fmt.TEST_OUTPUT_MIN_BYTES, fmt.TEST_OUTPUTS_BYTES // max(1, count))
        return super().get_formset(request, obj, **kwargs)

    @admin.display(description="passed")
    def passed_text(self, obj):
        return fmt.yes_no(obj.passed)

    @admin.display(description="timed out")
    def timed_out_text(self, obj):
        return fmt.yes_no(obj.timed_out)

    @admin.display(description="time")
    def time_taken(self, obj):
        return fmt.seconds(obj.duration_ms)

    @admin.display(description="output (its end)")
    def output_pre(self, obj):
        url = reverse("admin:evaluations_evaluation_test_output", args=[obj.evaluation_id, obj.position])
        return fmt.clipped_pre(obj.output, getattr(self, "per_test_bytes", 4096), keep="tail", whole_url=url)


class DetailFields:
    """The EvaluationAdmin's detail fields."""

    @admin.display(description="error")
    def error_text_full(self, obj):
        kind = obj.error_kind
        if not obj.error and not kind:
            return "none"
        badge = format_html('<span class="te-kind">{}</span> ', kind) if kind else ""
        return format_html("{}{}", badge, obj.error or "")

    @admin.display(description="re-runs")
    def reruns(self, obj):
        parts = []
        if obj.retry_of_id:
            parts.append(format_html('re-run of <a href="{}">{}</a>', detail_url(obj.retry_of_id), obj.retry_of_id))
        later = list(obj.retries.order_by("created_at").values_list("id", flat=True)[:20])
        if later:
            links = format_html_join(", ", '<a href="{}">{}</a>', ((detail_url(i), fmt.short_id(i)) for i in later))
            parts.append(format_html("re-run as {}", links))
        return format_html_join("; ", "{}", ((p,) for p in parts)) if parts else "none"

    @admin.display(description="started")
    def started(self, obj):
        return fmt.when(obj.started_at)

    @admin.display(description="finished")
    def finished(self, obj):
        return fmt.when(obj.finished_at)

    @admin.display(description="cancel requested")
    def cancel_requested_text(self, obj):
        return fmt.yes_no(obj.cancel_requested)

    @admin.display(description="time per step")
    def step_durations(self, obj):
        transitions = list(obj.transitions.all())
        if not transitions:
            return "none"
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
            "<tr><td>{}</td><td>{}</td><td class='te-num'>{}</td>"
            "<td><div class='te-bar' style='width:{}px'></div></td></tr>",
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

    @admin.display(description="egress")
    def egress_table(self, obj):
        """Every connection the evaluation's commands made through the proxy, refused ones too."""
        if not obj.egress:
            return "none"
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}:{}</td><td>{}</td><td>{}</td><td class='te-num'>{}</td>"
            "<td class='te-num'>{}</td><td class='te-num'>{}</td></tr>",
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
            "<table><thead><tr><th>step</th><th>destination</th><th></th><th>reason</th><th>connections</th>"
            "<th>bytes out</th><th>bytes in</th></tr></thead><tbody>{}</tbody></table>",
            body,
        )

    @admin.display(description="environment")
    def environment_summary(self, obj):
        """What the task's commands ran in (SPEC §16), as preparing_environment recorded it: its kind,
        name or image reference, the image's digest, and whether the store had it already."""
        env = obj.environment
        if not env:
            return "not recorded (the evaluation did not reach preparing_environment)"
        kind = env.get("kind")
        if kind == "host":
            return "host: the executor's own system folders"
        if kind == "name":
            return format_html("name: {} (under ENVIRONMENTS_ROOT)", env.get("ref"))
        made = "pulled" if kind == "image" else "built"
        cached = "cached: the image store had it, nothing was " + made if env.get("cached") else f"{made} now"
        return format_html(
            '{}: {}<br>digest <code class="te-digest">{}</code><br>{}',
            kind,
            env.get("ref") or "-",
            env.get("digest") or "-",
            cached,
        )

    @admin.display(description="resources")
    def resources_summary(self, obj):
        figures = obj.resources
        if not figures:
            return "none"
        files = f", peak files {figures['peak_files']}" if "peak_files" in figures else ""  # older rows lack it
        return (
            f"peak memory {figures['peak_memory_bytes'] / 2**20:.1f} MiB, CPU {figures['cpu_seconds']:.2f} s, "
            f"peak processes {figures['peak_processes']}, peak disk {figures['peak_disk_bytes'] / 2**20:.1f} MiB"
            f"{files}"
        )

    @admin.display(description="log")
    def log_box(self, obj):
        """The log's tail, the executor's lines set apart from the commands' output (log_lines)."""
        text, skipped, source = livelog.log_tail(obj, settings.EXECUTOR.workspace_base, fmt.LOG_TAIL_BYTES)
        note = LOG_SOURCES[source]
        if skipped:
            note += f" The first {fmt.size(skipped)} are not shown here."
        raw = reverse("admin:evaluations_evaluation_log", args=[obj.id])
        return format_html(
            '<p class="te-note" id="te-log-source" data-source="{}">{} <a href="{}">Open the whole log</a></p>{}',
            source,
            note,
            raw,
            fmt.preformatted(log_lines(text), css_class="te-pre te-tail te-log", element_id="te-log"),
        )

    @admin.display(description="agent")
    def agent_summary(self, obj):
        """Its size and hash only (SPEC §14): the admin never shows an agent's code."""
        if obj.agent_archive_id:
            size = AgentArchive.objects.filter(pk=obj.agent_archive_id).values_list("size", flat=True).first()
            return format_html(
                "project archive, {}, entry point <code>{}</code><br>sha256 <code>{}</code>",
                fmt.size(size or 0),
                obj.agent_entrypoint or "by language",
                obj.agent_sha256,
            )
        return format_html(
            "one file, {}<br>sha256 <code>{}</code>",
            fmt.size(len(obj.agent_code.encode("utf-8", errors="surrogatepass"))),
            obj.agent_sha256 or "not recorded",
        )

    @admin.display(description="prompt")
    def task_prompt_pre(self, obj):
        return fmt.clipped_pre(
            obj.task_prompt, fmt.PROMPT_BYTES, keep="head", whole_url=whole_url(obj.id, "task_prompt")
        )

    @admin.display(description="original PR")
    def original_pr_pre(self, obj):
        return fmt.clipped_pre(
            obj.original_pr, fmt.ORIGINAL_PR_BYTES, keep="head", whole_url=whole_url(obj.id, "original_pr")
        )

    @admin.display(description="agent output (its end)")
    def agent_output_pre(self, obj):
        return fmt.clipped_pre(
            obj.agent_output, fmt.AGENT_OUTPUT_BYTES, keep="tail", whole_url=whole_url(obj.id, "agent_output")
        )

    @admin.display(description="agent patch")
    def agent_patch_pre(self, obj):
        return fmt.clipped_pre(
            obj.agent_patch, fmt.PATCH_BYTES, keep="head", whole_url=whole_url(obj.id, "agent_patch")
        )

    @admin.display(description="test output")
    def test_output_link(self, obj):
        if not obj.test_output:
            return "none"
        size = fmt.size(len(obj.test_output.encode("utf-8", errors="replace")))
        return format_html(
            'Each test\'s output is under Test results below and in the log. <a href="{}">Open all of it</a> ({}).',
            whole_url(obj.id, "test_output"),
            size,
        )


def log_lines(text: str):
    """The log as HTML: each of the executor's lines (livelog.is_executor_line: its first character,
    which no command's output carries) in a ``te-exec`` span; every other line, whatever it says,
    plain escaped text."""
    return format_html_join(
        "\n",
        "{}",
        (
            (format_html('<span class="te-exec">{}</span>', line) if livelog.is_executor_line(line) else line,)
            for line in text.split("\n")
        ),
    )
