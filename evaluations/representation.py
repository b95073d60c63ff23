"""The evaluation object of SPEC §2 and the batch object of SPEC §14, as the API, callbacks, the
admin and the CLI show them."""

from __future__ import annotations

from django.db.models import Count, Exists, OuterRef, Q

from evaluations.models import ACTIVE_STATUSES, Batch, Evaluation, Status

# The columns the evaluation object shows, for readers that fetch only those (evaluations/db/rows.py).
EVALUATION_COLUMNS = (
    "id", "status", "step", "passed", "error", "duration_ms", "task_url", "language", "agent_sha256", "metadata",
    "created_at",
    "started_at", "finished_at", "agent_output", "agent_exit_code", "agent_patch", "test_output", "results_sha256",
    "egress", "resources", "error_kind", "retry_of_id", "owner", "environment", "reward", "rewards", "task_format",
    "limits_applied", "task_metadata", "system_changes", "artifacts", "attempt", "batch_id",

    "cache",
)  # fmt: skip
TRANSITION_COLUMNS = ("step", "status", "at", "duration_ms")
TEST_RESULT_COLUMNS = ("name", "kind", "passed", "exit_code", "timed_out", "duration_ms", "output")


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def evaluation_json(evaluation: Evaluation) -> dict:
    return evaluation_document(evaluation, evaluation.transitions.all(), evaluation.test_results.all())


def evaluation_document(evaluation, transitions, test_results) -> dict:
    """The evaluation object from anything with the *_COLUMNS attributes: model instances or rows."""
    return {
        "eval_id": str(evaluation.id),
        "status": evaluation.status,
        "step": evaluation.step,
        "passed": evaluation.passed,
        "reward": evaluation.reward,
        "rewards": evaluation.rewards,
        "error": evaluation.error or None,
        "error_kind": evaluation.error_kind,
        "duration_ms": evaluation.duration_ms,
        "task_url": evaluation.task_url,
        "task_format": evaluation.task_format or None,
        "language": evaluation.language,
        "agent_sha256": evaluation.agent_sha256 or None,  # the agent itself is never returned
        "metadata": evaluation.metadata,
        "created_at": iso(evaluation.created_at),
        "started_at": iso(evaluation.started_at),
        "finished_at": iso(evaluation.finished_at),
        "test_results": [
            {
                "name": r.name,
                "kind": r.kind,
                "passed": r.passed,
                "exit_code": r.exit_code,
                "timed_out": r.timed_out,
                "duration_ms": r.duration_ms,
                "output": r.output,
            }
            for r in test_results
        ],
        "agent_output": evaluation.agent_output,
        "agent_exit_code": evaluation.agent_exit_code,
        "agent_patch": evaluation.agent_patch,
        "test_output": evaluation.test_output,
        "transitions": [
            {"step": t.step, "status": t.status, "at": iso(t.at), "duration_ms": t.duration_ms} for t in transitions
        ],
        "results_sha256": evaluation.results_sha256 or None,
        "egress": evaluation.egress or [],
        "resources": evaluation.resources,
        "cache": evaluation.cache or None,
        "environment": evaluation.environment,
        "limits_applied": evaluation.limits_applied,
        "task_metadata": evaluation.task_metadata,
        "system_changes": evaluation.system_changes,
        "artifacts": evaluation.artifacts or [],
        "batch_id": str(evaluation.batch_id) if evaluation.batch_id else None,
        "attempt": evaluation.attempt,
        "retry_of": str(evaluation.retry_of_id) if evaluation.retry_of_id else None,
        "owner": evaluation.owner,
    }


def evaluation_summary(evaluation: Evaluation) -> dict:
    """One row of GET /evaluations."""
    return {
        "eval_id": str(evaluation.id),
        "task_url": evaluation.task_url,
        "language": evaluation.language,
        "status": evaluation.status,
        "passed": evaluation.passed,
        "created_at": iso(evaluation.created_at),
        "owner": evaluation.owner,
    }


# -- the batch object ---------------------------------------------------------------------------


def _batch_status(batch: Batch, *, ended: bool, started: bool) -> str:
    """completed as soon as every evaluation ended: settle's finished_at follows a moment later."""
    if batch.cancel_requested:
        return Status.CANCELLED
    if batch.finished_at is not None:
        return batch.status
    if ended:
        return Status.COMPLETED
    return Status.RUNNING if started else Status.PENDING


BATCH_STATUSES = (Status.PENDING, Status.RUNNING, Status.COMPLETED, Status.CANCELLED)


def batches_with_status(queryset, status: str):
    """GET /batches?status=: the batches _batch_status shows as ``status``."""
    if status == Status.CANCELLED:
        return queryset.filter(cancel_requested=True)
    queryset = queryset.filter(cancel_requested=False)
    if status == Status.COMPLETED:
        return queryset.filter(finished_at__isnull=False)
    started = Evaluation.objects.filter(batch_id=OuterRef("pk")).exclude(status=Status.PENDING)
    queryset = queryset.filter(finished_at__isnull=True)
    return queryset.filter(Exists(started)) if status == Status.RUNNING else queryset.filter(~Exists(started))


def batch_summaries(queryset):
    """Batches with their counts, for GET /batches' rows (batch_summary): one query, no evaluation rows."""
    active = Q(evaluations__status__in=list(ACTIVE_STATUSES))
    return queryset.annotate(
        total=Count("evaluations"),
        finished=Count("evaluations", filter=~active),
        started=Count("evaluations", filter=~Q(evaluations__status=Status.PENDING)),
        passed_count=Count("evaluations", filter=Q(evaluations__passed=True)),
        failed=Count("evaluations", filter=Q(evaluations__status=Status.FAILED)),
        cancelled=Count("evaluations", filter=Q(evaluations__status=Status.CANCELLED)),
    ).defer("agent_code", "env", "metadata")


def batch_summary(batch) -> dict:
    """One row of GET /batches: the batch object without its evaluations (counts from summaries)."""
    return _batch_object(
        batch,
        total=batch.total,
        finished=batch.finished,
        started=batch.started,
        passed=batch.passed_count,
        failed=batch.failed,
        cancelled=batch.cancelled,
    )


def _batch_object(batch: Batch, *, total: int, finished: int, started: int, passed: int, failed: int, cancelled: int):
    """The batch object from its evaluations' counts: GET /batches' rows and GET /batches/{id} alike."""
    return {
        "batch_id": str(batch.id),
        "owner": batch.owner,
        "status": _batch_status(batch, ended=bool(total) and finished == total, started=bool(started)),
        "total": total,
        "finished": finished,
        "passed": passed,
        "failed": failed,
        "cancelled": cancelled,
        "reward": passed / total if total and finished == total else None,
        "created_at": iso(batch.created_at),
        "finished_at": iso(batch.finished_at),
    }


_BATCH_ROW = ("id", "task_url", "status", "passed", "error_kind", "created_at")


def batch_json(batch_id, among=Batch.objects) -> dict | None:
    """GET /batches/{id}'s body and the batch callback's; None for no such batch in ``among``
    (the API's: the batches the caller may see). A batch's evaluations are its owner's."""
    batch = among.filter(id=batch_id).first()
    if batch is None:
        return None
    evaluations = list(Evaluation.objects.filter(batch_id=batch.id).order_by("created_at", "id").only(*_BATCH_ROW))
    return batch_document(batch, evaluations)


def batch_document(batch: Batch, evaluations) -> dict:
    body = _batch_object(
        batch,
        total=len(evaluations),
        finished=sum(1 for e in evaluations if e.status not in ACTIVE_STATUSES),
        started=sum(1 for e in evaluations if e.status != Status.PENDING),
        passed=sum(1 for e in evaluations if e.passed),
        failed=sum(1 for e in evaluations if e.status == Status.FAILED),
        cancelled=sum(1 for e in evaluations if e.status == Status.CANCELLED),
    )
    body["evaluations"] = [
        {
            "eval_id": str(e.id),
            "task_url": e.task_url,
            "status": e.status,
            "passed": e.passed,
            "error_kind": e.error_kind,
        }
        for e in evaluations
    ]
    return body
