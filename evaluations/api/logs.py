"""GET /evaluate/{eval_id}/logs?offset=N: tail an evaluation's combined log (see evaluations/livelog.py)."""

from __future__ import annotations

import re

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from evaluations import livelog
from evaluations.api.errors import ApiError
from evaluations.api.openapi import EVAL_ID, NOT_FOUND, TAG_EVALUATIONS, UNAUTHORIZED, error, header
from evaluations.api.views import get_evaluation

MAX_OFFSET = 2**53  # what a JSON number (and every client) holds exactly
_DIGITS = re.compile(r"^[0-9]{1,16}$")


def parse_offset(raw: str | None) -> int:
    if raw is None or raw == "":
        return 0
    if not _DIGITS.match(raw) or int(raw) > MAX_OFFSET:
        message = f"must be an integer from 0 to {MAX_OFFSET}"
        raise ApiError(400, "invalid_request", f"the query is invalid: offset {message}", fields={"offset": [message]})
    return int(raw)


class EvaluationLogView(APIView):
    """The log as text/plain; errors stay JSON whatever the Accept header asks for."""

    def perform_content_negotiation(self, request, force=False):
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="Tail an evaluation's combined log",
        description="The live log (each step's `␞ === step ===` line and every command's output) from byte "
        "`offset`, at most 1 MiB a call. The executor's own lines start with `␞` (U+241E) and a space; a "
        "command's output never carries that character (it becomes U+FFFD), so `grep '^␞'` finds them all. "
        "Ask again from `X-Log-Offset` until `X-Log-Complete` is `true`. "
        "Once the evaluation ended, the log is rebuilt from the stored agent and test outputs: a "
        "different document, read from offset 0.",
        parameters=[
            EVAL_ID,
            OpenApiParameter(
                "offset", {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}, description="Default 0."
            ),
            header("X-Log-Offset", {"type": "integer", "minimum": 0}, "The offset to ask for next.", [200]),
            header(
                "X-Log-Complete",
                {"type": "string", "enum": ["true", "false"]},
                "`true` once the evaluation ended and this chunk reaches the end of its log.",
                [200],
            ),
        ],
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="Log bytes"),
            400: error("Bad offset", "invalid_request"),
            401: UNAUTHORIZED,
            404: NOT_FOUND,
        },
    )
    def get(self, request, eval_id):
        offset = parse_offset(request.query_params.get("offset"))
        evaluation = get_evaluation(eval_id, request.user)
        chunk = livelog.read_log(evaluation, settings.EXECUTOR.workspace_base, offset, livelog.MAX_CHUNK_BYTES)
        response = HttpResponse(chunk.data, content_type="text/plain; charset=utf-8")
        response["X-Log-Offset"] = str(chunk.next_offset)
        response["X-Log-Complete"] = "true" if chunk.complete else "false"
        response["Cache-Control"] = "no-store"
        return response
