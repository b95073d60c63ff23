"""The figures heading the evaluations list: the last 24 hours, what runs now, in what sandbox, and how
many live sandboxes (SPEC §24) there are."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Avg, Count, Q
from django.utils import timezone

from evaluations import checks
from evaluations.admin import format as fmt
from evaluations.db import stats
from evaluations.models import ACTIVE_STATUSES, LIVE_SANDBOX_STATUSES, Evaluation, Sandbox, Status

ENDED = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)


def dashboard() -> dict:
    """1. The pass rate is completed / (completed + failed): a cancel says nothing of the agent.
    2. The mean duration is of completed and failed ones: a cancel's time is whoever cancelled.
    3. Running and pending are counted once, now, whenever they were created.
    4. The sandbox in words, as /status says it (checks.sandbox_state); flagged when agent code
       runs unsandboxed.
    5. The live sandboxes (starting or ready) of every host, now: each is a uid and a root held.
    """
    since = timezone.now() - timedelta(hours=24)
    judged = Q(status__in=[Status.COMPLETED, Status.FAILED])
    recent = Evaluation.objects.filter(created_at__gte=since).aggregate(
        total=Count("id"),
        mean_ms=Avg("duration_ms", filter=judged & Q(duration_ms__isnull=False)),
        **{status: Count("id", filter=Q(status=status)) for status in ENDED},
    )
    now = Evaluation.objects.filter(status__in=ACTIVE_STATUSES).aggregate(
        **{status: Count("id", filter=Q(status=status)) for status in ACTIVE_STATUSES}
    )
    completed, failed = recent[Status.COMPLETED], recent[Status.FAILED]
    sandbox = checks.sandbox_state(stats.live_workers(settings.EXECUTOR.worker_stale_secs))
    return {
        "since": since,
        "total": recent["total"],
        "ended": [(status, recent[status]) for status in ENDED],
        "pass_rate": f"{100 * completed / (completed + failed):.0f} %" if completed + failed else "-",
        "pass_rate_of": f"{completed} of {completed + failed}",
        "mean_duration": fmt.seconds(round(recent["mean_ms"])) if recent["mean_ms"] is not None else "-",
        "running_now": now[Status.RUNNING],
        "pending_now": now[Status.PENDING],
        "sandbox": sandbox.words,
        "sandboxed": sandbox.mode == "bwrap",
        "live_sandboxes": Sandbox.objects.filter(status__in=LIVE_SANDBOX_STATUSES).count(),
        "live_sandbox_statuses": ",".join(LIVE_SANDBOX_STATUSES),
    }
