"""GET /evaluate/{eval_id}/artifacts/{path}: one file the agent left under /logs/agent (evaluations/artifacts.py).

``artifact_response`` builds the answer the API's route and the admin's artifact view both send.
"""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse, HttpResponse, HttpResponseNotModified
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from evaluations import artifacts
from evaluations.api.errors import ApiError
from evaluations.api.views import get_evaluation


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    return any(tag.strip().removeprefix("W/") in (etag, "*") for tag in header.split(","))


def artifact_response(request, eval_id, listed: list | None, path: str) -> HttpResponse:
    """One listed artifact of an evaluation the caller may see (``listed``: its ``artifacts``), as an
    attachment of ``application/octet-stream`` with ``nosniff`` (never rendered by a browser), its
    sha256 as ETag (``If-None-Match`` answers 304).

    Raises what ``artifacts.open_listed`` raises (``UnsafeName``, ``NotListed``, ``FileNotFoundError``):
    each caller answers them in its own shape.
    """
    file, entry = artifacts.open_listed(eval_id, listed, path, settings.EXECUTOR)
    etag = f'"{entry["sha256"]}"'
    if _etag_matches(request.headers.get("If-None-Match"), etag):
        file.close()
        response = HttpResponseNotModified()
    else:
        filename = path.rpartition("/")[2]
        response = FileResponse(file, as_attachment=True, filename=filename, content_type="application/octet-stream")
    response["ETag"] = etag
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-cache"
    return response


class EvaluationArtifactView(APIView):
    """The file as an attachment, never rendered by a browser; errors stay JSON whatever the Accept header."""

    def perform_content_negotiation(self, request, force=False):
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    def get(self, request, eval_id, path):
        try:
            artifacts.check_path(path)  # before the evaluation is looked up: a bad path is 400 for any id
        except artifacts.UnsafeName as exc:
            message = f"not a safe artifact name: {exc}"
            raise ApiError(
                400, "invalid_request", f"the path is invalid: {message}", fields={"path": [message]}
            ) from None
        evaluation = get_evaluation(eval_id, request.user, fields=("artifacts",))
        try:
            return artifact_response(request, evaluation.id, evaluation.artifacts, path)
        except artifacts.NotListed as exc:
            raise ApiError(404, "not_found", str(exc)) from None
        except FileNotFoundError:
            raise ApiError(
                404, "not_found", f"artifact {path} of evaluation {evaluation.id} is no longer stored"
            ) from None
