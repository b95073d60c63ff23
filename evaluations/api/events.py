"""GET /evaluate/{id}/events and GET /batches/{id}/events: text/event-stream (SPEC §18, evaluations/events/).

Checked before the stream opens, each an error in the one envelope whatever Accept says (as
logs.py): the token, the id (another tenant's is 404), ``logs`` and ``Last-Event-ID`` (400),
a stream that already sent ``done`` (204: the EventSource spec's "stop reconnecting") and a
free slot of MAX_EVENT_STREAMS, and for a tenant's token of MAX_EVENT_STREAMS_PER_TOKEN too
(503 ``at_capacity``, each naming its cap).
"""

from __future__ import annotations

import socket
import struct

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from evaluations import representation
from evaluations.api.batches import batch_pk
from evaluations.api.errors import ApiError
from evaluations.api.openapi import (
    BATCH_ID,
    EVAL_ID,
    NO_BATCH,
    NOT_FOUND,
    RETRY_AFTER,
    TAG_BATCHES,
    TAG_EVALUATIONS,
    UNAUTHORIZED,
    error,
)
from evaluations.api.views import at_capacity, evaluation_body, get_evaluation
from evaluations.events import cursor, hub, slots
from evaluations.events.stream import BatchFeed, EvaluationFeed, EventStream
from evaluations.models import Batch, Evaluation

LAST_EVENT_ID = "Last-Event-ID"

# -- what both routes' descriptions share ----------------------------------------------------------

LAST_EVENT_ID_PARAMETER = OpenApiParameter(
    LAST_EVENT_ID,
    str,
    OpenApiParameter.HEADER,
    description="Resume after this event (the id of the last one received); `done` answers 204.",
)
EVENTS_COMMON = (
    "`text/event-stream`. Each event has an `id:`; reconnecting with it as `Last-Event-ID` resumes after it, "
    "on any web process, with nothing missed or repeated. A comment line (`: keep-alive`) every "
    "EVENT_KEEPALIVE_SECS (15) while nothing else is sent; the stream ends after `done`, and also when the "
    "service stops (reconnect). At most MAX_EVENT_STREAMS (200) streams are open on a host at once, and at most "
    "MAX_EVENT_STREAMS_PER_TOKEN (a quarter of it) of one tenant's token. "
)


def _stream_responses(not_found: OpenApiResponse) -> dict:
    return {
        (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description="The event stream"),
        204: OpenApiResponse(description="Last-Event-ID was `done`: the stream had ended; stop reconnecting"),
        400: error("Bad logs or Last-Event-ID", "invalid_request"),
        401: UNAUTHORIZED,
        404: not_found,
        503: error("MAX_EVENT_STREAMS streams are open, or this tenant's MAX_EVENT_STREAMS_PER_TOKEN", "at_capacity"),
    }


def _logs_wanted(request) -> bool:
    raw = request.query_params.get("logs", "0")
    if raw not in ("0", "1"):
        raise ApiError(
            400, "invalid_request", "the query is invalid: logs must be 0 or 1", fields={"logs": ["must be 0 or 1"]}
        )
    return raw == "1"


def _bad_cursor(exc: cursor.BadCursor) -> ApiError:
    message = f"not an event id of this stream: {exc}"
    return ApiError(
        400, "invalid_request", f"the {LAST_EVENT_ID} header is invalid: {message}", fields={LAST_EVENT_ID: [message]}
    )


class _EventsView(APIView):
    # No HEAD: Django would answer it with get's response, a stream no client reads, which the
    # server would write out (nothing) for the evaluation's whole life on a sync worker.
    http_method_names = ["get", "options"]

    def perform_content_negotiation(self, request, force=False):
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    def open(self, request, feed) -> StreamingHttpResponse:
        config = settings.EXECUTOR
        tenant = request.user.owner  # None for an operator's token: held only to the host's cap
        try:
            slot = slots.take(
                config.data_dir, config.max_event_streams, tenant=tenant, tenant_limit=config.event_streams_per_token
            )
        except slots.Full as full:
            if full.cap == slots.TENANT:
                raise at_capacity(
                    f"this token's tenant has {config.event_streams_per_token} event streams open "
                    "(MAX_EVENT_STREAMS_PER_TOKEN); close one or retry later"
                ) from None
            raise at_capacity(
                f"{config.max_event_streams} event streams are open on this host (MAX_EVENT_STREAMS); retry later"
            ) from None
        try:
            subscription = hub.hub(config.data_dir).subscribe(feed.keys)
        except BaseException:
            slot.release()
            raise
        _limit_send_time(request, config.event_send_timeout_secs)
        stream = EventStream(feed, subscription, slot, config.event_keepalive_secs)
        response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy (nginx) passes each event on at once
        return response


class EvaluationEventsView(_EventsView):
    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="Follow an evaluation: server-sent events",
        description=EVENTS_COMMON
        + "Events: `step` `{step, status, at}` for each transition, `test` `{name, kind, passed, exit_code}` "
        "for each test result (before the step that ends the evaluation), `log` `{offset, text}` with "
        "`logs=1` (the live log's bytes from `offset`, whole UTF-8 characters), and `done`, the "
        "evaluation object as GET /evaluate/{eval_id} returns it. An event's id is `T.R.O` (transitions, "
        "tests and log bytes sent); `done`'s is `done`.",
        parameters=[
            EVAL_ID,
            OpenApiParameter("logs", {"type": "integer", "enum": [0, 1]}, description="1: log events too. Default 0."),
            LAST_EVENT_ID_PARAMETER,
            RETRY_AFTER,
        ],
        responses=_stream_responses(NOT_FOUND),
    )
    def get(self, request, eval_id):
        logs = _logs_wanted(request)
        evaluation = get_evaluation(eval_id, request.user, fields=("status",))
        raw = request.headers.get(LAST_EVENT_ID)
        if raw == cursor.DONE:
            return HttpResponse(status=204)
        try:
            position = cursor.parse_evaluation(raw) if raw else cursor.Position()
        except cursor.BadCursor as exc:
            raise _bad_cursor(exc) from None
        caller = request.user
        feed = EvaluationFeed(
            evaluation.id,
            position,
            logs=logs,
            workspace_base=settings.EXECUTOR.workspace_base,
            done_body=lambda: evaluation_body(str(evaluation.id), caller),
        )
        return self.open(request, feed)


class BatchEventsView(_EventsView):
    @extend_schema(
        tags=[TAG_BATCHES],
        summary="Follow a batch: server-sent events",
        description=EVENTS_COMMON
        + "Events: `step` and `test` of each of its evaluations, as GET /evaluate/{eval_id}/events sends "
        "them, each with its `eval_id`; `done`, the batch object as GET /batches/{batch_id} returns it. "
        "No log events (`logs=1` is 400: follow one evaluation's). An event's id holds an entry per "
        "evaluation in queue order, run-length encoded.",
        parameters=[BATCH_ID, LAST_EVENT_ID_PARAMETER, RETRY_AFTER],
        responses=_stream_responses(NO_BATCH),
    )
    def get(self, request, batch_id):
        if request.query_params.get("logs", "0") != "0":
            message = (
                "a batch's stream has no log events: follow one evaluation's with GET /evaluate/{id}/events?logs=1"
            )
            raise ApiError(400, "invalid_request", f"the query is invalid: {message}", fields={"logs": [message]})
        visible = request.user.visible(Batch.objects)
        pk = batch_pk(batch_id)
        if not visible.filter(id=pk).exists():
            raise ApiError(404, "not_found", f"no batch {batch_id}")
        raw = request.headers.get(LAST_EVENT_ID)
        if raw == cursor.DONE:
            return HttpResponse(status=204)
        eval_ids = list(
            Evaluation.objects.filter(batch_id=pk).order_by("created_at", "id").values_list("id", flat=True)
        )
        try:
            positions = cursor.parse_batch(raw, len(eval_ids)) if raw else [cursor.Position() for _ in eval_ids]
        except cursor.BadCursor as exc:
            raise _bad_cursor(exc) from None
        feed = BatchFeed(pk, eval_ids, positions, done_body=lambda: representation.batch_json(pk, among=visible))
        return self.open(request, feed)


def _limit_send_time(request, seconds: int) -> None:
    """A write to a client that stopped reading fails after ``seconds`` (SO_SNDTIMEO on gunicorn's
    socket), which ends the stream and frees its slot: nothing queues up behind it."""
    sock = request.META.get("gunicorn.socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0))
