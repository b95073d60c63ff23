"""The OpenAPI 3 document (drf-spectacular): every route, its parameters, responses and the auth scheme.

1. The shapes are declared once: request bodies by the real serializers (serializers.py),
   responses by documentation-only serializers (shapes.py). This module attaches them to the
   views, so views.py stays about behaviour.
2. /metrics is a plain Django view; a postprocessing hook adds it, and sets the document's
   version to the service's.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)

from evaluations import VERSION
from evaluations import artifacts as artifact_store
from evaluations.api import artifacts, assets, batches, environments, events, images, logs, views
from evaluations.api.serializers import MAX_ENV_NAMES, BatchRequestSerializer, EvaluateRequestSerializer
from evaluations.api.shapes import (
    AcceptedSerializer,
    AssetSerializer,
    BatchAcceptedSerializer,
    BatchCancelledSerializer,
    BatchSerializer,
    BatchSummarySerializer,
    EnvironmentSerializer,
    ErrorSerializer,
    EvaluationSerializer,
    EvaluationSummarySerializer,
    HealthSerializer,
    ImageSerializer,
    PublicKeysSerializer,
    RetryAcceptedSerializer,
    StatusSerializer,
    UnhealthySerializer,
)
from evaluations.models import Status
from evaluations.representation import BATCH_STATUSES

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


# -- responses and parameters ---------------------------------------------------


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
    listed = ", ".join(f"`{code}`" for code in codes)
    examples = [
        OpenApiExample(code, value=ERROR_EXAMPLES[code], response_only=True) for code in codes if code in ERROR_EXAMPLES
    ]
    return OpenApiResponse(ErrorSerializer, description=f"{description} ({listed})", examples=examples)


UNAUTHORIZED = error("Missing or bad bearer token", "unauthorized")
NOT_FOUND = error("No such evaluation, or another tenant's", "not_found")
EVAL_ID = OpenApiParameter("eval_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The evaluation's id.")
BATCH_ID = OpenApiParameter("batch_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The batch's id.")
NO_BATCH = error("No such batch, or another tenant's", "not_found")
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="1 to 200 characters: the same key with the same body returns the first 202.",
)


def header(name: str, kind, description: str, codes: list[int]) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.HEADER, required=True, description=description, response=codes)


RETRY_AFTER = header(
    "Retry-After", {"type": "integer", "minimum": 1}, "Seconds before a slot is likely to free.", [503]
)


LAST_EVENT_ID = OpenApiParameter(
    events.LAST_EVENT_ID,
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


def paging(statuses, id_name: str) -> list[OpenApiParameter]:
    """GET /evaluations' and GET /batches' query parameters and Link header."""
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


def document_views() -> None:
    """Attach the descriptions above to the API's views."""
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_SERVICE],
            summary="Liveness and database check",
            responses={200: HealthSerializer, 503: OpenApiResponse(UnhealthySerializer, "Database unreachable")},
        )
    )(views.HealthView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_SERVICE], summary="Counts, capacity, sandbox and auth mode", responses=StatusSerializer
        )
    )(views.StatusView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_SERVICE],
            summary="The public keys results are signed with (the current first)",
            responses=PublicKeysSerializer,
        )
    )(views.PublicKeyView)
    extend_schema_view(
        post=extend_schema(
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
                503: error("At capacity", "at_capacity"),
            },
        )
    )(views.EvaluateView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_EVALUATIONS],
            summary="One evaluation",
            parameters=[EVAL_ID],
            responses={200: EvaluationSerializer, 401: UNAUTHORIZED, 404: NOT_FOUND},
        ),
        delete=extend_schema(
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
        ),
    )(views.EvaluationDetailView)
    extend_schema_view(
        post=extend_schema(
            tags=[TAG_EVALUATIONS],
            summary="Run an ended evaluation again",
            description="A new pending evaluation with the same request (agent, task, timeout, env, assets, "
            "callback, metadata), linked by `retry_of`; admitted like POST /evaluate. For an `error_kind` of "
            "`infrastructure`, what a platform retries.",
            request=None,
            parameters=[
                EVAL_ID,
                header("Location", str, "/evaluate/{eval_id} of the new evaluation", [202]),
                header(
                    "Retry-After", {"type": "integer", "minimum": 1}, "Seconds before a slot is likely to free.", [503]
                ),
            ],
            responses={
                202: RetryAcceptedSerializer,
                401: UNAUTHORIZED,
                404: NOT_FOUND,
                409: error("The evaluation has not ended yet", "not_finished"),
                503: error("At capacity", "at_capacity"),
            },
        )
    )(views.EvaluationRetryView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_EVALUATIONS],
            summary="Tail an evaluation's combined log",
            description="The live log (each step's `␞ === step ===` line and every command's output) from byte "
            "`offset`, at most 1 MiB a call. The executor's own lines start with `␞` (U+241E) and a space; a "
            "command's output never carries that character (it becomes U+FFFD), so `grep '^␞'` finds them all. Ask again from `X-Log-Offset` until `X-Log-Complete` is `true`. "
            "Once the evaluation ended, the log is rebuilt from the stored agent and test outputs: a "
            "different document, read from offset 0.",
            parameters=[
                EVAL_ID,
                OpenApiParameter(
                    "offset", {"type": "integer", "minimum": 0, "maximum": logs.MAX_OFFSET}, description="Default 0."
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
    )(logs.EvaluationLogView)
    extend_schema_view(
        get=extend_schema(
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
                OpenApiParameter(
                    "logs", {"type": "integer", "enum": [0, 1]}, description="1: log events too. Default 0."
                ),
                LAST_EVENT_ID,
                RETRY_AFTER,
            ],
            responses={
                (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description="The event stream"),
                204: OpenApiResponse(description="Last-Event-ID was `done`: the stream had ended; stop reconnecting"),
                400: error("Bad logs or Last-Event-ID", "invalid_request"),
                401: UNAUTHORIZED,
                404: NOT_FOUND,
                503: error(
                    "MAX_EVENT_STREAMS streams are open, or this tenant's MAX_EVENT_STREAMS_PER_TOKEN", "at_capacity"
                ),
            },
        )
    )(events.EvaluationEventsView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_EVALUATIONS],
            summary="Download a file the agent left under /logs/agent",
            description="One of the evaluation's `artifacts`, by its `path` (slashes as they are), as an attachment: "
            "`application/octet-stream`, `nosniff`, its sha256 as the `ETag` (`If-None-Match` answers 304). Only a "
            "listed path is served: any other is 404, and a name that is not safe (empty, `.` or `..` components, "
            f"more than {artifact_store.MAX_PARTS} names, over {artifact_store.MAX_PATH_BYTES} bytes, a control "
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
    )(artifacts.EvaluationArtifactView)
    extend_schema_view(
        get=extend_schema(
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
    )(views.EvaluationListView)
    extend_schema_view(
        post=extend_schema(
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
        ),
        get=extend_schema(
            tags=[TAG_BATCHES],
            summary="List batches, newest first",
            description="A tenant's token lists only the batches it created; an operator's, all.",
            parameters=paging(list(BATCH_STATUSES), "batch_id"),
            responses={
                200: BatchSummarySerializer(many=True),
                400: error("Bad query", "invalid_request"),
                401: UNAUTHORIZED,
            },
        ),
    )(batches.BatchListView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_BATCHES],
            summary="One batch, its tasks, evaluations and rewards",
            parameters=[BATCH_ID],
            responses={200: BatchSerializer, 401: UNAUTHORIZED, 404: NO_BATCH},
        ),
        delete=extend_schema(
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
        ),
    )(batches.BatchDetailView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_BATCHES],
            summary="Follow a batch: server-sent events",
            description=EVENTS_COMMON
            + "Events: `step` and `test` of each of its evaluations, as GET /evaluate/{eval_id}/events sends "
            "them, each with its `eval_id`; `done`, the batch object as GET /batches/{batch_id} returns it. "
            "No log events (`logs=1` is 400: follow one evaluation's). An event's id holds an entry per "
            "evaluation in queue order, run-length encoded.",
            parameters=[BATCH_ID, LAST_EVENT_ID, RETRY_AFTER],
            responses={
                (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description="The event stream"),
                204: OpenApiResponse(description="Last-Event-ID was `done`: the stream had ended; stop reconnecting"),
                400: error("Bad logs or Last-Event-ID", "invalid_request"),
                401: UNAUTHORIZED,
                404: error("No such batch, or another tenant's", "not_found"),
                503: error(
                    "MAX_EVENT_STREAMS streams are open, or this tenant's MAX_EVENT_STREAMS_PER_TOKEN", "at_capacity"
                ),
            },
        )
    )(events.BatchEventsView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_SERVICE],
            summary="The executor-level static assets",
            responses={200: AssetSerializer(many=True), 401: UNAUTHORIZED},
        )
    )(assets.AssetListView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_SERVICE],
            summary="The environments (root filesystems) a task may name",
            description="The folders of ENVIRONMENTS_ROOT that are valid environments, by name, with the "
            "versions of python3 and node found in their files (null when absent). Empty without ENVIRONMENTS_ROOT.",
            responses={200: EnvironmentSerializer(many=True), 401: UNAUTHORIZED},
        )
    )(environments.EnvironmentListView)
    extend_schema_view(
        get=extend_schema(
            tags=[TAG_SERVICE],
            summary="The images this host's store holds",
            description="One row per reference, most recently used first (an image with two tags is two rows; "
            "one no reference names has ref null), read from IMAGES_DIR on each request. Pulls, builds and "
            "imports add images; IMAGES_MAX_BYTES evicts the least recently used.",
            responses={200: ImageSerializer(many=True), 401: UNAUTHORIZED},
        )
    )(images.ImageListView)


def _links_from_eval_id() -> dict:
    """OpenAPI links: the eval_id a response returns feeds the per-evaluation routes (stateful tests use them)."""
    eval_id = {"eval_id": "$response.body#/eval_id"}
    return {
        "GetEvaluation": {"operationId": "evaluate_retrieve", "parameters": eval_id},
        "CancelEvaluation": {"operationId": "evaluate_destroy", "parameters": eval_id},
        "TailLog": {"operationId": "evaluate_logs_retrieve", "parameters": eval_id},
    }


def postprocess(result, generator, request, public):
    """What drf-spectacular cannot say from the serializers: /metrics, links, strict request bodies, the version."""
    result["info"]["version"] = VERSION
    body = result["components"]["schemas"]["EvaluateRequest"]
    body["additionalProperties"] = False  # unknown fields are refused
    body["properties"]["env"]["maxProperties"] = MAX_ENV_NAMES  # (OpenAPI 3.0 has no propertyNames for the rule)
    body["properties"]["agent_code"]["minLength"] = 1
    result["paths"]["/evaluate"]["post"]["responses"]["202"]["links"] = _links_from_eval_id()
    batch = result["components"]["schemas"]["BatchRequest"]
    batch["additionalProperties"] = False
    batch["properties"]["env"]["maxProperties"] = MAX_ENV_NAMES
    batch["properties"]["agent_code"]["minLength"] = 1
    batch["properties"]["task_urls"]["uniqueItems"] = True
    batch_id = {"batch_id": "$response.body#/batch_id"}
    result["paths"]["/batches"]["post"]["responses"]["202"]["links"] = {
        "GetBatch": {"operationId": "batches_retrieve", "parameters": batch_id},
        "CancelBatch": {"operationId": "batches_destroy", "parameters": batch_id},
    }
    result["paths"]["/metrics"] = {
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


document_views()
