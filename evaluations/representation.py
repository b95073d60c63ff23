"""The evaluation object of SPEC §2, as the API, callbacks and the CLI show it."""

from __future__ import annotations

from evaluations.models import Evaluation

# The columns the evaluation object shows, for readers that fetch only those (evaluations/api/rows.py).
EVALUATION_COLUMNS = (
    "id", "status", "step", "passed", "error", "duration_ms", "task_url", "language", "agent_sha256", "metadata",
    "created_at",
    "started_at", "finished_at", "agent_output", "agent_exit_code", "agent_patch", "test_output", "results_sha256",
    "egress", "resources", "error_kind", "retry_of_id", "owner",

    "cache",
)  # fmt: skip
TRANSITION_COLUMNS = ("step", "status", "at", "duration_ms")
TEST_RESULT_COLUMNS = ("name", "kind", "passed", "exit_code", "timed_out", "duration_ms", "output")


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def evaluation_json(evaluation: Evaluation) -> dict:
    return document(evaluation, evaluation.transitions.all(), evaluation.test_results.all())


def document(evaluation, transitions, test_results) -> dict:
    """The evaluation object from anything with the *_COLUMNS attributes: model instances or rows."""
    return {
        "eval_id": str(evaluation.id),
        "status": evaluation.status,
        "step": evaluation.step,
        "passed": evaluation.passed,
        "error": evaluation.error or None,
        "error_kind": evaluation.error_kind,
        "duration_ms": evaluation.duration_ms,
        "task_url": evaluation.task_url,
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
        "retry_of": str(evaluation.retry_of_id) if evaluation.retry_of_id else None,
        "owner": evaluation.owner,
    }


def summary_json(evaluation: Evaluation) -> dict:
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
