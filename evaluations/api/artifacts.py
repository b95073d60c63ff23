"""GET /evaluate/{eval_id}/artifacts/{path}: one file the agent left under /logs/agent (evaluations/artifacts.py)."""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse, HttpResponseNotModified
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from evaluations import artifacts
from evaluations.api.errors import ApiError
from evaluations.api.views import get_evaluation


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    return any(tag.strip().removeprefix("W/") in (etag, "*") for tag in header.split(","))


class EvaluationArtifactView(APIView):
    """The file as an attachment, never rendered by a browser; errors stay JSON whatever the Accept header."""

    def perform_content_negotiation(self, request, force=False):
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    def get(self, request, eval_id, path):
        try:
            parts = artifacts.check_path(path)
        except artifacts.UnsafeName as exc:
            message = f"not a safe artifact name: {exc}"
            raise ApiError(
                400, "invalid_request", f"the path is invalid: {message}", fields={"path": [message]}
            ) from None
        evaluation = get_evaluation(eval_id, request.user, fields=("artifacts",))
        listed = next((a for a in evaluation.artifacts or [] if isinstance(a, dict) and a.get("path") == path), None)
        if listed is None:
            raise ApiError(404, "not_found", f"evaluation {evaluation.id} has no artifact {path}")
        try:
            file = artifacts.open_artifact(evaluation.id, path, settings.EXECUTOR)
        except FileNotFoundError:
            raise ApiError(
                404, "not_found", f"artifact {path} of evaluation {evaluation.id} is no longer stored"
            ) from None
        etag = f'"{listed["sha256"]}"'
        if _etag_matches(request.headers.get("If-None-Match"), etag):
            file.close()
            response = HttpResponseNotModified()
        else:
            response = FileResponse(
                file, as_attachment=True, filename=parts[-1], content_type="application/octet-stream"
            )
        response["ETag"] = etag
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "private, no-cache"
        return response
