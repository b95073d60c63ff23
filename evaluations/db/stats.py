"""Figures read from the database, so every gunicorn worker reports the same ones.

The counters include the share of purged evaluations (PurgedTotals), which the reaper adds
here (add_to_purged_totals) before it deletes them.
"""

from __future__ import annotations

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from evaluations.models import (
    CacheUse,
    ErrorKind,
    Evaluation,
    PurgedTotals,
    Sandbox,
    SandboxStatus,
    Status,
    Transition,
    WorkerHeartbeat,
)

# Seconds; the step histogram's upper bounds.
STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def _counted() -> dict:
    """The figures PurgedTotals keeps, as aggregates over evaluations (one query)."""
    return {
        "total": Count("id"),
        "completed": Count("id", filter=Q(status=Status.COMPLETED)),
        "failed": Count("id", filter=Q(status=Status.FAILED)),
        "cancelled": Count("id", filter=Q(status=Status.CANCELLED)),
        "passed": Count("id", filter=Q(passed=True)),
        "duration_ms_sum": Sum("duration_ms"),
        "cache_hits": Count("id", filter=Q(cache=CacheUse.HIT)),
        "cache_misses": Count("id", filter=Q(cache=CacheUse.MISS)),
    }


COUNTED = tuple(_counted())

# The label of evaluations that ended before error_kind existed (they have none).
UNKNOWN_KIND = "unknown"
NOT_PASSED = (Status.FAILED, Status.CANCELLED)


def _error_kinds(evaluations) -> dict[str, dict[str, int]]:
    """{status: {error_kind: count}} of the ones among ``evaluations`` that ended without passing."""
    by_kind: dict[str, dict[str, int]] = {}
    rows = evaluations.filter(status__in=NOT_PASSED).values_list("status", "error_kind").annotate(n=Count("id"))
    for status, kind, n in rows.order_by():
        counts = by_kind.setdefault(status, {})
        counts[kind or UNKNOWN_KIND] = counts.get(kind or UNKNOWN_KIND, 0) + n
    return by_kind


def add_error_kinds(into: dict, more: dict) -> dict:
    """``into`` plus ``more``, both {status: {error_kind: count}} (PurgedTotals.error_kinds)."""
    merged = {status: dict(by_kind) for status, by_kind in into.items()}
    for status, by_kind in more.items():
        for kind, n in by_kind.items():
            merged.setdefault(status, {})[kind] = merged.get(status, {}).get(kind, 0) + n
    return merged


def add_to_purged_totals(evaluations) -> None:
    """Add what ``evaluations`` count to PurgedTotals, before the caller deletes them in its transaction.

    The one place purged counters are summed: the figures are evaluation_counts' and
    error_kind_counts', from the same aggregates, so /metrics' counters never go down.
    """
    figures = evaluations.aggregate(**_counted())
    by_kind = _error_kinds(evaluations)
    PurgedTotals.objects.get_or_create(id=1)
    PurgedTotals.objects.filter(id=1).update(**{k: F(k) + (v or 0) for k, v in figures.items()})
    # The UPDATE above holds the row (the write lock on SQLite): read, add and write the JSON under it.
    totals = PurgedTotals.objects.select_for_update().get(id=1)
    totals.error_kinds = add_error_kinds(totals.error_kinds, by_kind)
    totals.save(update_fields=["error_kinds"])


def evaluation_counts(include_purged: bool = True) -> dict[str, int]:
    """All the counts /status and /metrics need, in one query (plus purged rows' share)."""
    row = Evaluation.objects.aggregate(
        pending=Count("id", filter=Q(status=Status.PENDING)),
        running=Count("id", filter=Q(status=Status.RUNNING)),
        **_counted(),
    )
    row["duration_ms_sum"] = row["duration_ms_sum"] or 0
    if include_purged:
        purged = PurgedTotals.objects.filter(id=1).values(*COUNTED).first()
        for key, value in (purged or {}).items():
            row[key] += value
    return row


def error_kind_counts(include_purged: bool = True) -> dict[str, dict[str, int]]:
    """{status: {error_kind: count}} of the ended evaluations that did not pass (plus purged rows' share).

    Every ErrorKind is present for each of failed and cancelled (zero when none), so a counter
    exists before its first increment.
    """
    counts = {status: dict.fromkeys(ErrorKind.values, 0) for status in NOT_PASSED}
    counts = add_error_kinds(counts, _error_kinds(Evaluation.objects.all()))
    if include_purged:
        purged = PurgedTotals.objects.filter(id=1).values_list("error_kinds", flat=True).first() or {}
        counts = add_error_kinds(counts, purged)
    return counts


def step_histograms() -> dict[str, dict]:
    """{step: {"count", "sum_seconds", "buckets": [(le, cumulative count), ...]}}."""
    aggregates = {"count": Count("id"), "sum_ms": Sum("duration_ms")}
    for index, bound in enumerate(STEP_BUCKETS):
        aggregates[f"le_{index}"] = Count("id", filter=Q(duration_ms__lte=int(bound * 1000)))
    rows = Transition.objects.filter(duration_ms__isnull=False).values("step").annotate(**aggregates).order_by("step")
    result = {}
    for row in rows:
        result[row["step"]] = {
            "count": row["count"],
            "sum_seconds": (row["sum_ms"] or 0) / 1000,
            "buckets": [(bound, row[f"le_{i}"]) for i, bound in enumerate(STEP_BUCKETS)],
        }
    return result


def live_workers(stale_secs: int) -> list[WorkerHeartbeat]:
    """Workers that beat within `stale_secs`, judged by the database's clock (hosts' clocks may differ)."""
    cutoff = Now() - timezone.timedelta(seconds=stale_secs)
    return list(WorkerHeartbeat.objects.filter(last_beat_at__gte=cutoff))


def sandbox_counts() -> dict:
    """Live sandboxes by status, and how many were made and how many execs they ran (SPEC §24), in one query."""
    row = Sandbox.objects.aggregate(
        made=Count("id"),
        execs=Coalesce(Sum("exec_count"), 0),
        **{status: Count("id", filter=Q(status=status)) for status in SandboxStatus.values},
    )
    return row
