"""The evaluation object of SPEC §2 and the batch object of SPEC §14, as the API, callbacks, the
admin and the CLI show them."""

from __future__ import annotations

import hashlib

from django.db.models import Count, Exists, OuterRef, Q, Sum, Value
from django.db.models.functions import Coalesce

from evaluations import signing
from evaluations.models import ACTIVE_STATUSES, Batch, Evaluation, Status

# The columns the evaluation object shows, for readers that fetch only those (evaluations/db/rows.py).
EVALUATION_COLUMNS = (
    "id", "status", "step", "passed", "error", "duration_ms", "task_url", "language", "agent_sha256", "metadata",
    "created_at",
    "started_at", "finished_at", "agent_output", "agent_exit_code", "agent_patch", "test_output", "results_sha256",
    "egress", "resources", "error_kind", "retry_of_id", "owner", "environment", "reward", "rewards", "task_format",
    "limits_applied", "task_metadata", "system_changes", "artifacts", "attempt", "batch_id", "test_counts",
    "task_sha256", "executor_version", "signature",
    "cache",
)  # fmt: skip
TRANSITION_COLUMNS = ("step", "status", "at", "duration_ms")
TEST_RESULT_COLUMNS = ("name", "kind", "passed", "exit_code", "timed_out", "duration_ms", "output")


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def evaluation_json(evaluation: Evaluation) -> dict:
    return evaluation_document(evaluation, evaluation.transitions.all(), evaluation.test_results.all())


def evaluation_document(evaluation, transitions, test_results) -> dict:
    """The evaluation object from anything with the *_COLUMNS attributes: model instances or rows.

    SPEC §18: an ended evaluation's ``signature`` is the one lifecycle.finish stored; one that ended
    without (before signatures, or finish's own first read) is signed here, not stored: Ed25519
    signatures are deterministic, so each read gives the same value while the row and key stay.
    """
    body = {
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
        "task_sha256": evaluation.task_sha256 or None,
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
        "agent_patch_sha256": _sha256(evaluation.agent_patch),
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
        "test_counts": evaluation.test_counts,
        "artifacts": evaluation.artifacts or [],
        "batch_id": str(evaluation.batch_id) if evaluation.batch_id else None,
        "attempt": evaluation.attempt,
        "retry_of": str(evaluation.retry_of_id) if evaluation.retry_of_id else None,
        "owner": evaluation.owner,
        "executor_version": evaluation.executor_version or None,
        "signature": evaluation.signature,
    }
    if body["signature"] is None and evaluation.status not in ACTIVE_STATUSES:
        body["signature"] = signing.sign_if_possible(body, signing.EVALUATION_FIELDS)
    return body


def _sha256(text: str | None) -> str | None:
    """Of the text's UTF-8 (surrogates as they are: an agent's output may hold any bytes); null when empty."""
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest() if text else None


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
        reward_sum=Sum(Coalesce("evaluations__reward", Value(0.0))),
        task_count=Count("evaluations__task_url", distinct=True),
        tasks_passed=Count("evaluations__task_url", distinct=True, filter=Q(evaluations__passed=True)),
    ).defer("agent_code", "env", "metadata")


def batch_summary(batch) -> dict:
    """One row of GET /batches: the batch object without its evaluations and tasks (counts from summaries)."""
    return _batch_object(
        batch,
        total=batch.total,
        finished=batch.finished,
        started=batch.started,
        passed=batch.passed_count,
        failed=batch.failed,
        cancelled=batch.cancelled,
        reward_sum=batch.reward_sum or 0.0,
        tasks=batch.task_count,
        tasks_passed=batch.tasks_passed,
    )


def _batch_object(
    batch: Batch,
    *,
    total: int,
    finished: int,
    started: int,
    passed: int,
    failed: int,
    cancelled: int,
    reward_sum: float,
    tasks: int,
    tasks_passed: int,
):
    """The batch object from its evaluations' counts: GET /batches' rows and GET /batches/{id} alike.

    SPEC §17: ``mean_reward`` is the mean of the evaluations' rewards, an evaluation with none
    (it failed before its tests were graded, or was cancelled) counting 0, as ``reward`` counts it
    as not passed; ``pass_at_k`` the share of task URLs one of whose attempts passed. Like
    ``reward``, both are null until every evaluation ended.
    """
    ended = bool(total) and finished == total
    return {
        "batch_id": str(batch.id),
        "owner": batch.owner,
        "status": _batch_status(batch, ended=ended, started=bool(started)),
        "attempts": batch.attempts,
        "total": total,
        "finished": finished,
        "passed": passed,
        "failed": failed,
        "cancelled": cancelled,
        "reward": passed / total if ended else None,
        "mean_reward": reward_sum / total if ended else None,
        "pass_at_k": tasks_passed / tasks if ended and tasks else None,
        "agent_sha256": batch.agent_sha256 or None,
        "created_at": iso(batch.created_at),
        "finished_at": iso(batch.finished_at),
        "executor_version": batch.executor_version or None,
    }


_BATCH_ROW = ("id", "task_url", "attempt", "status", "passed", "reward", "error_kind", "created_at")


def batch_json(batch_id, among=Batch.objects) -> dict | None:
    """GET /batches/{id}'s body and the batch callback's; None for no such batch in ``among``
    (the API's: the batches the caller may see). A batch's evaluations are its owner's."""
    batch = among.filter(id=batch_id).first()
    if batch is None:
        return None
    return batch_document(batch, batch_evaluations(batch.id))


def batch_evaluations(batch_id) -> list[Evaluation]:
    """A batch's evaluations in queue order, with the columns the batch object reads."""
    return list(Evaluation.objects.filter(batch_id=batch_id).order_by("created_at", "id").only(*_BATCH_ROW))


def batch_tasks(evaluations) -> list[dict]:
    """SPEC §17: one entry per task URL, in the order its first attempt queued.

    ``passes`` counts as it goes (as the batch's ``passed``); ``pass_at_k`` (1.0 if an attempt
    passed, else 0.0) and ``mean_reward`` (a null reward counting 0) are null until every
    attempt of that task ended.
    """
    by_task: dict[str, list] = {}
    for e in evaluations:
        by_task.setdefault(e.task_url, []).append(e)
    tasks = []
    for task_url, runs in by_task.items():
        passes = sum(1 for e in runs if e.passed)
        ended = all(e.status not in ACTIVE_STATUSES for e in runs)
        tasks.append(
            {
                "task_url": task_url,
                "attempts": len(runs),
                "passes": passes,
                "pass_at_k": (1.0 if passes else 0.0) if ended else None,
                "mean_reward": sum(e.reward or 0.0 for e in runs) / len(runs) if ended else None,
            }
        )
    return tasks


def batch_document(batch: Batch, evaluations) -> dict:
    tasks = batch_tasks(evaluations)
    body = _batch_object(
        batch,
        total=len(evaluations),
        finished=sum(1 for e in evaluations if e.status not in ACTIVE_STATUSES),
        started=sum(1 for e in evaluations if e.status != Status.PENDING),
        passed=sum(1 for e in evaluations if e.passed),
        failed=sum(1 for e in evaluations if e.status == Status.FAILED),
        cancelled=sum(1 for e in evaluations if e.status == Status.CANCELLED),
        reward_sum=sum(e.reward or 0.0 for e in evaluations),
        tasks=len(tasks),
        tasks_passed=sum(1 for t in tasks if t["passes"]),
    )
    body["tasks"] = tasks
    body["evaluations"] = [
        {
            "eval_id": str(e.id),
            "task_url": e.task_url,
            "attempt": e.attempt,
            "status": e.status,
            "passed": e.passed,
            "reward": e.reward,
            "error_kind": e.error_kind,
        }
        for e in evaluations
    ]
    # SPEC §18, as an evaluation's (evaluation_document says why a missing one is made here).
    body["signature"] = batch.signature
    if body["signature"] is None and batch.finished_at is not None:
        body["signature"] = signing.sign_if_possible(body, signing.BATCH_FIELDS)
    return body
