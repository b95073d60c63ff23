"""HTTP API of SPEC §2, the evaluation routes. Views stay thin: serializers validate, admission and
lifecycle decide.

Each view carries its OpenAPI description (``extend_schema``); a body a view builds itself is a
``Shape`` declared beside it, one the representation builds is representation.py's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Avg
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations import lifecycle
from evaluations.api import admission, retry
from evaluations.api.errors import ApiError
from evaluations.api.openapi import (
    AT_CAPACITY,
    EVAL_ID,
    IDEMPOTENCY_KEY,
    NOT_FOUND,
    RETRY_AFTER,
    TAG_EVALUATIONS,
    UNAUTHORIZED,
    error,
    header,
    paging,
)
from evaluations.api.paging import Page
from evaluations.api.serializers import EvaluateRequestSerializer, submission_fields, validate_evaluate_request
from evaluations.db import rows
from evaluations.models import Evaluation, Status, TestResult, Transition
from evaluations.representation import (
    EVALUATION_COLUMNS,
    TEST_RESULT_COLUMNS,
    TRANSITION_COLUMNS,
    EvaluationSerializer,
    EvaluationSummarySerializer,
    Shape,
    evaluation_document,
    evaluation_summary,
    given,
)
from evaluations.worker import wakeup

logger = logging.getLogger("term_executor.api")

MAX_IDEMPOTENCY_KEY = 200


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


class AcceptedSerializer(Shape):
    eval_id = given(serializers.UUIDField())
    status = given(serializers.ChoiceField(choices=Status.choices))


class RetryAcceptedSerializer(AcceptedSerializer):
    retry_of = given(serializers.UUIDField(help_text="The evaluation whose request the new one repeats."))


class EvaluateView(APIView):
    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="Submit an evaluation",
        request=EvaluateRequestSerializer,
        parameters=[IDEMPOTENCY_KEY, header("Location", str, "/evaluate/{eval_id}", [202]), RETRY_AFTER],
        responses={
            202: AcceptedSerializer,
            400: error("Invalid body or header", "invalid_request", "invalid_json"),
            401: UNAUTHORIZED,
            409: error("Idempotency-Key reused with another body", "idempotency_conflict"),
            413: error("Body too large", "payload_too_large"),
            503: AT_CAPACITY,
        },
    )
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
            AcceptedSerializer.build(eval_id=str(eval_id), status=Status.PENDING),
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
    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="One evaluation",
        parameters=[EVAL_ID],
        responses={200: EvaluationSerializer, 401: UNAUTHORIZED, 404: NOT_FOUND},
    )
    def get(self, request, eval_id):
        return Response(evaluation_body(eval_id, request.user))

    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="Cancel an evaluation",
        description="A pending evaluation is cancelled at once (`status: cancelled`); a running one "
        "answers `status: running` and ends `cancelled` within 2 s.",
        parameters=[EVAL_ID],
        responses={
            202: AcceptedSerializer,
            401: UNAUTHORIZED,
            404: NOT_FOUND,
            409: error("The evaluation already ended", "already_finished"),
        },
    )
    def delete(self, request, eval_id):
        evaluation = get_evaluation(eval_id, request.user)
        outcome = lifecycle.cancel(evaluation.id, "cancelled by DELETE")
        if outcome is None:
            evaluation.refresh_from_db(fields=["status"])
            raise ApiError(409, "already_finished", f"evaluation {eval_id} already ended {evaluation.status}")
        if outcome == Status.RUNNING:
            wakeup.notify(settings.EXECUTOR.data_dir)
        return Response(
            AcceptedSerializer.build(eval_id=str(evaluation.id), status=outcome), status=http.HTTP_202_ACCEPTED
        )


class EvaluationRetryView(APIView):
    """POST /evaluate/{id}/retry: a new pending evaluation with an ended one's request (retry.py)."""

    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="Run an ended evaluation again",
        description="A new pending evaluation with the same request (agent, task, timeout, env, assets, "
        "callback, metadata), linked by `retry_of`; admitted like POST /evaluate. For an `error_kind` of "
        "`infrastructure`, what a platform retries.",
        request=None,
        parameters=[EVAL_ID, header("Location", str, "/evaluate/{eval_id} of the new evaluation", [202]), RETRY_AFTER],
        responses={
            202: RetryAcceptedSerializer,
            401: UNAUTHORIZED,
            404: NOT_FOUND,
            409: error("The evaluation has not ended yet", "not_finished"),
            503: AT_CAPACITY,
        },
    )
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
            RetryAcceptedSerializer.build(eval_id=str(new.id), status=Status.PENDING, retry_of=str(evaluation.id)),
            status=http.HTTP_202_ACCEPTED,
            headers={"Location": f"/evaluate/{new.id}"},
        )


class EvaluationListView(APIView):
    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="List evaluations, newest first",
        description="A tenant's token lists only the evaluations it created; an operator's, all.",
        parameters=paging(Status.values, "eval_id"),
        responses={
            200: EvaluationSummarySerializer(many=True),
            400: error("Bad query", "invalid_request"),
            401: UNAUTHORIZED,
        },
    )
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
