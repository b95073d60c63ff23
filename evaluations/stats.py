"""Figures read from the database, so every gunicorn worker reports the same ones."""

from __future__ import annotations

from django.db.models import Count, Q, Sum
from django.db.models.functions import Now
from django.utils import timezone

from evaluations.models import CacheUse, ErrorKind, Evaluation, PurgedTotals, Status, Transition, WorkerHeartbeat

# Seconds; the step histogram's upper bounds.
STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


COUNTED = ("total", "completed", "failed", "cancelled", "passed", "duration_ms_sum", "cache_hits", "cache_misses")


def evaluation_counts(include_purged: bool = True) -> dict[str, int]:
    """All the counts /status and /metrics need, in one query (plus purged rows' share)."""
    row = Evaluation.objects.aggregate(
        total=Count("id"),
        pending=Count("id", filter=Q(status=Status.PENDING)),
        running=Count("id", filter=Q(status=Status.RUNNING)),
        completed=Count("id", filter=Q(status=Status.COMPLETED)),
        failed=Count("id", filter=Q(status=Status.FAILED)),
        cancelled=Count("id", filter=Q(status=Status.CANCELLED)),
        passed=Count("id", filter=Q(passed=True)),
        duration_ms_sum=Sum("duration_ms"),
        cache_hits=Count("id", filter=Q(cache=CacheUse.HIT)),
        cache_misses=Count("id", filter=Q(cache=CacheUse.MISS)),
    )
    row["duration_ms_sum"] = row["duration_ms_sum"] or 0
    if include_purged:
        purged = PurgedTotals.objects.filter(id=1).values(*COUNTED).first()
        for key, value in (purged or {}).items():
            row[key] += value
    return row


# The label of evaluations that ended before error_kind existed (they have none).
UNKNOWN_KIND = "unknown"
NOT_PASSED = (Status.FAILED, Status.CANCELLED)


def error_kind_counts(include_purged: bool = True) -> dict[str, dict[str, int]]:
    """{status: {error_kind: count}} of the ended evaluations that did not pass (plus purged rows' share).

    Every ErrorKind is present for each of failed and cancelled (zero when none), so a counter
    exists before its first increment.
    """
    counts = {status: dict.fromkeys(ErrorKind.values, 0) for status in NOT_PASSED}
    rows = (
        Evaluation.objects.filter(status__in=NOT_PASSED)
        .values_list("status", "error_kind")
        .annotate(n=Count("id"))
        .order_by()
    )
    for status, kind, n in rows:
        by_kind = counts[status]
        by_kind[kind or UNKNOWN_KIND] = by_kind.get(kind or UNKNOWN_KIND, 0) + n
    if include_purged:
        purged = PurgedTotals.objects.filter(id=1).values_list("error_kinds", flat=True).first() or {}
        for status, by_kind in purged.items():
            for kind, n in by_kind.items():
                counts.setdefault(status, {})[kind] = counts.get(status, {}).get(kind, 0) + n
    return counts


def add_error_kinds(into: dict, more: dict) -> dict:
    """``into`` plus ``more``, both {status: {error_kind: count}} (PurgedTotals.error_kinds)."""
    merged = {status: dict(by_kind) for status, by_kind in into.items()}
    for status, by_kind in more.items():
        for kind, n in by_kind.items():
            merged.setdefault(status, {})[kind] = merged.get(status, {}).get(kind, 0) + n
    return merged


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
