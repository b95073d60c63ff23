"""POST /batches, GET /batches, GET and DELETE /batches/{id} (SPEC §14). Thin: the serializer validates,
admission admits, evaluations/batches.py shows, ends and cancels."""

from __future__ import annotations

import uuid

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations import lifecycle, representation
from evaluations.api import admission
from evaluations.api.errors import ApiError
from evaluations.api.openapi import (
    BATCH_ID,
    IDEMPOTENCY_KEY,
    NO_BATCH,
    RETRY_AFTER,
    TAG_BATCHES,
    UNAUTHORIZED,
    error,
    header,
    paging,
)
from evaluations.api.paging import Page
from evaluations.api.serializers import BatchRequestSerializer, submission_fields
from evaluations.api.views import at_capacity, idempotency_conflict, idempotency_key, request_fingerprint
from evaluations.models import Batch, Status
from evaluations.representation import BATCH_STATUSES, BatchSerializer, BatchSummarySerializer, Shape, given
from evaluations.worker import wakeup


def batch_pk(batch_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(batch_id))
    except ValueError:
        raise ApiError(404, "not_found", f"no batch {batch_id}") from None


class BatchAcceptedSerializer(Shape):
    batch_id = given(serializers.UUIDField())
    eval_ids = given(
        serializers.ListField(
            child=serializers.UUIDField(),
            help_text="In queue order: attempt 1 of every task URL in task_urls order, then attempt 2, and so on.",
        )
    )
    status = given(serializers.ChoiceField(choices=BATCH_STATUSES))


class BatchCancelledSerializer(Shape):
    batch_id = given(serializers.UUIDField())
    status = given(serializers.ChoiceField(choices=[Status.CANCELLED]))


class BatchListView(APIView):
    @extend_schema(
        tags=[TAG_BATCHES],
        summary="Submit a batch: one agent on several tasks",
        description="Each task URL runs `attempts` times (pass@k). Its evaluations queue beside the "
        "others, by round: attempt 1 of every task URL in task_urls order, then attempt 2, and so on; they do "
        "not count against MAX_QUEUED_EVALS, the batches do against MAX_OPEN_BATCHES (unfinished batches).",
        request=BatchRequestSerializer,
        parameters=[IDEMPOTENCY_KEY, header("Location", str, "/batches/{batch_id}", [202]), RETRY_AFTER],
        responses={
            202: BatchAcceptedSerializer,
            400: error("Invalid body or header", "invalid_request", "invalid_json"),
            401: UNAUTHORIZED,
            409: error("Idempotency-Key reused with another body", "idempotency_conflict"),
            413: error("Body too large", "payload_too_large"),
            503: error("MAX_OPEN_BATCHES batches are unfinished", "at_capacity"),
        },
    )
    def post(self, request):
        config = settings.EXECUTOR
        key = idempotency_key(request)
        serializer = BatchRequestSerializer(data=request.data, context={"config": config})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            batch_id, eval_ids, _created = admission.admit_batch(
                fields={**submission_fields(data), "owner": request.user.owner},
                task_urls=data["task_urls"],
                attempts=data["attempts"],
                max_open=config.max_open_batches,
                scope=request.user.scope,
                key=key,
                request_sha256=request_fingerprint(request.data),
                data_dir=config.data_dir,
            )
        except admission.AtCapacity:
            raise at_capacity(
                f"the executor is at capacity ({config.max_open_batches} batches unfinished); retry later"
            ) from None
        except admission.IdempotencyConflict:
            raise idempotency_conflict() from None
        return Response(
            BatchAcceptedSerializer.build(
                batch_id=str(batch_id), eval_ids=[str(e) for e in eval_ids], status=Status.PENDING
            ),
            status=http.HTTP_202_ACCEPTED,
            headers={"Location": f"/batches/{batch_id}"},
        )

    @extend_schema(
        tags=[TAG_BATCHES],
        summary="List batches, newest first",
        description="A tenant's token lists only the batches it created; an operator's, all.",
        parameters=paging(list(BATCH_STATUSES), "batch_id"),
        responses={
            200: BatchSummarySerializer(many=True),
            400: error("Bad query", "invalid_request"),
            401: UNAUTHORIZED,
        },
    )
    def get(self, request):
        page = Page(
            request,
            request.user.visible(Batch.objects),
            noun="batch",
            statuses=BATCH_STATUSES,
            by_status=representation.batches_with_status,
        )
        rows = list(representation.batch_summaries(page.queryset)[: page.limit + 1])
        return page.response(rows, representation.batch_summary)


class BatchDetailView(APIView):
    @extend_schema(
        tags=[TAG_BATCHES],
        summary="One batch, its tasks, evaluations and rewards",
        parameters=[BATCH_ID],
        responses={200: BatchSerializer, 401: UNAUTHORIZED, 404: NO_BATCH},
    )
    def get(self, request, batch_id):
        body = representation.batch_json(batch_pk(batch_id), among=request.user.visible(Batch.objects))
        if body is None:
            raise ApiError(404, "not_found", f"no batch {batch_id}")
        return Response(body)

    @extend_schema(
        tags=[TAG_BATCHES],
        summary="Cancel a batch",
        description="Cancels what has not finished, as DELETE /evaluate/{eval_id} does for each: pending "
        "evaluations at once, running ones within 2 s. The batch is `cancelled` from now on; its "
        "finished_at (and callback) come when its last evaluation stopped.",
        parameters=[BATCH_ID],
        responses={
            202: BatchCancelledSerializer,
            401: UNAUTHORIZED,
            404: NO_BATCH,
            409: error("The batch already ended", "already_finished"),
        },
    )
    def delete(self, request, batch_id):
        pk = batch_pk(batch_id)
        if not request.user.visible(Batch.objects).filter(id=pk).exists():
            raise ApiError(404, "not_found", f"no batch {batch_id}")
        outcomes = lifecycle.cancel_batch(pk, "batch cancelled by DELETE")
        if outcomes is None:
            status = Batch.objects.values_list("status", flat=True).get(id=pk)
            raise ApiError(409, "already_finished", f"batch {batch_id} already ended {status}")
        if Status.RUNNING in outcomes:
            wakeup.notify(settings.EXECUTOR.data_dir)
        return Response(
            BatchCancelledSerializer.build(batch_id=str(pk), status=Status.CANCELLED), status=http.HTTP_202_ACCEPTED
        )
