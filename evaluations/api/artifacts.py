"""GET /evaluate/{eval_id}/artifacts/{path}: one file the agent left under /logs/agent (evaluations/artifacts.py).

``artifact_response`` builds the answer the API's route and the admin's artifact view both send.
"""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse, HttpResponse, HttpResponseNotModified
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from evaluations import artifacts
from evaluations.api.errors import ApiError
from evaluations.api.openapi import EVAL_ID, TAG_EVALUATIONS, UNAUTHORIZED, error, header
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

    @extend_schema(
        tags=[TAG_EVALUATIONS],
        summary="Download a file the agent left under /logs/agent",
        description="One of the evaluation's `artifacts`, by its `path` (slashes as they are), as an attachment: "
        "`application/octet-stream`, `nosniff`, its sha256 as the `ETag` (`If-None-Match` answers 304). Only a "
        "listed path is served: any other is 404, and a name that is not safe (empty, `.` or `..` components, "
        f"more than {artifacts.MAX_PARTS} names, over {artifacts.MAX_PATH_BYTES} bytes, a control "
        "or invisible character, a backslash, not UTF-8) is 400 before anything is looked up.",
        parameters=[
            EVAL_ID,
            OpenApiParameter(
                "path", str, OpenApiParameter.PATH, description="The artifact's path, e.g. `trajectory.json`."
            ),
            header("ETag", str, "The file's sha256, quoted.", [200, 304]),
            header("Content-Disposition", str, "`attachment` with the file's name.", [200]),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="The file"),
            304: OpenApiResponse(description="If-None-Match holds the ETag"),
            400: error("Not a safe artifact name", "invalid_request"),
            401: UNAUTHORIZED,
            404: error("No such evaluation (or another tenant's), or no such artifact of it", "not_found"),
        },
    )
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
