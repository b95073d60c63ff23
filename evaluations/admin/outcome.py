"""The evaluation detail page's SPEC §17 fields: its batch and attempt, its reward, the task's format and the
limits it was given, and what the agent left (changes outside its folder, artifacts).

The values come from the task (task.toml, reward.json) or the agent (paths, artifact names): each is
escaped, and each list is bounded (fmt.TABLE_ROWS rows, or a clipped <pre> within the page's budget)
with the whole a link away.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from evaluations.admin import format as fmt
from evaluations.admin.detail import whole_url

# The order limits_applied's keys are shown in; others (a later version's) follow, sorted.
LIMIT_KEYS = (
    "agent_timeout_secs", "verifier_timeout_secs", "build_timeout_secs", "cpus", "memory_mb", "storage_mb",
    "network", "allowed_hosts", "agent_network", "agent_network_mode", "agent_allowed_hosts",
    "verifier_network", "verifier_network_mode", "verifier_allowed_hosts",
)  # fmt: skip


def artifact_url(eval_id, path: str) -> str:
    """The admin's copy of GET /evaluate/{id}/artifacts/{path} (SPEC §17), served to a logged-in staff
    user without the API's token; the path's segments percent-encoded."""
    return reverse("admin:evaluations_evaluation_artifact", args=[eval_id, path])


def _pairs_table(pairs: list[tuple[str, object]], *, what: str):
    """A two-column table of at most fmt.TABLE_ROWS rows, saying how many more there are."""
    shown = pairs[: fmt.TABLE_ROWS]
    body = format_html_join("", "<tr><td>{}</td><td class='te-num'>{}</td></tr>", shown)
    more = len(pairs) - len(shown)
    note = format_html('<p class="te-note">and {} more {} (the API has them all)</p>', more, what) if more else ""
    return format_html("<table><tbody>{}</tbody></table>{}", body, note)


class OutcomeFields:
    """The EvaluationAdmin's SPEC §17 detail fields."""

    @admin.display(description="batch")
    def batch_attempt(self, obj):
        if obj.batch_id is None:
            return "none (a single evaluation)"
        url = reverse("admin:evaluations_batch_change", args=[obj.batch_id])
        return format_html(
            'attempt {} of {} in batch <a href="{}" title="{}">{}</a>',
            obj.attempt,
            obj.batch.attempts,
            url,
            obj.batch_id,
            fmt.short_id(obj.batch_id),
        )

    @admin.display(description="reward")
    def reward_text(self, obj):
        if obj.reward is None:
            return "none (nothing was graded)" if obj.is_terminal else "-"
        return fmt.figure(obj.reward)

    @admin.display(description="rewards")
    def rewards_table(self, obj):
        """The reward file's whole object, key by key (grader reward_file only)."""
        if not obj.rewards:
            return "none"
        return _pairs_table([(name, fmt.figure(value)) for name, value in obj.rewards.items()], what="keys")

    @admin.display(description="task format")
    def task_format_text(self, obj):
        return obj.task_format or "not recorded (the evaluation did not reach downloading_task)"

    @admin.display(description="limits applied")
    def limits_table(self, obj):
        """What the task asked for, capped by the operator's settings (the smaller wins)."""
        limits = obj.limits_applied
        if not limits:
            return "none (the operator's settings)"
        names = [name for name in LIMIT_KEYS if name in limits] + sorted(set(limits) - set(LIMIT_KEYS))
        shown = []
        for name in names:
            value = limits[name]
            shown.append((name, ", ".join(map(str, value)) if isinstance(value, list) else value))
        return _pairs_table(shown, what="limits")

    @admin.display(description="task metadata")
    def task_metadata_pre(self, obj):
        return fmt.clipped_pre(
            fmt.json_text(obj.task_metadata),
            fmt.TASK_METADATA_BYTES,
            keep="head",
            whole_url=whole_url(obj.id, "task_metadata"),
        )

    @admin.display(description="outside its folder")
    def system_changes_summary(self, obj):
        """What the agent created, changed or removed outside its working directory and /logs/agent;
        the ones the verifier may run (interpreters, site-packages, shells, its PATH) first, in red."""
        changes = obj.system_changes
        if changes is None:
            return "not recorded (not an image evaluation, or the agent did not run)"
        count, paths, suspicious = changes.get("count", 0), changes.get("paths", []), changes.get("suspicious", [])
        if not count:
            return "nothing: the agent changed no file outside its working directory and /logs/agent"
        whole = whole_url(obj.id, "system_changes")
        listed = f"the first {len(paths)}, sorted" if len(paths) < count else "sorted"
        parts = [format_html("{} files and folders created, changed or removed ({}):", count, listed)]
        if suspicious:
            parts.append(
                format_html(
                    '<p class="te-suspicious">{} suspicious: the verifier may run them (interpreters, '
                    "site-packages, shells, its PATH)</p>{}",
                    len(suspicious),
                    fmt.clipped_pre("\n".join(suspicious), fmt.SUSPICIOUS_PATHS_BYTES, keep="head", whole_url=whole),
                )
            )
        parts.append(fmt.clipped_pre("\n".join(paths), fmt.SYSTEM_PATHS_BYTES, keep="head", whole_url=whole))
        return format_html_join("", "{}", ((part,) for part in parts))

    @admin.display(description="artifacts")
    def artifacts_table(self, obj):
        """The files the agent left under /logs/agent that were kept, each a link to download it."""
        artifacts = obj.artifacts or []
        if not artifacts:
            return "none"
        shown = artifacts[: fmt.TABLE_ROWS]
        body = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td class="te-num">{}</td><td><code class="te-digest">{}</code></td></tr>',
            ((artifact_url(obj.id, a["path"]), a["path"], fmt.size(a["size_bytes"]), a["sha256"]) for a in shown),
        )
        total = fmt.size(sum(a["size_bytes"] for a in artifacts))
        more = len(artifacts) - len(shown)
        note = f"{len(artifacts)} files, {total}" + (
            f"; the first {len(shown)} shown (the API lists all)" if more else ""
        )
        return format_html(
            '<p class="te-note">{}</p><table><thead><tr><th>path</th>'
            "<th>size</th><th>sha256</th></tr></thead><tbody>{}</tbody></table>",
            note,
            body,
        )
