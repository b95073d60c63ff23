"""HTTP API of SPEC §2. Views stay thin: serializers validate, admission and lifecycle decide."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Avg
from rest_framework import status as http
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations import VERSION, checks, environments, languages, lifecycle, signing
from evaluations.api import admission, auth, retry
from evaluations.api.errors import ApiError, envelope
from evaluations.api.paging import Page
from evaluations.api.serializers import submission_fields, validate_evaluate_request
from evaluations.db import rows, stats
from evaluations.models import Evaluation, Status, TestResult, Transition
from evaluations.representation import (
    EVALUATION_COLUMNS,
    TEST_RESULT_COLUMNS,
    TRANSITION_COLUMNS,
    evaluation_document,
    evaluation_summary,
)
from evaluations.worker import wakeup

logger = logging.getLogger("term_executor.api")

STARTED_AT = time.time()
MAX_IDEMPOTENCY_KEY = 200


class PublicView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    if connection.vendor == "sqlite":
        # An open connection keeps answering after its file is deleted or replaced.
        name = str(connection.settings_dict["NAME"])
        in_memory = name == ":memory:" or "mode=memory" in name
        if not in_memory and not os.path.isfile(name):
            raise OSError(f"SQLite file {name} is missing")


class HealthView(PublicView):
    def get(self, request):
        try:
            _check_database()
        except Exception as exc:  # any driver error means the database is unreachable
            body = {"status": "unhealthy", "checks": {"database": f"error: {exc.__class__.__name__}"}}
            body.update(envelope("unhealthy", f"database unreachable: {exc}".strip()))
            return Response(body, status=http.HTTP_503_SERVICE_UNAVAILABLE)
        return Response({"status": "ok"})


class PublicKeyView(PublicView):
    """SPEC §18: the keys results are signed with, the current first; public, as a platform
    verifying a saved result may hold no token of this service."""

    def get(self, request):
        keys = signing.keyring(settings.EXECUTOR).public_keys()
        return Response({"keys": [key.as_json() for key in keys]})


class StatusView(PublicView):
    def get(self, request):
        config = settings.EXECUTOR
        counts = stats.evaluation_counts()
        workers = stats.live_workers(config.worker_stale_secs)
        capacity = sum(w.capacity for w in workers) if workers else config.max_concurrent_evals
        state = checks.sandbox_state(workers)
        return Response(
            {
                "version": VERSION,
                "uptime_secs": int(time.time() - STARTED_AT),
                "active_evals": counts["running"],
                "queued_evals": counts["pending"],
                "total_evals": counts["total"],
                "passed": counts["passed"],
                "failed": counts["failed"],
                "cancelled": counts["cancelled"],
                "capacity": capacity,
                "available_slots": max(0, capacity - counts["running"]),
                "workers": len(workers),
                "sandbox": state.mode,
                "sandbox_state": state.words,
                "limits": {"memory": state.limits, "processes": state.limits},
                "warnings": checks.sandbox_warnings(state.mode, state.limits),
                "auth": "enabled" if auth.enabled(config) else "disabled",
                "languages": list(languages.available()),
                "static_assets": len(config.static_assets),
                "environments": len(environments.list_environments(config.environments_root)),
                "runtimes": environments.runtimes(),
            }
        )


def request_fingerprint(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _retry_after_secs(capacity: int) -> int:
    """Roughly when a slot frees: the mean recent duration spread over the slots, 1 to 60 s.

    Computed at most once a second per process: refusals come in floods, when the
    service is busiest, and a hint a second old is as good.
    """
    now = time.monotonic()
    expires, value = _retry_after_cache.get(capacity, (0.0, 0))
    if now >= expires:
        value = _mean_wait_secs(capacity)
        _retry_after_cache[capacity] = (now + 1.0, value)
    return value


_retry_after_cache: dict[int, tuple[float, int]] = {}


def _mean_wait_secs(capacity: int) -> int:
    recent = Evaluation.objects.filter(duration_ms__isnull=False).order_by("-finished_at")[:20]
    mean_ms = Evaluation.objects.filter(id__in=recent.values("id")).aggregate(m=Avg("duration_ms"))["m"]
    if not mean_ms:
        return 5
    return int(min(60, max(1, mean_ms / 1000 / max(1, capacity))))


REFUSAL_LOG_SECS = 60.0
_refusals = {"count": 0, "logged_at": float("-inf")}


def _log_refusal(limit: int) -> None:
    """One WARNING a minute per process while refusals last, with their count.

    Refusals come in floods (a platform retrying at a full executor): a line for each,
    as django.request writes for every 503, was a thousand lines a second.
    """
    _refusals["count"] += 1
    now = time.monotonic()
    if now - _refusals["logged_at"] >= REFUSAL_LOG_SECS:
        logger.warning(
            "at capacity (%d evaluations pending or running): refused %d POST /evaluate since the last such line",
            limit,
            _refusals["count"],
        )
        _refusals.update(count=0, logged_at=now)


def idempotency_key(request) -> str | None:
    """The request's Idempotency-Key header, checked: POST /evaluate and POST /batches read it alike."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise ApiError(
            400,
            "invalid_request",
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
            fields={"Idempotency-Key": [f"must be 1 to {MAX_IDEMPOTENCY_KEY} characters"]},
        )
    return key


def _at_capacity(config) -> ApiError:
    """POST /evaluate's and the retry's 503: every pending and running single evaluation counts."""
    _log_refusal(config.admission_limit)
    return at_capacity(
        f"the executor is at capacity ({config.admission_limit} evaluations pending or running); retry later"
    )


def at_capacity(detail: str) -> ApiError:
    return ApiError(
        503,
        "at_capacity",
        detail,
        headers={"Retry-After": str(_retry_after_secs(settings.EXECUTOR.max_concurrent_evals))},
        logged=True,
    )


def idempotency_conflict() -> ApiError:
    return ApiError(409, "idempotency_conflict", "this Idempotency-Key was used with a different request body")


class EvaluateView(APIView):
    def post(self, request):
        config = settings.EXECUTOR
        key = idempotency_key(request)
        data = validate_evaluate_request(request.data, config)
        fields = {
            **submission_fields(data),
            "task_url": data["task_url"],
            "static_assets": data.get("static_assets"),
            "owner": request.user.owner,
        }
        try:
            eval_id, _created = admission.admit_id(
                fields=fields,
                limit=config.admission_limit,
                scope=request.user.scope,
                key=key,
                request_sha256=request_fingerprint(request.data),
                data_dir=config.data_dir,
            )
        except admission.AtCapacity:
            raise _at_capacity(config) from None
        except admission.IdempotencyConflict:
            raise idempotency_conflict() from None
        location = f"/evaluate/{eval_id}"
        return Response(
            {"eval_id": str(eval_id), "status": Status.PENDING},
            status=http.HTTP_202_ACCEPTED,
            headers={"Location": location},
        )


def _eval_pk(eval_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(eval_id))
    except ValueError:
        raise ApiError(404, "not_found", f"no evaluation {eval_id}") from None


def get_evaluation(eval_id: str, caller, fields: tuple[str, ...] = ()) -> Evaluation:
    """The evaluation if ``caller`` may see it; another tenant's is not found, as a missing one.
    ``fields``: read only these columns (and the id and owner), not the large texts."""
    found = caller.visible(Evaluation.objects).filter(id=_eval_pk(eval_id)).order_by()
    evaluation = (found.only("id", "owner", *fields) if fields else found).first()
    if evaluation is None:
        raise ApiError(404, "not_found", f"no evaluation {eval_id}")
    return evaluation


_EVALUATION = rows.Select(Evaluation, EVALUATION_COLUMNS, where="id")
_TRANSITIONS = rows.Select(Transition, TRANSITION_COLUMNS, where="evaluation", order_by=("at", "id"))
_TEST_RESULTS = rows.Select(TestResult, TEST_RESULT_COLUMNS, where="evaluation", order_by=("position",))


def evaluation_body(eval_id: str, caller) -> dict:
    """GET /evaluate/{id}'s body: three SELECTs of the shown columns (rows.py says why not the ORM).
    Another tenant's evaluation is not found, and its transitions and tests are not read."""
    pk = _eval_pk(eval_id)
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        found = _EVALUATION.rows(cursor, pk)
        if not found or not caller.may_see(found[0].owner):
            raise ApiError(404, "not_found", f"no evaluation {eval_id}")
        return evaluation_document(found[0], _TRANSITIONS.rows(cursor, pk), _TEST_RESULTS.rows(cursor, pk))


class EvaluationDetailView(APIView):
    def get(self, request, eval_id):
        return Response(evaluation_body(eval_id, request.user))

    def delete(self, request, eval_id):
        evaluation = get_evaluation(eval_id, request.user)
        outcome = lifecycle.cancel(evaluation.id, "cancelled by DELETE")
        if outcome is None:
            evaluation.refresh_from_db(fields=["status"])
            raise ApiError(409, "already_finished", f"evaluation {eval_id} already ended {evaluation.status}")
        if outcome == Status.RUNNING:
            wakeup.notify(settings.EXECUTOR.data_dir)
        return Response({"eval_id": str(evaluation.id), "status": outcome}, status=http.HTTP_202_ACCEPTED)


class EvaluationRetryView(APIView):
    """POST /evaluate/{id}/retry: a new pending evaluation with an ended one's request (retry.py)."""

    def post(self, request, eval_id):
        config = settings.EXECUTOR
        evaluation = get_evaluation(eval_id, request.user)
        if not evaluation.is_terminal:
            raise ApiError(
                409, "not_finished", f"evaluation {eval_id} is still {evaluation.status}; retry it once it ended"
            )
        try:
            new = retry.retry(evaluation, config=config, scope=request.user.scope)
        except admission.AtCapacity:
            raise _at_capacity(config) from None
        # Pending as admitted, as POST /evaluate answers: a worker may claim it before this reply is written.
        return Response(
            {"eval_id": str(new.id), "status": Status.PENDING, "retry_of": str(evaluation.id)},
            status=http.HTTP_202_ACCEPTED,
            headers={"Location": f"/evaluate/{new.id}"},
        )


class EvaluationListView(APIView):
    def get(self, request):
        page = Page(
            request,
            request.user.visible(Evaluation.objects),
            noun="eval",
            statuses=Status.values,
            by_status=lambda queryset, value: queryset.filter(status=value),
        )
        fields = ("id", "task_url", "language", "status", "passed", "created_at", "owner")
        return page.response(list(page.queryset.only(*fields)[: page.limit + 1]), evaluation_summary)
