"""POST /batches, GET /batches, GET and DELETE /batches/{id} (SPEC §14). Thin: the serializer validates,
admission admits, evaluations/batches.py shows, ends and cancels."""

from __future__ import annotations

import uuid

from django.conf import settings
from rest_framework import status as http
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations import lifecycle, representation
from evaluations.api import admission
from evaluations.api.errors import ApiError
from evaluations.api.paging import Page
from evaluations.api.serializers import BatchRequestSerializer, submission_fields
from evaluations.api.views import at_capacity, idempotency_conflict, idempotency_key, request_fingerprint
from evaluations.models import Batch, Status
from evaluations.worker import wakeup


def batch_pk(batch_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(batch_id))
    except ValueError:
        raise ApiError(404, "not_found", f"no batch {batch_id}") from None


class BatchListView(APIView):
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
            {"batch_id": str(batch_id), "eval_ids": [str(e) for e in eval_ids], "status": Status.PENDING},
            status=http.HTTP_202_ACCEPTED,
            headers={"Location": f"/batches/{batch_id}"},
        )

    def get(self, request):
        page = Page(
            request,
            request.user.visible(Batch.objects),
            noun="batch",
            statuses=representation.BATCH_STATUSES,
            by_status=representation.batches_with_status,
        )
        rows = list(representation.batch_summaries(page.queryset)[: page.limit + 1])
        return page.response(rows, representation.batch_summary)


class BatchDetailView(APIView):
    def get(self, request, batch_id):
        body = representation.batch_json(batch_pk(batch_id), among=request.user.visible(Batch.objects))
        if body is None:
            raise ApiError(404, "not_found", f"no batch {batch_id}")
        return Response(body)

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
        return Response({"batch_id": str(pk), "status": Status.CANCELLED}, status=http.HTTP_202_ACCEPTED)
