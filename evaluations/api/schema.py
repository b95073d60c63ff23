"""The OpenAPI 3 document (drf-spectacular): every route, field, error code and the auth scheme.

1. The views build their JSON by hand (representation.py), so the shapes are
   described here with documentation-only serializers, and attached to the
   views from this module: views.py stays about behaviour.
2. ``ERROR_CODES`` is the one list of the envelope's stable codes; a test
   checks that every code the source raises is in it.
3. /metrics is a plain Django view; a postprocessing hook adds it, and sets
   the document's version to the service's.
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
from rest_framework import serializers

from evaluations import languages
from evaluations.api import assets, batches, environments, logs, views
from evaluations.api.serializers import MAX_ENV_NAMES
from evaluations.models import CacheUse, ErrorKind, Status, Step, TestKind
from evaluations.representation import BATCH_STATUSES

# What generators (schemathesis) should produce: the API refuses other schemes and host-less URLs.
HTTP_URL = r"^https?://[A-Za-z0-9][A-Za-z0-9.-]{0,62}(:[0-9]{1,5})?(/[!-~]*)?$"

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
}

OWNER_HELP = (
    "The tenant (its AUTH_TOKENS name) whose token created it; null when an operator's token (AUTH_TOKEN) did, "
    "when auth is off, and for manage.py evaluate. A tenant's token sees only its own."
)

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
            "and batch. Or a tenant's (AUTH_TOKENS, `name:token,...`): it sees, lists, cancels and retries only "
            "the evaluations and batches it created; any other id answers 404 `not_found`, as one that does not "
            "exist, and its Idempotency-Keys are its own. When both are unset, auth is disabled "
            '(GET /status says `"auth": "disabled"`).',
        }


# -- shapes ------------------------------------------------------------------


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


class HealthSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok"])


class UnhealthySerializer(ErrorSerializer):
    status = serializers.ChoiceField(choices=["unhealthy"])
    checks = serializers.DictField(child=serializers.CharField())


class RuntimesSerializer(serializers.Serializer):
    python = serializers.CharField(allow_null=True, help_text="python3's version, e.g. `3.11.2`; null if absent.")
    node = serializers.CharField(allow_null=True, help_text="node's version, e.g. `20.20.2`; null if absent.")


class EnvironmentSerializer(RuntimesSerializer):
    name = serializers.CharField(help_text="What workspace.yaml `environment:` names.")


class StatusSerializer(serializers.Serializer):
    version = serializers.CharField()
    uptime_secs = serializers.IntegerField(min_value=0)
    active_evals = serializers.IntegerField(min_value=0)
    queued_evals = serializers.IntegerField(min_value=0)
    total_evals = serializers.IntegerField(min_value=0)
    passed = serializers.IntegerField(min_value=0)
    failed = serializers.IntegerField(min_value=0)
    cancelled = serializers.IntegerField(min_value=0)
    capacity = serializers.IntegerField(min_value=0)
    available_slots = serializers.IntegerField(min_value=0)
    workers = serializers.IntegerField(min_value=0)
    sandbox = serializers.ChoiceField(choices=["bwrap", "none"])
    warnings = serializers.ListField(
        child=serializers.CharField(), help_text="What commands are not kept from here (no sandbox, not root)."
    )
    auth = serializers.ChoiceField(choices=["enabled", "disabled"])
    languages = serializers.ListField(child=serializers.CharField())
    static_assets = serializers.IntegerField(
        min_value=0, required=False, help_text="How many executor-level assets GET /assets lists."
    )
    environments = serializers.IntegerField(min_value=0, help_text="How many environments GET /environments lists.")
    runtimes = RuntimesSerializer(help_text="What the host itself offers to tasks that name no environment.")


class AssetSerializer(serializers.Serializer):
    name = serializers.CharField()
    save_path = serializers.CharField()
    kind = serializers.ChoiceField(choices=["file", "dir"])
    size_bytes = serializers.IntegerField(allow_null=True, min_value=0, help_text="null if it vanished since start.")


class AssetSpecSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Relative to STATIC_ASSETS_ROOT.")
    save_path = serializers.CharField(required=False, help_text="Where it appears in the workspace; default `path`.")


class EvaluateRequestSerializer(serializers.Serializer):
    """POST /evaluate's body (validated by evaluations.api.serializers; a test keeps the two in step)."""

    agent_code = serializers.CharField(
        required=False,
        help_text="The agent's source, one file; at most MAX_AGENT_CODE_BYTES UTF-8 bytes. "
        "Exactly one of agent_code and agent_archive.",
    )
    agent_archive = serializers.CharField(
        required=False,
        help_text="Base64 of a .tar.gz or .zip agent project (at most MAX_AGENT_ARCHIVE_BYTES decoded): "
        "the root or a single top folder holds the entry point and an optional requirements.txt "
        "(python) or package.json (node), installed in the step installing_agent.",
    )
    agent_entrypoint = serializers.CharField(
        required=False,
        help_text="With agent_archive: the entry point's relative path in the project root (the archive's "
        "root, or its single top folder); by default agent.py or main.py (python), agent.sh (bash), "
        "agent.js or index.js (node).",
    )
    agent_language = serializers.ChoiceField(
        choices=list(languages.available()),
        required=False,
        default="python",
        help_text="One of GET /status `languages`: the interpreters this host has.",
    )
    task_url = serializers.RegexField(
        HTTP_URL, max_length=2048, help_text="http(s) URL of the task archive (file:// only with ALLOW_FILE_URLS)."
    )
    timeout_secs = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, help_text="Agent timeout, 1 to AGENT_TIMEOUT_SECS."
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text="Agent environment: at most 64 names [A-Z_][A-Z0-9_]*, 64 KiB; reserved names are refused.",
    )
    static_assets = serializers.DictField(child=AssetSpecSerializer(), required=False, allow_null=True)
    callback_url = serializers.RegexField(
        HTTP_URL, max_length=2048, required=False, allow_blank=True, help_text="POSTed the final evaluation."
    )
    metadata = serializers.DictField(required=False, allow_null=True, help_text="At most 4 KiB; echoed back.")


class BatchRequestSerializer(serializers.Serializer):
    """POST /batches' body (validated by evaluations.api.serializers; a test keeps the two in step)."""

    agent_code = EvaluateRequestSerializer._declared_fields["agent_code"]
    agent_archive = EvaluateRequestSerializer._declared_fields["agent_archive"]
    agent_entrypoint = EvaluateRequestSerializer._declared_fields["agent_entrypoint"]
    agent_language = EvaluateRequestSerializer._declared_fields["agent_language"]
    task_urls = serializers.ListField(
        child=serializers.RegexField(HTTP_URL, max_length=2048),
        min_length=1,
        help_text="1 to MAX_BATCH_TASKS distinct task URLs, each as POST /evaluate's task_url; one bad URL "
        "refuses the whole batch. Their evaluations queue in this order.",
    )
    timeout_secs = EvaluateRequestSerializer._declared_fields["timeout_secs"]
    env = EvaluateRequestSerializer._declared_fields["env"]
    callback_url = serializers.RegexField(
        HTTP_URL,
        max_length=2048,
        required=False,
        allow_blank=True,
        help_text="POSTed the batch object (GET /batches/{batch_id}) once, when the batch ends.",
    )
    metadata = EvaluateRequestSerializer._declared_fields["metadata"]


class BatchAcceptedSerializer(serializers.Serializer):
    batch_id = serializers.UUIDField()
    eval_ids = serializers.ListField(child=serializers.UUIDField(), help_text="In task_urls order.")
    status = serializers.ChoiceField(choices=BATCH_STATUSES)


class BatchCancelledSerializer(serializers.Serializer):
    batch_id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=[Status.CANCELLED])


class BatchEvaluationSerializer(serializers.Serializer):
    eval_id = serializers.UUIDField()
    task_url = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    passed = serializers.BooleanField(allow_null=True)
    error_kind = serializers.ChoiceField(
        choices=ErrorKind.choices, allow_null=True, help_text="Why it did not pass; null while running or when passed."
    )


class BatchSummarySerializer(serializers.Serializer):
    batch_id = serializers.UUIDField()
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)
    status = serializers.ChoiceField(
        choices=BATCH_STATUSES,
        help_text="pending: none started; running: one started; completed: all ended; cancelled: DELETE asked "
        "(finished_at is set once its running evaluations stopped).",
    )
    total = serializers.IntegerField(min_value=0)
    finished = serializers.IntegerField(min_value=0)
    passed = serializers.IntegerField(min_value=0)
    failed = serializers.IntegerField(min_value=0)
    cancelled = serializers.IntegerField(min_value=0)
    reward = serializers.FloatField(allow_null=True, help_text="passed / total once all ended, else null.")
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class BatchSerializer(BatchSummarySerializer):
    evaluations = BatchEvaluationSerializer(many=True)


class AcceptedSerializer(serializers.Serializer):
    eval_id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Status.choices)


class RetryAcceptedSerializer(AcceptedSerializer):
    retry_of = serializers.UUIDField(help_text="The evaluation whose request the new one repeats.")


ERROR_KIND_HELP = (
    "Why it did not pass (null while pending or running, and when it passed): "
    "`tests_failed` the tests ran and at least one failed or timed out; `agent_timeout` the agent used its "
    "whole time budget; `limit_exceeded` memory, disk or processes over a limit; `agent_invalid` a broken "
    "agent archive or agent install; `task_invalid` the task's fault (malformed archive, missing commit, "
    "failing install, no tests); `infrastructure` neither's (network failure fetching, worker lost, shutdown, "
    "internal error, host disk full): retry those; `cancelled` DELETE, a cancelled batch, the session TTL."
)


class TestResultSerializer(serializers.Serializer):
    __test__ = False  # not a pytest test class

    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=TestKind.choices)
    passed = serializers.BooleanField()
    exit_code = serializers.IntegerField(allow_null=True)
    timed_out = serializers.BooleanField()
    duration_ms = serializers.IntegerField()
    output = serializers.CharField(allow_blank=True)


class TransitionSerializer(serializers.Serializer):
    step = serializers.ChoiceField(choices=Step.choices)
    status = serializers.ChoiceField(choices=Status.choices)
    at = serializers.DateTimeField()
    duration_ms = serializers.IntegerField(allow_null=True, help_text="Time spent there; null for the latest.")


class EgressSerializer(serializers.Serializer):
    step = serializers.ChoiceField(choices=Step.choices)
    host = serializers.CharField()
    port = serializers.IntegerField()
    allowed = serializers.BooleanField(help_text="Whether the connection was made.")
    reason = serializers.CharField(
        help_text="e.g. allowed, allowed by EGRESS_ALLOW, private address, denied by EGRESS_DENY"
    )
    bytes_out = serializers.IntegerField()
    bytes_in = serializers.IntegerField()
    count = serializers.IntegerField(help_text="Connections aggregated in this entry.")


class ResourcesSerializer(serializers.Serializer):
    peak_memory_bytes = serializers.IntegerField()
    cpu_seconds = serializers.FloatField()
    peak_processes = serializers.IntegerField()
    peak_disk_bytes = serializers.IntegerField()
    peak_files = serializers.IntegerField(
        required=False,
        help_text="Most files and folders the session held at once (MAX_FILES counts them); "
        "absent for evaluations that ended before it was recorded.",
    )


class EvaluationSerializer(serializers.Serializer):
    eval_id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Status.choices)
    step = serializers.ChoiceField(choices=Step.choices)
    passed = serializers.BooleanField(allow_null=True, help_text="null until the evaluation ends.")
    error = serializers.CharField(allow_null=True, help_text="One sentence naming the step and the cause.")
    error_kind = serializers.ChoiceField(choices=ErrorKind.choices, allow_null=True, help_text=ERROR_KIND_HELP)
    duration_ms = serializers.IntegerField(allow_null=True)
    task_url = serializers.CharField()
    language = serializers.CharField()
    agent_sha256 = serializers.CharField(
        allow_null=True,
        help_text="sha256 of the agent: of agent_code's UTF-8 bytes, or of agent_archive's decoded bytes. "
        "The agent itself is never returned.",
    )
    metadata = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    test_results = TestResultSerializer(many=True)
    agent_output = serializers.CharField(allow_blank=True)
    agent_exit_code = serializers.IntegerField(allow_null=True)
    agent_patch = serializers.CharField(allow_blank=True)
    test_output = serializers.CharField(allow_blank=True)
    transitions = TransitionSerializer(many=True)
    results_sha256 = serializers.CharField(allow_null=True)
    egress = EgressSerializer(
        many=True, help_text="Every proxied connection, refused ones too, per (step, host, port, allowed)."
    )
    resources = ResourcesSerializer(
        allow_null=True, help_text="What the evaluation used (from its cgroup where there is one); null until it ends."
    )
    cache = serializers.ChoiceField(
        choices=CacheUse.choices,
        allow_null=True,
        help_text="hit: started from a workspace snapshot (no clone, no install); miss: cloned and installed; "
        "off: the cache was not used (WORKSPACE_CACHE=off, workspace.yaml `cache: false`). null before cloning_repo.",
    )
    retry_of = serializers.UUIDField(
        allow_null=True, help_text="The evaluation this one re-runs (POST /evaluate/{id}/retry, the admin's re-run)."
    )
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)


class EvaluationSummarySerializer(serializers.Serializer):
    eval_id = serializers.UUIDField()
    task_url = serializers.CharField()
    language = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    passed = serializers.BooleanField(allow_null=True)
    created_at = serializers.DateTimeField()
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)


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
            description="Its evaluations queue beside the others, in task_urls order; they do not count "
            "against MAX_QUEUED_EVALS, the batches do against MAX_OPEN_BATCHES (unfinished batches).",
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
            summary="One batch, its evaluations and reward",
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
    result["info"]["version"] = views.VERSION
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
