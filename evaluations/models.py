"""What the executor stores: evaluations, their transitions and test results, workers."""

from __future__ import annotations

import uuid

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from executor_project.config import TENANT_NAME


class Status(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (Status.PENDING, Status.RUNNING)
TERMINAL_STATUSES = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)

# What the executor itself writes as a cancel_reason or in an error sentence.
WORKER_LOST = "executor worker lost"
TTL_EXPIRED = "session TTL expired"
SHUTTING_DOWN = "executor shutting down"


class Step(models.TextChoices):
    QUEUED = "queued"
    DOWNLOADING_TASK = "downloading_task"
    PREPARING_ENVIRONMENT = "preparing_environment"
    CLONING_REPO = "cloning_repo"
    INSTALLING_DEPS = "installing_deps"
    INSTALLING_AGENT = "installing_agent"
    RUNNING_AGENT = "running_agent"
    RUNNING_TESTS = "running_tests"
    CLEANUP = "cleanup"
    DONE = "done"


class ErrorKind(models.TextChoices):
    """SPEC §14: why an evaluation did not pass, so a platform retries one kind and scores another."""

    TESTS_FAILED = "tests_failed"  # the tests ran and at least one failed (or timed out)
    AGENT_TIMEOUT = "agent_timeout"  # the agent used its whole time budget
    LIMIT_EXCEEDED = "limit_exceeded"  # memory, disk, processes or output over a limit
    AGENT_INVALID = "agent_invalid"  # a broken agent archive or agent install
    TASK_INVALID = "task_invalid"  # the task's fault: malformed archive, missing commit, failing install
    INFRASTRUCTURE = "infrastructure"  # neither's fault: network, worker lost, shutdown, internal error
    CANCELLED = "cancelled"  # DELETE, a cancelled batch, the session TTL


# A cancel's error_kind by the reason the executor wrote in cancel_reason; any other reason (DELETE,
# the admin, a batch's DELETE, the TTL, Ctrl-C in manage.py evaluate) is the caller's: cancelled.
CANCEL_KINDS = {SHUTTING_DOWN: ErrorKind.INFRASTRUCTURE}


class TestKind(models.TextChoices):
    FAIL_TO_PASS = "fail_to_pass"
    PASS_TO_PASS = "pass_to_pass"
    TEST = "test"
    CHECK = "check"


class CacheUse(models.TextChoices):
    HIT = "hit"  # started from a snapshot: no clone, no install
    MISS = "miss"  # cloned and installed (and stored, when it could be)
    OFF = "off"  # WORKSPACE_CACHE=off, `cache: false`, or no root for the cache's mounts


# SPEC §20: who created a row, and so who else may see it (evaluations/api/auth.py).
OWNER_HELP = "the tenant (AUTH_TOKENS name) that created it; null: an operator's token, no auth, or manage.py evaluate"


class CallbackState(models.TextChoices):
    """Delivery of the final JSON to callback_url (evaluations/worker/callbacks.py)."""

    NONE = "", "none"  # no callback_url, or not ended yet
    PENDING = "pending", "pending"  # due at callback_next_at
    DELIVERED = "delivered", "delivered"
    FAILED = "failed", "failed"  # refused URL, or MAX_TRIES failed tries


class Token(models.Model):
    """A tenant's bearer token made in the admin (SPEC §20), beside AUTH_TOKENS: only its SHA-256 is kept.

    The token is shown once, on the page that made it. A tenant may hold several (to rotate one:
    add the new, then delete the old); a token of an AUTH_TOKENS name acts as that tenant.
    """

    name = models.CharField(
        max_length=64,
        validators=[RegexValidator(rf"\A{TENANT_NAME.pattern}\Z", "1 to 64 of A-Z a-z 0-9 _ . -")],
        help_text="The tenant: what its evaluations' and batches' owner holds.",
    )
    sha256 = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    def __str__(self) -> str:
        return f"{self.name}'s token {self.sha256[:12]}"


class AgentArchive(models.Model):
    """An agent project's archive (SPEC §14), stored once per content: a batch's tasks share one row."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    data = models.BinaryField()
    size = models.PositiveIntegerField()
    # Set again at every submission of the same content: the reaper deletes only archives that no
    # row points at and nobody submitted for RETENTION_DAYS (reaper.purge_old).
    last_used_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.size} bytes)"


class Submission(models.Model):
    """The request columns an evaluation and a batch share: the agent and the run's options
    (what evaluations.api.serializers.submission_fields fills, with CallbackColumns.callback_url)."""

    language = models.CharField(max_length=16, default="python")
    agent_code = models.TextField(blank=True, default="")  # "" when the agent came as agent_archive
    agent_archive = models.ForeignKey(AgentArchive, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    agent_entrypoint = models.CharField(max_length=255, blank=True, default="")
    agent_sha256 = models.CharField(max_length=64, blank=True, default="")  # of agent_code's UTF-8 or the archive
    timeout_secs = models.PositiveIntegerField(null=True, blank=True)
    env = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    owner = models.CharField(max_length=64, null=True, blank=True, help_text=OWNER_HELP)

    class Meta:
        abstract = True


class IdempotencyColumns(models.Model):
    """An Idempotency-Key and the body it came with (evaluations/api/admission.py). Each model keeps
    its own unique constraint on (idempotency_scope, idempotency_key), named for its table."""

    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    idempotency_scope = models.CharField(max_length=64, blank=True, default="")
    request_sha256 = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        abstract = True


class CallbackColumns(models.Model):
    """Delivery of the final JSON to callback_url (evaluations/worker/callbacks.py). Each model
    keeps its own partial index on callback_next_at of the pending ones, named for its table."""

    callback_url = models.CharField(max_length=2048, blank=True, default="")
    callback_state = models.CharField(max_length=12, blank=True, default="", choices=CallbackState.choices)
    callback_next_at = models.DateTimeField(null=True, blank=True)
    callback_lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class Batch(Submission, IdempotencyColumns, CallbackColumns):
    """One agent on several tasks (SPEC §14): its evaluations queue beside the others."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False, verbose_name="batch id")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)

    # The request (Submission) is shared by its evaluations.
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # SPEC §17 pass@k: how many times each task URL runs (1..MAX_ATTEMPTS).
    attempts = models.PositiveSmallIntegerField(default=1)
    # SPEC §18: set by lifecycle.settle as the batch ends, as an evaluation's by finish.
    executor_version = models.CharField(max_length=32, blank=True, default="")
    signature = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at", "-id")
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="batch_list_idx"),
            # A tenant's GET /batches: its own, newest first.
            models.Index(
                fields=["owner", "-created_at", "-id"], name="batch_owner_list_idx", condition=Q(owner__isnull=False)
            ),
            models.Index(fields=["status", "created_at"], name="batch_open_idx", condition=Q(finished_at=None)),
            models.Index(
                fields=["callback_next_at"],
                name="batch_callback_due_idx",
                condition=Q(callback_state=CallbackState.PENDING),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_scope", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="batch_idempotency_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"batch {self.id} ({self.status})"


class Evaluation(Submission, IdempotencyColumns, CallbackColumns):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False, verbose_name="eval id")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    step = models.CharField(max_length=24, choices=Step.choices, default=Step.QUEUED)
    passed = models.BooleanField(null=True, help_text="null until the evaluation ends")
    error = models.TextField(blank=True, default="")
    error_kind = models.CharField(max_length=16, null=True, blank=True, choices=ErrorKind.choices)

    # The request, besides the Submission's columns.
    task_url = models.CharField(max_length=2048)
    static_assets = models.JSONField(null=True, blank=True)

    # Times.
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)

    # What the task held and what the run produced.
    task_prompt = models.TextField(blank=True, default="")
    original_pr = models.TextField(blank=True, default="")
    agent_output = models.TextField(blank=True, default="")
    agent_exit_code = models.IntegerField(null=True, blank=True)
    agent_patch = models.TextField(blank=True, default="")
    test_output = models.TextField(blank=True, default="")
    log = models.TextField(blank=True, default="", help_text="the combined live log, kept when the session folder goes")
    results_sha256 = models.CharField(max_length=64, blank=True, default="")
    # SPEC §12: every proxied connection, aggregated per (step, host, port, allowed); what the
    # evaluation used ({peak_memory_bytes, cpu_seconds, peak_processes, peak_disk_bytes, peak_files}).
    egress = models.JSONField(default=list, blank=True)
    resources = models.JSONField(null=True, blank=True)
    # SPEC §18: the task archive's sha256 as downloaded (downloading_task); the executor version that
    # ended it and the Ed25519 signature over the ended object (evaluations/signing.py), both set by
    # lifecycle.finish; signature null until then.
    task_sha256 = models.CharField(max_length=64, blank=True, default="")
    executor_version = models.CharField(max_length=32, blank=True, default="")
    signature = models.JSONField(null=True, blank=True)
    # SPEC §16: what the task's commands ran in, set by preparing_environment:
    # {kind: host|name|image|dockerfile, ref, digest, cached}; null until then.
    environment = models.JSONField(null=True, blank=True)
    # SPEC §17: the grade as a number (reward_file: the task's headline reward; other graders 1.0
    # passed, 0.0 failed; null when nothing was graded) and the reward file's whole object.
    reward = models.FloatField(null=True, blank=True)
    rewards = models.JSONField(null=True, blank=True)
    # The task's own format (workspace, harbor, terminal-bench) and what it asked for beyond SPEC §4:
    # the limits applied (its request capped by the operator's), task.toml's [metadata] and unknown keys.
    task_format = models.CharField(max_length=16, blank=True, default="")
    limits_applied = models.JSONField(null=True, blank=True)
    task_metadata = models.JSONField(null=True, blank=True)
    # What the agent changed outside its working directory ({count, paths, suspicious}), and the files
    # it left under /logs/agent that were kept ([{path, size_bytes, sha256}]).
    system_changes = models.JSONField(null=True, blank=True)
    # SPEC §19: a swebench-graded task's ids per kind ({fail_to_pass: {total, passed, failed, missing},
    # pass_to_pass: {...}}): test_results holds at most MAX_TESTS of them, these count them all.
    test_counts = models.JSONField(null=True, blank=True)
    artifacts = models.JSONField(default=list, blank=True)
    # SPEC §23: a Harbor task of [[steps]], each step run ([{name, reward, rewards, passed, duration_ms}],
    # in order, those a stop left out absent); null for a task of one step.
    steps = models.JSONField(null=True, blank=True)
    # Which run of its task this is within its batch (SPEC §17 attempts), from 1.
    attempt = models.PositiveSmallIntegerField(default=1)

    # SPEC §13: whether the install step's state came from the workspace cache; "" until cloning_repo.
    cache = models.CharField(max_length=4, blank=True, default="", choices=CacheUse.choices)

    # Who runs it, and whether someone asked it to stop.
    worker_id = models.CharField(max_length=64, blank=True, default="")
    cancel_requested = models.BooleanField(default=False)
    cancel_reason = models.CharField(max_length=200, blank=True, default="")

    # A re-run (admin, POST /evaluate/{id}/retry) points at the evaluation it repeats.
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")
    batch = models.ForeignKey(Batch, null=True, blank=True, on_delete=models.CASCADE, related_name="evaluations")

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = [
            # GET /evaluations, newest first, optionally by status.
            models.Index(fields=["-created_at", "-id"], name="eval_list_idx"),
            models.Index(fields=["status", "-created_at"], name="eval_status_list_idx"),
            # A tenant's GET /evaluations: its own, newest first.
            models.Index(
                fields=["owner", "-created_at", "-id"], name="eval_owner_list_idx", condition=Q(owner__isnull=False)
            ),
            # Admission counts and the worker's claim look at pending/running rows only.
            models.Index(
                fields=["status", "created_at"],
                name="eval_active_idx",
                condition=Q(status__in=["pending", "running"]),
            ),
            # POST /evaluate's capacity counts single evaluations only (batch IS NULL: a batch's are
            # bounded by MAX_OPEN_BATCHES x MAX_BATCH_TASKS, evaluations/api/admission.py), and a batch
            # ends when none of its own is active (lifecycle.settle). Keyed on both columns, SQLite's
            # planner prefers it to the batch foreign key's index for either.
            models.Index(
                fields=["batch", "status"],
                name="eval_batch_active_idx",
                condition=Q(status__in=["pending", "running"]),
            ),
            models.Index(fields=["worker_id", "status"], name="eval_worker_idx"),
            models.Index(
                fields=["callback_next_at"],
                name="eval_callback_due_idx",
                condition=Q(callback_state=CallbackState.PENDING),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_scope", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="eval_idempotency_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status}/{self.step})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class Transition(models.Model):
    """One change of step or status. duration_ms: how long the evaluation stayed there."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="transitions")
    step = models.CharField(max_length=24, choices=Step.choices)
    status = models.CharField(max_length=16, choices=Status.choices)
    at = models.DateTimeField(default=timezone.now)
    duration_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ("at", "id")
        indexes = [models.Index(fields=["evaluation", "at"], name="transition_eval_idx")]

    def __str__(self) -> str:
        return f"{self.step}/{self.status} at {self.at:%H:%M:%S.%f}"


class TestResult(models.Model):
    __test__ = False  # not a pytest test class

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="test_results")
    position = models.PositiveIntegerField()
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=TestKind.choices)
    passed = models.BooleanField()
    exit_code = models.IntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    duration_ms = models.BigIntegerField(default=0)
    output = models.TextField(blank=True, default="")

    class Meta:
        ordering = ("position",)
        constraints = [models.UniqueConstraint(fields=["evaluation", "position"], name="testresult_position_unique")]

    def __str__(self) -> str:
        return f"{self.name}: {'passed' if self.passed else 'failed'}"


class CallbackAttempt(models.Model):
    """One POST of the final evaluation (or batch) JSON to its callback_url: exactly one of the two is set."""

    evaluation = models.ForeignKey(
        Evaluation, null=True, blank=True, on_delete=models.CASCADE, related_name="callback_attempts"
    )
    batch = models.ForeignKey(Batch, null=True, blank=True, on_delete=models.CASCADE, related_name="callback_attempts")
    attempt = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    status_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    duration_ms = models.IntegerField(default=0)

    class Meta:
        ordering = ("evaluation", "attempt")
        constraints = [
            models.UniqueConstraint(fields=["evaluation", "attempt"], name="callback_attempt_unique"),
            models.UniqueConstraint(
                fields=["batch", "attempt"], name="batch_callback_attempt_unique", condition=Q(batch__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        outcome = self.status_code if self.status_code is not None else self.error[:40]
        return f"attempt {self.attempt}: {outcome}"


class PurgedTotals(models.Model):
    """What purged evaluations had added to the counters, so /metrics counters never go down."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    total = models.BigIntegerField(default=0)
    completed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    cancelled = models.BigIntegerField(default=0)
    passed = models.BigIntegerField(default=0)
    duration_ms_sum = models.BigIntegerField(default=0)
    cache_hits = models.BigIntegerField(default=0)
    cache_misses = models.BigIntegerField(default=0)
    # {status: {error_kind: count}} of the failed and cancelled ones (stats.UNKNOWN_KIND for rows
    # that ended before error_kind existed): /metrics' counters by error_kind.
    error_kinds = models.JSONField(default=dict)

    class Meta:
        verbose_name_plural = "purged totals"

    def __str__(self) -> str:
        return f"{self.total} purged evaluations"


class WorkerHeartbeat(models.Model):
    """A run_worker process. A worker silent for WORKER_STALE_SECS is lost."""

    worker_id = models.CharField(max_length=64, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    capacity = models.PositiveIntegerField()
    sandbox = models.CharField(max_length=16)
    limits = models.CharField(max_length=16, blank=True, default="")  # "cgroup v2", "cgroup v1" or "monitor"
    started_at = models.DateTimeField(default=timezone.now)
    last_beat_at = models.DateTimeField(default=timezone.now)
    stopping = models.BooleanField(default=False)

    class Meta:
        ordering = ("-last_beat_at",)

    def __str__(self) -> str:
        return f"{self.worker_id} on {self.hostname}"


# -- live sandboxes (SPEC §24) -------------------------------------------------------------------


class SandboxStatus(models.TextChoices):
    STARTING = "starting"  # made by POST /sandboxes; its image pulled or built, its first process starting
    READY = "ready"  # its init runs: exec, files and network answer
    STOPPED = "stopped"  # DELETE
    EXPIRED = "expired"  # the reaper: idle past idle_timeout_secs, or alive past max_lifetime_secs
    FAILED = "failed"  # it never became ready, or its process died (error, error_kind)


LIVE_SANDBOX_STATUSES = (SandboxStatus.STARTING, SandboxStatus.READY)


class Sandbox(models.Model):
    """One live sandbox: made on one host of a fleet (``node``), answered there (``public_url``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False, verbose_name="sandbox id")
    owner = models.CharField(max_length=64, null=True, blank=True, help_text=OWNER_HELP)
    status = models.CharField(max_length=16, choices=SandboxStatus.choices, default=SandboxStatus.STARTING)
    spec = models.JSONField(default=dict, help_text="the POST /sandboxes body, as checked")
    environment = models.JSONField(null=True, blank=True, help_text="{kind, ref, digest, cached} once ready")
    network = models.JSONField(default=dict, blank=True, help_text="the egress policy now: {mode, allowed_hosts}")
    error = models.TextField(blank=True, default="")
    error_kind = models.CharField(max_length=16, null=True, blank=True, choices=ErrorKind.choices)
    node = models.CharField(max_length=255, help_text="the service that made it and runs it")
    public_url = models.CharField(max_length=2048, blank=True, default="", help_text="that service's PUBLIC_URL")
    worker_id = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    last_active_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="created_at + max_lifetime_secs")
    ended_at = models.DateTimeField(null=True, blank=True)
    idle_timeout_secs = models.PositiveIntegerField(default=600)
    max_lifetime_secs = models.PositiveIntegerField(default=86400)
    exec_count = models.PositiveIntegerField(default=0)
    egress = models.JSONField(default=list, blank=True)
    resources = models.JSONField(null=True, blank=True)
    # SANDBOX_WARM_IMAGES: made ahead of any request, for the image ``pool_key``; a POST for that image
    # takes one (pooled becomes False). Never listed nor found by the API while pooled.
    pooled = models.BooleanField(default=False)
    pool_key = models.CharField(max_length=2048, blank=True, default="")

    class Meta:
        ordering = ("-created_at", "-id")
        verbose_name_plural = "sandboxes"  # the admin's; Django's default would be "sandboxs"
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="sandbox_owner_idx"),
            models.Index(fields=["node", "pool_key", "status"], name="sandbox_pool_idx", condition=Q(pooled=True)),
            models.Index(
                fields=["node", "status"], name="sandbox_live_idx", condition=Q(status__in=["starting", "ready"])
            ),
        ]

    def __str__(self) -> str:
        return f"sandbox {self.id} ({self.status})"

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_SANDBOX_STATUSES


class SandboxExec(models.Model):
    """One exec in a sandbox: what ran, as whom, how it ended (its output is the caller's alone)."""

    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="execs")
    position = models.PositiveIntegerField()
    command = models.JSONField(help_text="the argv as started")
    cwd = models.CharField(max_length=4096, blank=True, default="")
    user = models.CharField(max_length=64, blank=True, default="")
    # The compose service it ran in (SPEC §23-24); blank: main (every exec before services had a name here)
    service = models.CharField(max_length=128, blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    oom_killed = models.BooleanField(default=False)
    duration_ms = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("position",)
        constraints = [models.UniqueConstraint(fields=["sandbox", "position"], name="sandboxexec_position_unique")]

    def __str__(self) -> str:
        return f"exec {self.position} of {self.sandbox_id}"
