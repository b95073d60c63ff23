"""GET /evaluate/{eval_id}/logs?offset=N: tail an evaluation's combined log (see evaluations/livelog.py)."""

from __future__ import annotations

import re

from django.conf import settings
from django.http import HttpResponse
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from evaluations import livelog
from evaluations.api.errors import ApiError
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

    def get(self, request, eval_id):
        offset = parse_offset(request.query_params.get("offset"))
        evaluation = get_evaluation(eval_id, request.user)
        chunk = livelog.read_log(evaluation, settings.EXECUTOR.workspace_base, offset, livelog.MAX_CHUNK_BYTES)
        response = HttpResponse(chunk.data, content_type="text/plain; charset=utf-8")
        response["X-Log-Offset"] = str(chunk.next_offset)
        response["X-Log-Complete"] = "true" if chunk.complete else "false"
        response["Cache-Control"] = "no-store"
        return response
