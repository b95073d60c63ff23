"""The API's responses as OpenAPI shapes (drf-spectacular): documentation-only serializers.

1. The views build their JSON by hand (representation.py), so these serializers never
   serialize anything: they only describe it. Request bodies are described by the real
   serializers (evaluations/api/serializers.py); the routes are wired in openapi.py.
2. ``ERROR_CODES`` is the one list of the envelope's stable codes; a test checks that
   every code the source raises is in it.
"""

from __future__ import annotations

from rest_framework import serializers

from evaluations.models import CacheUse, ErrorKind, Status, Step, TestKind
from evaluations.representation import BATCH_STATUSES

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


class ImageSerializer(serializers.Serializer):
    ref = serializers.CharField(
        allow_null=True,
        help_text="A reference to the image in its canonical form (`docker.io/library/python:3.12-slim`); an "
        "image with two tags is two rows; null for an image no reference names (built without a tag, imported "
        "from an untagged archive).",
    )
    digest = serializers.CharField(
        help_text="The image's manifest digest, `sha256:...` (a built image's: of its manifest)."
    )
    size_bytes = serializers.IntegerField(
        min_value=0, help_text="Its unpacked layers' bytes (shared layers counted in each)."
    )
    last_used_at = serializers.DateTimeField(help_text="Last pulled, built, imported or used by an evaluation.")


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


class BatchAcceptedSerializer(serializers.Serializer):
    batch_id = serializers.UUIDField()
    eval_ids = serializers.ListField(
        child=serializers.UUIDField(),
        help_text="In queue order: attempt 1 of every task URL in task_urls order, then attempt 2, and so on.",
    )
    status = serializers.ChoiceField(choices=BATCH_STATUSES)


class BatchCancelledSerializer(serializers.Serializer):
    batch_id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=[Status.CANCELLED])


class BatchEvaluationSerializer(serializers.Serializer):
    eval_id = serializers.UUIDField()
    task_url = serializers.CharField()
    attempt = serializers.IntegerField(min_value=1, help_text="Which run of its task URL this is, from 1.")
    status = serializers.ChoiceField(choices=Status.choices)
    passed = serializers.BooleanField(allow_null=True)
    reward = serializers.FloatField(allow_null=True, help_text="As the evaluation's reward.")
    error_kind = serializers.ChoiceField(
        choices=ErrorKind.choices, allow_null=True, help_text="Why it did not pass; null while running or when passed."
    )


class SignatureSerializer(serializers.Serializer):
    key_id = serializers.CharField(help_text="The key it was made with: GET /public-key lists it.")
    alg = serializers.ChoiceField(choices=["ed25519"])
    value = serializers.CharField(help_text="The Ed25519 signature, base64.")
    fields = serializers.ListField(
        child=serializers.CharField(),
        help_text="The object's fields it covers: the signature is over the RFC 8785 canonical JSON of the object "
        "with only these kept (docs/signatures.md).",
    )


SIGNATURE_HELP = "SPEC §18: Ed25519 over the ended object's listed fields; null until it ended."
EXECUTOR_VERSION_HELP = (
    "The executor version that ended it; null until then, and for ones ended before results were signed."
)


class PublicKeySerializer(serializers.Serializer):
    key_id = serializers.CharField(help_text="The first 16 hex digits of the sha256 of the raw 32-byte key.")
    alg = serializers.ChoiceField(choices=["ed25519"])
    public_key_pem = serializers.CharField(help_text="SubjectPublicKeyInfo PEM.")
    created_at = serializers.DateTimeField()


class PublicKeysSerializer(serializers.Serializer):
    keys = PublicKeySerializer(
        many=True, help_text="The current key first, then every earlier one, so results they signed still verify."
    )


class BatchSummarySerializer(serializers.Serializer):
    batch_id = serializers.UUIDField()
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)
    status = serializers.ChoiceField(
        choices=BATCH_STATUSES,
        help_text="pending: none started; running: one started; completed: all ended; cancelled: DELETE asked "
        "(finished_at is set once its running evaluations stopped).",
    )
    attempts = serializers.IntegerField(min_value=1, help_text="How many times each task URL runs (pass@k's k).")
    total = serializers.IntegerField(min_value=0, help_text="Evaluations: task URLs x attempts.")
    finished = serializers.IntegerField(min_value=0)
    passed = serializers.IntegerField(min_value=0)
    failed = serializers.IntegerField(min_value=0)
    cancelled = serializers.IntegerField(min_value=0)
    reward = serializers.FloatField(allow_null=True, help_text="passed / total once all ended, else null.")
    mean_reward = serializers.FloatField(
        allow_null=True,
        help_text="The mean of the evaluations' rewards, a null reward counting 0, once all ended; else null.",
    )
    pass_at_k = serializers.FloatField(
        allow_null=True,
        help_text="The share of task URLs one of whose attempts passed (the mean of tasks' pass_at_k), once all "
        "ended; else null.",
    )
    agent_sha256 = serializers.CharField(allow_null=True, help_text="sha256 of the batch's agent.")
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    executor_version = serializers.CharField(allow_null=True, help_text=EXECUTOR_VERSION_HELP)


class BatchTaskSerializer(serializers.Serializer):
    task_url = serializers.CharField()
    attempts = serializers.IntegerField(min_value=1, help_text="Its evaluations in this batch.")
    passes = serializers.IntegerField(min_value=0, help_text="Those that passed so far.")
    pass_at_k = serializers.FloatField(
        allow_null=True, help_text="1 if an attempt passed, else 0; null until every attempt of it ended."
    )
    mean_reward = serializers.FloatField(
        allow_null=True,
        help_text="The mean of its attempts' rewards, a null reward counting 0; null until every attempt ended.",
    )


class BatchSerializer(BatchSummarySerializer):
    tasks = BatchTaskSerializer(many=True, help_text="One per task URL, in task_urls order (not in GET /batches).")
    evaluations = BatchEvaluationSerializer(many=True, help_text="In queue order, as eval_ids.")
    signature = SignatureSerializer(allow_null=True, help_text=SIGNATURE_HELP + " Not in GET /batches.")


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


class EvaluationEnvironmentSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=["host", "name", "image", "dockerfile"],
        help_text="host: the executor's own system folders; name: an environment under ENVIRONMENTS_ROOT; "
        "image: an image pulled from a registry; dockerfile: an image built from the task's Dockerfile.",
    )
    ref = serializers.CharField(
        allow_null=True, help_text="The environment's name, the image reference or the Dockerfile's path."
    )
    digest = serializers.CharField(
        allow_null=True, help_text="The image's manifest digest (sha256:...); null for host and name."
    )
    cached = serializers.BooleanField(
        help_text="The image was in the store already (a pull or build that fetched or ran nothing)."
    )
    rewritten_from = serializers.CharField(
        required=False,
        help_text="An image task whose reference IMAGE_REWRITES replaced: the task's reference (ref is the one pulled).",
    )
    rewrites = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        required=False,
        help_text="A Dockerfile's FROM / COPY --from images IMAGE_REWRITES replaced: [{ref, rewritten_from}].",
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
    task_sha256 = serializers.CharField(
        allow_null=True, help_text="sha256 of the task archive as downloaded; null before downloading_task."
    )
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
    agent_patch_sha256 = serializers.CharField(
        allow_null=True, help_text="sha256 of agent_patch's UTF-8; null if empty."
    )
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
    environment = EvaluationEnvironmentSerializer(
        allow_null=True, help_text="What the task's commands ran in (SPEC §16); null before preparing_environment."
    )
    retry_of = serializers.UUIDField(
        allow_null=True, help_text="The evaluation this one re-runs (POST /evaluate/{id}/retry, the admin's re-run)."
    )
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)
    reward = serializers.FloatField(
        allow_null=True,
        help_text="SPEC §17: the reward file's headline (grader reward_file), else 1.0 passed, 0.0 tests failed; "
        "null when nothing was graded.",
    )
    rewards = serializers.DictField(
        child=serializers.FloatField(), allow_null=True, help_text="The task's reward.json (or {reward: n}) as read."
    )
    task_format = serializers.ChoiceField(
        choices=["workspace", "harbor", "terminal-bench"], allow_null=True, help_text="null before downloading_task."
    )
    limits_applied = serializers.DictField(
        allow_null=True,
        help_text="What a Harbor or Terminal-Bench task asked for, capped by the operator's settings (the smaller "
        "wins): agent_timeout_secs, verifier_timeout_secs, build_timeout_secs, cpus, memory_mb, storage_mb, "
        "network, allowed_hosts.",
    )
    task_metadata = serializers.DictField(
        allow_null=True,
        help_text="What the task says about itself: task.toml's [metadata] and its unknown keys (Harbor), "
        "workspace.yaml's difficulty, difficulty_score and install_config (SWE-Forge).",
    )
    system_changes = serializers.DictField(
        allow_null=True,
        help_text="In an image: {count, paths (the first 200, sorted), suspicious}: what the agent created, changed "
        "or removed outside its working directory and /logs/agent.",
    )
    artifacts = serializers.ListField(
        child=serializers.DictField(),
        help_text="Files the agent left under /logs/agent, kept: [{path, size_bytes, sha256}]; "
        "GET /evaluate/{id}/artifacts/{path} serves one.",
    )
    test_counts = serializers.DictField(
        allow_null=True,
        help_text="SPEC §19, a task graded by SWE-bench's rules: per kind (fail_to_pass, pass_to_pass) the ids' "
        "total, passed, failed and missing (not in the log); test_results holds at most MAX_TESTS of them.",
    )
    batch_id = serializers.UUIDField(allow_null=True, help_text="The batch this evaluation is part of.")
    attempt = serializers.IntegerField(help_text="Which run of its task URL this is within its batch, from 1.")
    executor_version = serializers.CharField(allow_null=True, help_text=EXECUTOR_VERSION_HELP)
    signature = SignatureSerializer(allow_null=True, help_text=SIGNATURE_HELP)


class EvaluationSummarySerializer(serializers.Serializer):
    eval_id = serializers.UUIDField()
    task_url = serializers.CharField()
    language = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    passed = serializers.BooleanField(allow_null=True)
    created_at = serializers.DateTimeField()
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)
