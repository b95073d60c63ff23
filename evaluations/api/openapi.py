"""What the OpenAPI document (drf-spectacular) says that no one view says: the auth scheme, the
error envelope, the parameters and responses several routes share, and the postprocessing hook.

1. Each route's description sits on its view (``extend_schema``); each response body is the
   ``Shape`` its view builds (evaluations/representation.py, or beside the view), request bodies
   the real serializers (serializers.py). This module imports no view.
2. ``ERROR_CODES`` is the one list of the envelope's stable codes; a test checks that every code
   the source raises is in it.
3. /metrics is a plain Django view; ``postprocess`` adds it, and sets the document's version to
   the service's.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from evaluations import VERSION
from evaluations.api.serializers import MAX_ENV_NAMES

TAG_EVALUATIONS = "evaluations"
TAG_SERVICE = "service"
TAG_BATCHES = "batches"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "evaluations.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An operator's token (one of AUTH_TOKEN's, comma-separated): it sees every evaluation "
            "and batch. Or a tenant's (AUTH_TOKENS, `name:token,...`, or one made in the admin): it sees, lists, "
            "cancels and retries only the evaluations and batches it created; any other id answers 404 "
            "`not_found`, as one that does not exist, and its Idempotency-Keys are its own. When both variables "
            'are unset and the admin made no token, auth is disabled (GET /status says `"auth": "disabled"`).',
        }


# -- the error envelope (errors.py) ------------------------------------------------------------

ERROR_CODES = {
    "invalid_request": "a field, header or query parameter is invalid (see `fields`)",
    "invalid_json": "the body is not a UTF-8 JSON object the parser accepts (see the sentence)",
    "unauthorized": "the bearer token is missing or wrong",
    "forbidden": "the request is not allowed",
    "not_found": "no such evaluation, batch or route",
    "method_not_allowed": "the route does not take this method",
    "not_acceptable": "the Accept header asks for something the route cannot give",
    "unsupported_media_type": "the body's media type is not understood",
    "already_finished": "the evaluation (or batch) already ended",
    "not_finished": "the evaluation has not ended yet (a retry needs an ended one)",
    "idempotency_conflict": "the Idempotency-Key was used with another body",
    "payload_too_large": "the body is over the size limit",
    "throttled": "too many requests",
    "at_capacity": "pending plus running evaluations (POST /batches: unfinished batches) reached the limit; "
    "retry after Retry-After seconds",
    "internal_error": "the executor failed; see its log",
    "unhealthy": "the database is unreachable",
    "bad_request": "the request could not be understood",
    # Live sandboxes (SPEC §24).
    "gone": "the sandbox has ended (stopped, expired or failed): it stays readable with GET",
    "moved": "the sandbox lives on another host: the same request at its Location (307)",
    "starting": "the sandbox is still starting: GET it until it is ready",
    "length_required": "a file upload needs a Content-Length",
    "conflict": "a path in the sandbox is in the way (a folder where a file goes)",
    "insufficient_storage": "the host's disk is full",
    "task_invalid": "the sandbox could not be made, for its image or its request's sake (see the sentence)",
    "infrastructure": "the sandbox could not be made, for the host's sake (see the sentence)",
}


class ErrorSerializer(serializers.Serializer):
    error = serializers.ChoiceField(choices=sorted(ERROR_CODES), help_text="A stable code: " + "; ".join(
        f"`{code}`: {meaning}" for code, meaning in ERROR_CODES.items()
    ))  # fmt: skip
    detail = serializers.CharField(help_text="One human sentence.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Validation errors: field name to messages.",
    )


# One example body per code, so each response shows its own code (an enum's first value otherwise).
ERROR_EXAMPLES = {
    "invalid_request": {
        "error": "invalid_request",
        "detail": "the request is invalid: task_url",
        "fields": {"task_url": ["must be an http(s) URL"]},
    },
    "invalid_json": {
        "error": "invalid_json",
        "detail": "the request body is not valid JSON: Expecting value: line 1 column 1 (char 0)",
    },
    "unauthorized": {"error": "unauthorized", "detail": "a valid 'Authorization: Bearer <token>' header is required"},
    "not_found": {"error": "not_found", "detail": "no evaluation 5b0c2f3e-8d1e-4a7b-9c55-0e1f2a3b4c5d"},
    "not_finished": {
        "error": "not_finished",
        "detail": "evaluation 5b0c2f3e-8d1e-4a7b-9c55-0e1f2a3b4c5d is still running; retry it once it ended",
    },
    "already_finished": {
        "error": "already_finished",
        "detail": "evaluation 5b0c2f3e-8d1e-4a7b-9c55-0e1f2a3b4c5d already ended completed",
    },
    "idempotency_conflict": {
        "error": "idempotency_conflict",
        "detail": "this Idempotency-Key was used with a different request body",
    },
    "payload_too_large": {"error": "payload_too_large", "detail": "the request body is over 2097152 bytes"},
    "at_capacity": {
        "error": "at_capacity",
        "detail": "the executor is at capacity (20 evaluations pending or running); retry later",
    },
}


def error(description: str, *codes: str) -> OpenApiResponse:
    """An error response: the envelope, ``description`` naming its codes, an example of each."""
    listed = ", ".join(f"`{code}`" for code in codes)
    examples = [
        OpenApiExample(code, value=ERROR_EXAMPLES[code], response_only=True) for code in codes if code in ERROR_EXAMPLES
    ]
    return OpenApiResponse(ErrorSerializer, description=f"{description} ({listed})", examples=examples)


# -- what several routes share -------------------------------------------------------------------

UNAUTHORIZED = error("Missing or bad bearer token", "unauthorized")
NOT_FOUND = error("No such evaluation, or another tenant's", "not_found")
NO_BATCH = error("No such batch, or another tenant's", "not_found")
AT_CAPACITY = error("At capacity", "at_capacity")
EVAL_ID = OpenApiParameter("eval_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The evaluation's id.")
BATCH_ID = OpenApiParameter("batch_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The batch's id.")
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="1 to 200 characters: the same key with the same body returns the first 202.",
)


def header(name: str, kind, description: str, codes: list[int]) -> OpenApiParameter:
    """A response header ``codes`` carry."""
    return OpenApiParameter(name, kind, OpenApiParameter.HEADER, required=True, description=description, response=codes)


RETRY_AFTER = header(
    "Retry-After", {"type": "integer", "minimum": 1}, "Seconds before a slot is likely to free.", [503]
)


def paging(statuses, id_name: str) -> list[OpenApiParameter]:
    """GET /evaluations' and GET /batches' query parameters and Link header (paging.py)."""
    return [
        OpenApiParameter("status", str, enum=statuses, description="Only this status."),
        OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, description="Default 100."),
        OpenApiParameter("before", OpenApiTypes.UUID, description=f"The page after this {id_name}."),
        OpenApiParameter(
            "Link",
            str,
            OpenApiParameter.HEADER,
            description='RFC 8288 `<...>; rel="next"` when there are more.',
            response=[200],
        ),
    ]


# -- what drf-spectacular cannot say from the views ------------------------------------------------


def _links(id_name: str, operations: dict[str, str]) -> dict:
    """OpenAPI links: the id a 202 returns feeds the routes named (stateful tests follow them)."""
    parameters = {id_name: f"$response.body#/{id_name}"}
    return {link: {"operationId": operation, "parameters": parameters} for link, operation in operations.items()}


def _strict(body: dict) -> None:
    """A request body as the serializer refuses it: unknown fields, too many env names, empty agent_code."""
    body["additionalProperties"] = False
    body["properties"]["env"]["maxProperties"] = MAX_ENV_NAMES  # (OpenAPI 3.0 has no propertyNames for the rule)
    body["properties"]["agent_code"]["minLength"] = 1


def postprocess(result, generator, request, public):
    """What drf-spectacular cannot say from the serializers: /metrics, links, strict request bodies, the version."""
    result["info"]["version"] = VERSION
    schemas, paths = result["components"]["schemas"], result["paths"]
    _strict(schemas["EvaluateRequest"])
    _strict(schemas["BatchRequest"])
    schemas["BatchRequest"]["properties"]["task_urls"]["uniqueItems"] = True
    paths["/evaluate"]["post"]["responses"]["202"]["links"] = _links(
        "eval_id",
        {
            "GetEvaluation": "evaluate_retrieve",
            "CancelEvaluation": "evaluate_destroy",
            "TailLog": "evaluate_logs_retrieve",
        },
    )
    paths["/batches"]["post"]["responses"]["202"]["links"] = _links(
        "batch_id", {"GetBatch": "batches_retrieve", "CancelBatch": "batches_destroy"}
    )
    paths["/metrics"] = {
        "get": {
            "operationId": "metrics_retrieve",
            "summary": "Prometheus metrics",
            "tags": [TAG_SERVICE],
            "security": [],
            "responses": {
                "200": {
                    "description": "Prometheus text exposition format.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    }
    return result
