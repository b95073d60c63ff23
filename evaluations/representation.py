"""The evaluation object of SPEC §2 and the batch object of SPEC §14, as the API, callbacks, the
admin and the CLI show them: each declared once, as a ``Shape``.

1. A ``Shape`` is a DRF serializer whose fields say what each key holds (drf-spectacular makes the
   OpenAPI component of it: the views' ``extend_schema`` name these classes) and how its value is
   read (``shown``). ``build`` makes the object from those fields and nothing else, so the object
   served and the component described cannot differ in their keys: a new field is one line here
   (and, for the evaluation object, its column in EVALUATION_COLUMNS, which GET /evaluate/{id} reads).
2. ``build`` never runs DRF's serializing machinery (a deepcopy of every field per instance):
   GET /evaluate/{id} is what platforms poll, and the values are already JSON (rows.py's reads).
3. Nested JSON the pipeline stores (egress, resources, environment, signature) is shown as stored;
   its serializers here only describe it (tests/api/test_representation.py validates real ones).
"""

from __future__ import annotations

import hashlib
from itertools import repeat
from operator import attrgetter, call

from django.db.models import Count, Exists, OuterRef, Q, Sum, Value
from django.db.models.functions import Coalesce
from rest_framework import serializers

from evaluations import signing
from evaluations.models import ACTIVE_STATUSES, Batch, CacheUse, ErrorKind, Evaluation, Status, Step, TestKind

# The columns the evaluation object shows, for readers that fetch only those (evaluations/db/rows.py).
EVALUATION_COLUMNS = (
    "id", "status", "step", "passed", "error", "duration_ms", "task_url", "language", "agent_sha256", "metadata",
    "created_at",
    "started_at", "finished_at", "agent_output", "agent_exit_code", "agent_patch", "test_output", "results_sha256",
    "egress", "resources", "error_kind", "retry_of_id", "owner", "environment", "reward", "rewards", "task_format",
    "limits_applied", "task_metadata", "system_changes", "artifacts", "attempt", "batch_id", "test_counts",
    "task_sha256", "executor_version", "signature",
    "cache", "steps",
)  # fmt: skip
# The columns the signed fields (signing.EVALUATION_FIELDS) read: what lifecycle's seal reads, with the
# digest of agent_patch instead of the patch and the tests' rows (evaluation_signature).
SIGNED_COLUMNS = (
    "id", "task_url", "task_sha256", "agent_sha256", "environment", "status", "passed", "reward", "rewards",
    "error_kind", "created_at", "started_at", "finished_at", "executor_version", "batch_id", "attempt",
    "system_changes", "limits_applied", "artifacts", "owner", "steps",
)  # fmt: skip
TRANSITION_COLUMNS = ("step", "status", "at", "duration_ms")
TEST_RESULT_COLUMNS = ("name", "kind", "passed", "exit_code", "timed_out", "duration_ms", "output")


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


# -- shapes ---------------------------------------------------------------------------------------

GIVEN = object()  # a field whose value ``build``'s caller passes (a count, a nested list)


def shown(field: serializers.Field, read) -> serializers.Field:
    """``field`` (what the key holds), its value read from the source by ``read``. A field declared
    without ``shown`` or ``given`` is the source's attribute of its name."""
    field.read = read
    return field


def given(field: serializers.Field) -> serializers.Field:
    """``field``, its value passed to ``build`` by the caller, not read from the source."""
    return shown(field, GIVEN)


# An object the API shows, declared once (the module's docstring). No docstring: drf-spectacular would
# make it every subclass's description.
class Shape(serializers.Serializer):
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The Field objects as declared, a base class's first: Serializer.fields deep-copies them
        # (dropping ``read``) for every instance (docs/internals.md, row shape-declared-fields).
        readers = {name: getattr(field, "read", attrgetter(name)) for name, field in cls._declared_fields.items()}
        cls._keys = tuple(readers)
        cls._read = {name: read for name, read in readers.items() if read is not GIVEN}
        cls._given = frozenset(readers) - cls._read.keys()

    @classmethod
    def build(cls, source=None, /, **values) -> dict:
        """The object, keys in declared order: each read from ``source`` or passed in ``values``.

        Three passes in C (no Python loop over the fields: one cost GET /evaluate/{id} 7 % more
        bytecodes, bench/profile_http.py --bytecodes): the keys in order, the values read, those given.
        """
        if values.keys() != cls._given:
            raise TypeError(f"{cls.__name__}.build takes {sorted(cls._given)}, not {sorted(values)}")
        body = dict.fromkeys(cls._keys)
        body.update(zip(cls._read, map(call, cls._read.values(), repeat(source)), strict=True))
        body.update(values)
        return body

    @classmethod
    def build_only(cls, keys, source=None, /, **values) -> dict:
        """Only ``keys`` of the object (what a signature covers): each from ``values`` if there, else read
        from ``source``, as ``build`` reads it. ``source`` need hold only what those keys read."""
        missing = [key for key in keys if key not in values and key not in cls._read]
        if missing or not values.keys() <= set(keys):
            raise TypeError(f"{cls.__name__}.build_only of {list(keys)} takes {sorted(missing)}, not {sorted(values)}")
        return {key: values[key] if key in values else cls._read[key](source) for key in keys}


def _str_or_none(name: str):
    """The attribute as a string (a UUID's hex form), or None when it is unset."""
    return lambda source: str(value) if (value := getattr(source, name)) else None


def _or_none(name: str):
    """The attribute, or None when it is empty (a column that stores "" for not yet known)."""
    return lambda source: getattr(source, name) or None


def _iso(name: str):
    return lambda source: iso(getattr(source, name))


# -- the evaluation object ------------------------------------------------------------------------

OWNER_HELP = (
    "The tenant (its AUTH_TOKENS name) whose token created it; null when an operator's token (AUTH_TOKEN) did, "
    "when auth is off, and for manage.py evaluate. A tenant's token sees only its own."
)
SIGNATURE_HELP = "SPEC §18: Ed25519 over the ended object's listed fields; null until it ended."
EXECUTOR_VERSION_HELP = (
    "The executor version that ended it; null until then, and for ones ended before results were signed."
)
ERROR_KIND_HELP = (
    "Why it did not pass (null while pending or running, and when it passed): "
    "`tests_failed` the tests ran and at least one failed or timed out; `agent_timeout` the agent used its "
    "whole time budget; `limit_exceeded` memory, disk or processes over a limit; `agent_invalid` a broken "
    "agent archive or agent install; `task_invalid` the task's fault (malformed archive, missing commit, "
    "failing install, no tests); `infrastructure` neither's (network failure fetching, worker lost, shutdown, "
    "internal error, host disk full): retry those; `cancelled` DELETE, a cancelled batch, the session TTL."
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


class TestResultSerializer(Shape):
    __test__ = False  # not a pytest test class

    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=TestKind.choices)
    passed = serializers.BooleanField()
    exit_code = serializers.IntegerField(allow_null=True)
    timed_out = serializers.BooleanField()
    duration_ms = serializers.IntegerField()
    output = serializers.CharField(allow_blank=True)


class TransitionSerializer(Shape):
    step = serializers.ChoiceField(choices=Step.choices)
    status = serializers.ChoiceField(choices=Status.choices)
    at = shown(serializers.DateTimeField(), _iso("at"))
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


class TaskStepSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The step's name (task.toml [[steps]] name).")
    reward = serializers.FloatField(allow_null=True, help_text="Its reward file's headline; null when it gave none.")
    rewards = serializers.DictField(
        child=serializers.FloatField(), allow_null=True, help_text="Its reward.json (or {reward: n}) as read."
    )
    passed = serializers.BooleanField(help_text="Its reward is at least 1.")
    duration_ms = serializers.IntegerField(help_text="From its agent's start to its verifier's end.")


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
    verifier = serializers.DictField(
        required=False,
        help_text="SPEC §23, a Harbor task's separate verifier: its own image's {kind, ref, digest, cached} "
        "(and rewritten_from or rewrites), as the agent's.",
    )
    verifiers = serializers.DictField(
        required=False,
        help_text="SPEC §23, a Harbor task of [[steps]]: each separate step verifier's image, by step name, "
        "as verifier is (a step whose verifier shares the agent's environment is not there).",
    )


def _sha256(text: str | None) -> str | None:
    """Of the text's UTF-8 (surrogates as they are: an agent's output may hold any bytes); null when empty."""
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest() if text else None


class EvaluationSerializer(Shape):
    eval_id = shown(serializers.UUIDField(), _str_or_none("id"))
    status = serializers.ChoiceField(choices=Status.choices)
    step = serializers.ChoiceField(choices=Step.choices)
    passed = serializers.BooleanField(allow_null=True, help_text="null until the evaluation ends.")
    reward = serializers.FloatField(
        allow_null=True,
        help_text="SPEC §17: the reward file's headline (grader reward_file), else 1.0 passed, 0.0 tests failed; "
        "null when nothing was graded.",
    )
    rewards = serializers.DictField(
        child=serializers.FloatField(), allow_null=True, help_text="The task's reward.json (or {reward: n}) as read."
    )
    error = shown(
        serializers.CharField(allow_null=True, help_text="One sentence naming the step and the cause."),
        _or_none("error"),
    )
    error_kind = serializers.ChoiceField(choices=ErrorKind.choices, allow_null=True, help_text=ERROR_KIND_HELP)
    duration_ms = serializers.IntegerField(allow_null=True)
    task_url = serializers.CharField()
    task_sha256 = shown(
        serializers.CharField(
            allow_null=True, help_text="sha256 of the task archive as downloaded; null before downloading_task."
        ),
        _or_none("task_sha256"),
    )
    task_format = shown(
        serializers.ChoiceField(
            choices=["workspace", "harbor", "terminal-bench"],
            allow_null=True,
            help_text="null before downloading_task.",
        ),
        _or_none("task_format"),
    )
    language = serializers.CharField()
    agent_sha256 = shown(
        serializers.CharField(
            allow_null=True,
            help_text="sha256 of the agent: of agent_code's UTF-8 bytes, or of agent_archive's decoded bytes. "
            "The agent itself is never returned.",
        ),
        _or_none("agent_sha256"),
    )
    metadata = serializers.JSONField(allow_null=True)
    created_at = shown(serializers.DateTimeField(), _iso("created_at"))
    started_at = shown(serializers.DateTimeField(allow_null=True), _iso("started_at"))
    finished_at = shown(serializers.DateTimeField(allow_null=True), _iso("finished_at"))
    test_results = given(TestResultSerializer(many=True))
    agent_output = serializers.CharField(allow_blank=True)
    agent_exit_code = serializers.IntegerField(allow_null=True)
    agent_patch = serializers.CharField(allow_blank=True)
    agent_patch_sha256 = shown(
        serializers.CharField(allow_null=True, help_text="sha256 of agent_patch's UTF-8; null if empty."),
        lambda evaluation: _sha256(evaluation.agent_patch),
    )
    test_output = serializers.CharField(allow_blank=True)
    transitions = given(TransitionSerializer(many=True))
    results_sha256 = shown(serializers.CharField(allow_null=True), _or_none("results_sha256"))
    egress = shown(
        EgressSerializer(
            many=True, help_text="Every proxied connection, refused ones too, per (step, host, port, allowed)."
        ),
        lambda evaluation: evaluation.egress or [],
    )
    resources = ResourcesSerializer(
        allow_null=True, help_text="What the evaluation used (from its cgroup where there is one); null until it ends."
    )
    cache = shown(
        serializers.ChoiceField(
            choices=CacheUse.choices,
            allow_null=True,
            help_text="hit: started from a workspace snapshot (no clone, no install); miss: cloned and installed; "
            "off: the cache was not used (WORKSPACE_CACHE=off, workspace.yaml `cache: false`). "
            "null before cloning_repo.",
        ),
        _or_none("cache"),
    )
    environment = EvaluationEnvironmentSerializer(
        allow_null=True, help_text="What the task's commands ran in (SPEC §16); null before preparing_environment."
    )
    limits_applied = serializers.DictField(
        allow_null=True,
        help_text="What a Harbor or Terminal-Bench task asked for, capped by the operator's settings (the smaller "
        "wins): agent_timeout_secs, verifier_timeout_secs, build_timeout_secs, cpus, memory_mb, storage_mb, "
        "network, allowed_hosts ([environment]'s); per phase agent_network_mode, agent_allowed_hosts, "
        "verifier_network_mode, verifier_allowed_hosts (the task's [agent]/[verifier] over [environment]'s) and "
        "agent_network, verifier_network (whether the phase's commands had the network at all); "
        "verifier_memory_mb (a separate verifier's, SPEC §23).",
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
    steps = TaskStepSerializer(
        many=True,
        allow_null=True,
        help_text="SPEC §23, a Harbor task of [[steps]]: each step run, in order (those after a step that stopped "
        "the rest are absent); reward and rewards are then the task's by its multi_step_reward_strategy (mean, "
        "final). null for a task of one step.",
    )
    test_counts = serializers.DictField(
        allow_null=True,
        help_text="SPEC §19, a task graded by SWE-bench's rules: per kind (fail_to_pass, pass_to_pass) the ids' "
        "total, passed, failed and missing (not in the log); test_results holds at most MAX_TESTS of them.",
    )
    artifacts = shown(
        serializers.ListField(
            child=serializers.DictField(),
            help_text="Files the agent left under /logs/agent, kept: [{path, size_bytes, sha256}], and (SPEC §23) "
            "under /logs/artifacts and at the task's artifacts paths, listed under artifacts/; "
            "GET /evaluate/{id}/artifacts/{path} serves one.",
        ),
        lambda evaluation: evaluation.artifacts or [],
    )
    batch_id = shown(
        serializers.UUIDField(allow_null=True, help_text="The batch this evaluation is part of."),
        _str_or_none("batch_id"),
    )
    attempt = serializers.IntegerField(help_text="Which run of its task URL this is within its batch, from 1.")
    retry_of = shown(
        serializers.UUIDField(
            allow_null=True,
            help_text="The evaluation this one re-runs (POST /evaluate/{id}/retry, the admin's re-run).",
        ),
        _str_or_none("retry_of_id"),
    )
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)
    executor_version = shown(
        serializers.CharField(allow_null=True, help_text=EXECUTOR_VERSION_HELP), _or_none("executor_version")
    )
    signature = SignatureSerializer(allow_null=True, help_text=SIGNATURE_HELP)


def evaluation_json(evaluation: Evaluation) -> dict:
    return evaluation_document(evaluation, evaluation.transitions.all(), evaluation.test_results.all())


def evaluation_document(evaluation, transitions, test_results) -> dict:
    """The evaluation object from anything with the *_COLUMNS attributes: model instances or rows.

    SPEC §18: an ended evaluation's ``signature`` is the one lifecycle.finish stored; one that ended
    without (before signatures, or finish's own first read) is signed here, not stored: Ed25519
    signatures are deterministic, so each read gives the same value while the row and key stay.
    """
    body = EvaluationSerializer.build(
        evaluation,
        test_results=[TestResultSerializer.build(result) for result in test_results],
        transitions=[TransitionSerializer.build(transition) for transition in transitions],
    )
    if body["signature"] is None and evaluation.status not in ACTIVE_STATUSES:
        body["signature"] = signing.sign_if_possible(body, signing.EVALUATION_FIELDS)
    return body


def evaluation_signature(row, test_results, agent_patch_sha256: str | None) -> dict | None:
    """SPEC §18: an ended evaluation's signature made from only what it covers (lifecycle's seal):
    ``row`` has the SIGNED_COLUMNS, ``test_results`` the tests' TEST_RESULT_COLUMNS and
    ``agent_patch_sha256`` is the digest of its patch, so no large text column (the agent's output,
    the patch, the test output) is read or rendered for it. The signature ``evaluation_document``
    makes of the whole object, byte for byte: both sign only these fields, read the same way."""
    signed = EvaluationSerializer.build_only(
        signing.EVALUATION_FIELDS,
        row,
        test_results=[TestResultSerializer.build(result) for result in test_results],
        agent_patch_sha256=agent_patch_sha256,
    )
    return signing.sign_if_possible(signed, signing.EVALUATION_FIELDS)


# One row of GET /evaluations.
class EvaluationSummarySerializer(Shape):
    eval_id = shown(serializers.UUIDField(), _str_or_none("id"))
    task_url = serializers.CharField()
    language = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    passed = serializers.BooleanField(allow_null=True)
    created_at = shown(serializers.DateTimeField(), _iso("created_at"))
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)


def evaluation_summary(evaluation: Evaluation) -> dict:
    return EvaluationSummarySerializer.build(evaluation)


# -- the batch object ---------------------------------------------------------------------------


def _batch_status(batch: Batch, *, ended: bool, started: bool) -> str:
    """completed as soon as every evaluation ended: settle's finished_at follows a moment later."""
    if batch.cancel_requested:
        return Status.CANCELLED
    if batch.finished_at is not None:
        return batch.status
    if ended:
        return Status.COMPLETED
    return Status.RUNNING if started else Status.PENDING


BATCH_STATUSES = (Status.PENDING, Status.RUNNING, Status.COMPLETED, Status.CANCELLED)


def batches_with_status(queryset, status: str):
    """GET /batches?status=: the batches _batch_status shows as ``status``."""
    if status == Status.CANCELLED:
        return queryset.filter(cancel_requested=True)
    queryset = queryset.filter(cancel_requested=False)
    if status == Status.COMPLETED:
        return queryset.filter(finished_at__isnull=False)
    started = Evaluation.objects.filter(batch_id=OuterRef("pk")).exclude(status=Status.PENDING)
    queryset = queryset.filter(finished_at__isnull=True)
    return queryset.filter(Exists(started)) if status == Status.RUNNING else queryset.filter(~Exists(started))


def batch_summaries(queryset):
    """Batches with their counts, for GET /batches' rows (batch_summary): one query, no evaluation rows."""
    active = Q(evaluations__status__in=list(ACTIVE_STATUSES))
    return queryset.annotate(
        total=Count("evaluations"),
        finished=Count("evaluations", filter=~active),
        started=Count("evaluations", filter=~Q(evaluations__status=Status.PENDING)),
        passed_count=Count("evaluations", filter=Q(evaluations__passed=True)),
        failed=Count("evaluations", filter=Q(evaluations__status=Status.FAILED)),
        cancelled=Count("evaluations", filter=Q(evaluations__status=Status.CANCELLED)),
        reward_sum=Sum(Coalesce("evaluations__reward", Value(0.0))),
        task_count=Count("evaluations__task_url", distinct=True),
        tasks_passed=Count("evaluations__task_url", distinct=True, filter=Q(evaluations__passed=True)),
    ).defer("agent_code", "env", "metadata")


# One row of GET /batches: the batch object without its tasks, evaluations and signature.
class BatchSummarySerializer(Shape):
    batch_id = shown(serializers.UUIDField(), _str_or_none("id"))
    owner = serializers.CharField(allow_null=True, help_text=OWNER_HELP)
    status = given(
        serializers.ChoiceField(
            choices=BATCH_STATUSES,
            help_text="pending: none started; running: one started; completed: all ended; cancelled: DELETE asked "
            "(finished_at is set once its running evaluations stopped).",
        )
    )
    attempts = serializers.IntegerField(min_value=1, help_text="How many times each task URL runs (pass@k's k).")
    total = given(serializers.IntegerField(min_value=0, help_text="Evaluations: task URLs x attempts."))
    finished = given(serializers.IntegerField(min_value=0))
    passed = given(serializers.IntegerField(min_value=0))
    failed = given(serializers.IntegerField(min_value=0))
    cancelled = given(serializers.IntegerField(min_value=0))
    reward = given(serializers.FloatField(allow_null=True, help_text="passed / total once all ended, else null."))
    mean_reward = given(
        serializers.FloatField(
            allow_null=True,
            help_text="The mean of the evaluations' rewards, a null reward counting 0, once all ended; else null.",
        )
    )
    pass_at_k = given(
        serializers.FloatField(
            allow_null=True,
            help_text="The share of task URLs one of whose attempts passed (the mean of tasks' pass_at_k), once all "
            "ended; else null.",
        )
    )
    agent_sha256 = shown(
        serializers.CharField(allow_null=True, help_text="sha256 of the batch's agent."), _or_none("agent_sha256")
    )
    created_at = shown(serializers.DateTimeField(), _iso("created_at"))
    finished_at = shown(serializers.DateTimeField(allow_null=True), _iso("finished_at"))
    executor_version = shown(
        serializers.CharField(allow_null=True, help_text=EXECUTOR_VERSION_HELP), _or_none("executor_version")
    )


def batch_summary(batch) -> dict:
    """One row of GET /batches (counts from batch_summaries)."""
    return BatchSummarySerializer.build(
        batch,
        **_batch_figures(
            batch,
            total=batch.total,
            finished=batch.finished,
            started=batch.started,
            passed=batch.passed_count,
            failed=batch.failed,
            cancelled=batch.cancelled,
            reward_sum=batch.reward_sum or 0.0,
            tasks=batch.task_count,
            tasks_passed=batch.tasks_passed,
        ),
    )


def _batch_figures(
    batch: Batch,
    *,
    total: int,
    finished: int,
    started: int,
    passed: int,
    failed: int,
    cancelled: int,
    reward_sum: float,
    tasks: int,
    tasks_passed: int,
) -> dict:
    """The batch object's figures from its evaluations' counts: GET /batches' rows and GET /batches/{id} alike.

    SPEC §17: ``mean_reward`` is the mean of the evaluations' rewards, an evaluation with none
    (it failed before its tests were graded, or was cancelled) counting 0, as ``reward`` counts it
    as not passed; ``pass_at_k`` the share of task URLs one of whose attempts passed. Like
    ``reward``, both are null until every evaluation ended.
    """
    ended = bool(total) and finished == total
    return {
        "status": _batch_status(batch, ended=ended, started=bool(started)),
        "total": total,
        "finished": finished,
        "passed": passed,
        "failed": failed,
        "cancelled": cancelled,
        "reward": passed / total if ended else None,
        "mean_reward": reward_sum / total if ended else None,
        "pass_at_k": tasks_passed / tasks if ended and tasks else None,
    }


class BatchTaskSerializer(Shape):
    task_url = given(serializers.CharField())
    attempts = given(serializers.IntegerField(min_value=1, help_text="Its evaluations in this batch."))
    passes = given(serializers.IntegerField(min_value=0, help_text="Those that passed so far."))
    pass_at_k = given(
        serializers.FloatField(
            allow_null=True, help_text="1 if an attempt passed, else 0; null until every attempt of it ended."
        )
    )
    mean_reward = given(
        serializers.FloatField(
            allow_null=True,
            help_text="The mean of its attempts' rewards, a null reward counting 0; null until every attempt ended.",
        )
    )


class BatchEvaluationSerializer(Shape):
    eval_id = shown(serializers.UUIDField(), _str_or_none("id"))
    task_url = serializers.CharField()
    attempt = serializers.IntegerField(min_value=1, help_text="Which run of its task URL this is, from 1.")
    status = serializers.ChoiceField(choices=Status.choices)
    passed = serializers.BooleanField(allow_null=True)
    reward = serializers.FloatField(allow_null=True, help_text="As the evaluation's reward.")
    error_kind = serializers.ChoiceField(
        choices=ErrorKind.choices, allow_null=True, help_text="Why it did not pass; null while running or when passed."
    )


class BatchSerializer(BatchSummarySerializer):
    tasks = given(
        BatchTaskSerializer(many=True, help_text="One per task URL, in task_urls order (not in GET /batches).")
    )
    evaluations = given(BatchEvaluationSerializer(many=True, help_text="In queue order, as eval_ids."))
    signature = SignatureSerializer(allow_null=True, help_text=SIGNATURE_HELP + " Not in GET /batches.")


# The columns the batch object reads of each evaluation (BatchEvaluationSerializer's and batch_tasks').
_BATCH_ROW = ("id", "task_url", "attempt", "status", "passed", "reward", "error_kind", "created_at")


def batch_json(batch_id, among=Batch.objects) -> dict | None:
    """GET /batches/{id}'s body and the batch callback's; None for no such batch in ``among``
    (the API's: the batches the caller may see). A batch's evaluations are its owner's."""
    batch = among.filter(id=batch_id).first()
    if batch is None:
        return None
    return batch_document(batch, batch_evaluations(batch.id))


def batch_evaluations(batch_id) -> list[Evaluation]:
    """A batch's evaluations in queue order, with the columns the batch object reads."""
    return list(Evaluation.objects.filter(batch_id=batch_id).order_by("created_at", "id").only(*_BATCH_ROW))


def batch_tasks(evaluations) -> list[dict]:
    """SPEC §17: one entry per task URL, in the order its first attempt queued.

    ``passes`` counts as it goes (as the batch's ``passed``); ``pass_at_k`` (1.0 if an attempt
    passed, else 0.0) and ``mean_reward`` (a null reward counting 0) are null until every
    attempt of that task ended.
    """
    by_task: dict[str, list] = {}
    for e in evaluations:
        by_task.setdefault(e.task_url, []).append(e)
    tasks = []
    for task_url, runs in by_task.items():
        passes = sum(1 for e in runs if e.passed)
        ended = all(e.status not in ACTIVE_STATUSES for e in runs)
        tasks.append(
            BatchTaskSerializer.build(
                task_url=task_url,
                attempts=len(runs),
                passes=passes,
                pass_at_k=(1.0 if passes else 0.0) if ended else None,
                mean_reward=sum(e.reward or 0.0 for e in runs) / len(runs) if ended else None,
            )
        )
    return tasks


def batch_document(batch: Batch, evaluations) -> dict:
    tasks = batch_tasks(evaluations)
    figures = _batch_figures(
        batch,
        total=len(evaluations),
        finished=sum(1 for e in evaluations if e.status not in ACTIVE_STATUSES),
        started=sum(1 for e in evaluations if e.status != Status.PENDING),
        passed=sum(1 for e in evaluations if e.passed),
        failed=sum(1 for e in evaluations if e.status == Status.FAILED),
        cancelled=sum(1 for e in evaluations if e.status == Status.CANCELLED),
        reward_sum=sum(e.reward or 0.0 for e in evaluations),
        tasks=len(tasks),
        tasks_passed=sum(1 for t in tasks if t["passes"]),
    )
    body = BatchSerializer.build(
        batch, **figures, tasks=tasks, evaluations=[BatchEvaluationSerializer.build(e) for e in evaluations]
    )
    # SPEC §18, as an evaluation's (evaluation_document says why a missing one is made here).
    if body["signature"] is None and batch.finished_at is not None:
        body["signature"] = signing.sign_if_possible(body, signing.BATCH_FIELDS)
    return body
