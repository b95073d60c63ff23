"""The one place that moves an evaluation between steps and statuses, a batch to its end, and a
live sandbox from starting to its end (SPEC §24).

Every change writes the Evaluation row and a Transition row in one short
transaction, and is conditional on the status the caller expects, so a
pipeline that lost a race with DELETE (or with the reaper) finds out instead
of overwriting a terminal state.

A new evaluation enters here too, pending at step queued with its first transition
(``queue``; POST /evaluate's measured fast path through db/admission.py). No other module
writes a status or a transition (tests/test_layout.py holds every module to that).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import Case, Exists, OuterRef, Value, When
from django.utils import timezone

from evaluations import VERSION, representation
from evaluations.db import admission as admission_sql
from evaluations.db import progress as progress_sql
from evaluations.db.text import Utf8Sha256, Utf8Text
from evaluations.events.announce import announce
from evaluations.models import (
    ACTIVE_STATUSES,
    CANCEL_KINDS,
    LIVE_SANDBOX_STATUSES,
    Batch,
    CallbackState,
    ErrorKind,
    Evaluation,
    Sandbox,
    SandboxStatus,
    Status,
    Step,
    TestResult,
    Transition,
)

# -- new evaluations: pending at step queued, each with its first transition ----------------------


def queue(evaluations: list[Evaluation]) -> None:
    """Insert new evaluations, pending at step queued, and their first transitions: one INSERT into
    each table, inside the caller's transaction (a batch's admission, a local run's claim)."""
    for evaluation in evaluations:
        evaluation.status, evaluation.step = Status.PENDING, Step.QUEUED
    with transaction.atomic():
        Evaluation.objects.bulk_create(evaluations)
        Transition.objects.bulk_create(
            Transition(evaluation_id=e.id, step=Step.QUEUED, status=Status.PENDING, at=e.created_at)
            for e in evaluations
        )


def prepare_queued(db, given: dict) -> tuple[list, list]:
    """POST /evaluate's new evaluation (``given``: every column it sets but the status and step) and
    its first transition, as the values of db/admission.py's INSERTs, prepared before the lock."""
    sql = admission_sql.statements(db.vendor)
    evaluation = sql.evaluation.values({**given, "status": Status.PENDING, "step": Step.QUEUED}, db)
    first = {"evaluation_id": given["id"], "step": Step.QUEUED, "status": Status.PENDING, "at": given["created_at"]}
    return evaluation, sql.transition.values(first, db)


def queue_if_room(cursor, queued: tuple[list, list], *, limit: int) -> bool:
    """Under the admission's lock: insert the prepared evaluation if fewer than ``limit`` single
    evaluations are active (one statement counts and inserts), then its first transition; False,
    with nothing written, when there is no room."""
    sql = admission_sql.statements(cursor.db.vendor)
    evaluation, first = queued
    cursor.execute(sql.insert_if_room, [*evaluation, *[limit] * sql.room_params])
    if cursor.rowcount != 1:
        return False
    cursor.execute(sql.insert_transition, first)
    return True


# -- steps and statuses --------------------------------------------------------------------------


def _elapsed_ms(start, end) -> int:
    return max(0, int((end - start).total_seconds() * 1000))


def record(
    eval_id,
    *,
    step: str | None = None,
    status: str | None = None,
    expect: Iterable[str] = ACTIVE_STATUSES,
    **fields,
) -> bool:
    """Apply a step/status change and store its transition; False if the row was not in `expect`.

    1. The UPDATE is conditional on the status: a caller that lost a race changes nothing.
    2. The transition stores the step and status the row holds after the UPDATE (a caller
       may change only one of them), and closes the previous transition's duration.
    3. The event streams following it are told once it commits (events/announce.py).

    For a caller that knows nothing of the row. The pipeline writes through ``Progress``, which
    knows what a caller here reads back (``_transition`` says what).
    """
    return _transition(eval_id, step, status, tuple(expect), fields, None) is not None


def claim(eval_id, worker_id: str) -> Mark | None:
    """A pending evaluation made ``worker_id``'s and running (``record``'s change); its transition,
    which its pipeline closes with its first step (``Progress(claimed=...)``), or None when the row
    was not pending (another worker got there first)."""
    fields = {"worker_id": worker_id, "started_at": timezone.now()}
    return _transition(eval_id, None, Status.RUNNING, (Status.PENDING,), fields, None)


class Mark(NamedTuple):
    """A transition as its writer left it: its id, its time (its duration still open)."""

    id: int
    at: datetime.datetime

    def encode(self) -> str:
        """As text, for another process (the claim's, handed to the evaluation's: worker/pool.py)."""
        return f"{self.id} {self.at.isoformat()}"

    @classmethod
    def decode(cls, text: str) -> Mark:
        number, at = text.split(" ", 1)
        return cls(int(number), datetime.datetime.fromisoformat(at))


def _transition(eval_id, step, status, expect: tuple, fields: dict, previous: Mark | None) -> Mark | None:
    """``record``'s transaction; the new transition, or None when the row was not in ``expect``.

    Without ``previous`` it reads the row's open transition; with it, three statements: the
    conditional UPDATE, the previous transition's duration, the new one's INSERT (written once,
    ``_advance``, when the step is given and one status expected: a pipeline's). The row's step
    and status are read back only when the change and ``expect`` do not say them (a claim moves
    the status and keeps whatever step the row is at).

    No savepoint of its own: inside a caller's transaction (finish, the worker's claim) a failed
    statement fails the caller's whole change anyway, and a row not in ``expect`` writes nothing.
    """
    now = timezone.now()
    if previous is not None and step is not None and len(expect) == 1:
        return _advance(eval_id, step, status, expect[0], fields, previous, now)
    # A text column given as bytes (its UTF-8: the kept log) is written as text by the database, never
    # decoded here (db/text.py).
    updates = {name: Utf8Text(value) if isinstance(value, bytes) else value for name, value in fields.items()}
    if step is not None:
        updates["step"] = step
    if status is not None:
        updates["status"] = status
    with transaction.atomic(savepoint=False):
        if Evaluation.objects.filter(id=eval_id, status__in=expect).update(**updates) != 1:
            return None
        if step is None or (status is None and len(expect) != 1):
            step, status = Evaluation.objects.filter(id=eval_id).values_list("step", "status").get()
        elif status is None:
            status = expect[0]
        if previous is None:
            transitions = Transition.objects.filter(evaluation_id=eval_id).order_by("-at", "-id")
            last = transitions.values("id", "at", "duration_ms").first()
            if last is not None and last["duration_ms"] is None:
                previous = Mark(last["id"], last["at"])
        if previous is not None:
            Transition.objects.filter(id=previous.id).update(duration_ms=_elapsed_ms(previous.at, now))
        created = Transition.objects.create(evaluation_id=eval_id, step=step, status=status, at=now)
        announce(eval_id)
    return Mark(created.id, now)


def _advance(eval_id, step: str, status: str | None, expect: str, fields: dict, previous: Mark, now) -> Mark | None:
    """``_transition``'s case for a pipeline (its next step, or its end: ``status``) whose last
    transition is known and whose row is in one status (``expect``): the same three statements,
    written once (db/progress.py) rather than built by the ORM each time. A text column given as
    bytes is made text by the database, as ``Utf8Text`` does."""
    db = connection
    sql = progress_sql.statements(db.vendor)
    changes = {**fields, "step": step, **({"status": status} if status is not None else {})}
    columns, params = sql.update_values(changes, db)
    reached = status if status is not None else expect
    new = sql.transition.values({"evaluation_id": eval_id, "step": step, "status": reached, "at": now}, db)
    with transaction.atomic(savepoint=False), db.cursor() as cursor:
        cursor.execute(sql.update(columns), [*params, sql.pk_value(eval_id, db), expect])
        if cursor.rowcount != 1:
            return None
        cursor.execute(sql.close_previous, [_elapsed_ms(previous.at, now), previous.id])
        cursor.execute(sql.insert_transition, new)
        created = cursor.fetchone()[0]
        announce(eval_id)
    return Mark(created, now)


class Progress:
    """One pipeline's writer of its evaluation (SPEC §25): a step's results go with the next transition.

    1. ``stage(**fields)``: a step's results (the task's hash, the agent's output...), written by the
       next ``record`` or by ``finish``, in that change's transaction: a step that fails or is
       cancelled after staging still has them stored, with its failure. A text column may be staged
       as its UTF-8 (bytes: the kept log), which the database makes text.
    2. ``record(step)``: conditional on the row being running, as all of a pipeline's changes are.
       While the row runs its pipeline is the only writer of its transitions (a claim and a cancel
       that ends a row need a pending one; the reaper ends it, after which no change here writes),
       so it knows the row's step and status after its change, and its own last transition: no
       SELECT.
    3. ``finish`` carries what is staged. A row ended elsewhere (the reaper) takes none of it: its
       shown columns are signed by whoever ended it (``_seal_evaluation``).

    ``claimed``: the claim's transition, as the worker that wrote it hands it over (``claim``): the
    first ``record`` then needs no SELECT either; without it, that one looks the transition up.
    """

    def __init__(self, eval_id, claimed: Mark | None = None):
        self.eval_id = eval_id
        self.staged: dict = {}
        self.last: Mark | None = claimed  # the transition this writer (or its claim) stored last

    def stage(self, **fields) -> None:
        self.staged.update(fields)

    def record(self, step: str) -> bool:
        mark = _transition(self.eval_id, step, None, (Status.RUNNING,), self.staged, self.last)
        if mark is None:
            return False
        self.staged, self.last = {}, mark
        return True

    def finish(self, status: str, *, error: str = "", kind: str | None = None, **fields) -> bool:
        """``finish``, with what is staged (``fields`` win) and the last transition known."""
        fields = {**self.staged, **fields}
        ended = _finish(self.eval_id, status, error, kind, (Status.RUNNING,), fields, self.last)
        if ended:
            self.staged = {}
        return ended


def store_test_results(eval_id, results: list[TestResult], **fields) -> None:
    """The tests' rows and the evaluation's columns that go with them (its test_output...), in one
    commit, and the event streams told; every writer of test results comes through here."""
    with transaction.atomic():
        TestResult.objects.bulk_create(results)
        Evaluation.objects.filter(id=eval_id).update(**fields)
        announce(eval_id)


def results_sha256(eval_id, passed: bool | None, results: Iterable[dict]) -> str:
    """SHA-256 of a canonical JSON, so a platform can compare two executors' runs."""
    canonical = {
        "eval_id": str(eval_id),
        "passed": passed,
        "test_results": [{"name": r["name"], "passed": r["passed"], "exit_code": r["exit_code"]} for r in results],
    }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def finish(
    eval_id,
    status: str,
    *,
    error: str = "",
    kind: str | None = None,
    expect: Iterable[str] = ACTIVE_STATUSES,
    **fields,
) -> bool:
    """End an evaluation: step `done`, final status, `passed`, `error_kind`, times and the results hash;
    and its batch with its last evaluation (settle; the reaper's settle_stranded if this
    process dies in between).

    ``kind`` (SPEC §14 error_kind): none for `completed`; when a caller gives none, `cancelled`
    for a cancel and `infrastructure` for a failure nobody classified (the executor's, as an
    internal error is). Every end goes through here, so no ended evaluation lacks one.
    """
    return _finish(eval_id, status, error, kind, tuple(expect), fields, None)


def _finish(
    eval_id, status: str, error: str, kind: str | None, expect: tuple, fields: dict, previous: Mark | None
) -> bool:
    """``finish``'s work; ``previous``: as for ``_transition``."""
    if status == Status.COMPLETED:
        kind = None
    elif kind is None:
        kind = ErrorKind.CANCELLED if status == Status.CANCELLED else ErrorKind.INFRASTRUCTURE
    elif kind not in ErrorKind.values:
        raise ValueError(f"unknown error_kind {kind!r}")
    now = timezone.now()
    row = Evaluation.objects.filter(id=eval_id).values("created_at", "started_at", "callback_url", "batch_id").first()
    if row is None:
        return False
    if row["callback_url"]:
        # The worker's callback dispatcher delivers it; nothing here waits on the receiver.
        fields.update(callback_state=CallbackState.PENDING, callback_next_at=now)
    results = list(TestResult.objects.filter(evaluation_id=eval_id).values("name", "passed", "exit_code"))
    passed = status == Status.COMPLETED
    if "reward" not in fields:  # SPEC §17: graders other than reward_file; null when nothing was graded
        fields["reward"] = 1.0 if passed else 0.0 if kind == ErrorKind.TESTS_FAILED else None
    with transaction.atomic():
        fields.update(
            passed=passed,
            error=error,
            error_kind=kind,
            finished_at=now,
            duration_ms=_elapsed_ms(row["started_at"] or row["created_at"], now),
            results_sha256=results_sha256(eval_id, passed, results),
            executor_version=VERSION,
        )
        ended = _transition(eval_id, Step.DONE, status, expect, fields, previous) is not None
        if ended:
            _seal_evaluation(eval_id)
    if ended and row["batch_id"] is not None:
        # After record's commit: a batch ends when its last evaluation does, and settle's
        # check must see the other evaluations' own commits (settle says why once).

        transaction.on_commit(lambda: settle(row["batch_id"]))
    return ended


def _seal_evaluation(eval_id) -> None:
    """SPEC §18: sign the object the API shows, read back inside the transaction that ended it, and
    store the signature with the row: a row changed afterwards (by hand) no longer verifies.

    Only what the signature covers is read and rendered (representation.evaluation_signature): the
    signed columns, the tests' rows and the patch's digest, which the database computes
    (db/text.py). The agent's output, the patch, the test output and the log stay in the database:
    the process that ends an evaluation holds none of them a second time (issue 38).
    """
    row = (
        Evaluation.objects.filter(id=eval_id)
        .annotate(patch_sha256=Utf8Sha256("agent_patch"))
        .values_list(*representation.SIGNED_COLUMNS, "patch_sha256", named=True)
        .get()
    )
    tests = TestResult.objects.filter(evaluation_id=eval_id).values_list(
        *representation.TEST_RESULT_COLUMNS, named=True
    )
    signature = representation.evaluation_signature(row, tests, row.patch_sha256)
    Evaluation.objects.filter(id=eval_id).update(signature=signature)


def cancel(eval_id, reason: str) -> str | None:
    """DELETE: cancel a pending evaluation at once, ask a running one to stop.

    Returns the status after the call, or None if the evaluation had already ended.
    """
    if finish(
        eval_id,
        Status.CANCELLED,
        error=f"queued: {reason}",
        kind=CANCEL_KINDS.get(reason, ErrorKind.CANCELLED),
        expect=[Status.PENDING],
        cancel_reason=reason,
    ):
        return Status.CANCELLED
    asked = Evaluation.objects.filter(id=eval_id, status=Status.RUNNING).update(
        cancel_requested=True, cancel_reason=reason
    )
    return Status.RUNNING if asked else None


# -- batches (SPEC §14) ----------------------------------------------------------------------
#
# A batch row's ``status`` is written twice: ``pending`` at creation and, once, its final
# ``completed`` or ``cancelled`` with ``finished_at`` (settle). ``running`` is read from its
# evaluations (one has left the queue), not written: the worker's claim stays the one
# statement it is. DELETE marks ``cancel_requested`` at once, so the batch shows ``cancelled``
# while its running evaluations stop; it counts as open (MAX_OPEN_BATCHES) until they have.


def settle(batch_id) -> bool:
    """End the batch if none of its evaluations is still pending or running; True if this call ended it.

    Called after each of its evaluations ends (lifecycle.finish), after that change committed.
    One conditional UPDATE: two workers ending the last two evaluations at once both may
    find nothing active, and only the one whose UPDATE still sees finished_at NULL ends it
    (PostgreSQL re-checks the row's WHERE after the other's commit; SQLite writes one at a
    time), so the batch's callback is queued once.
    """
    now = timezone.now()
    with transaction.atomic():
        ended = (
            Batch.objects.filter(id=batch_id, finished_at__isnull=True)
            .filter(~Exists(_active_evaluations()))
            .update(
                finished_at=now,
                status=Case(When(cancel_requested=True, then=Value(Status.CANCELLED)), default=Value(Status.COMPLETED)),
                executor_version=VERSION,
                # The worker's callback dispatcher delivers it (evaluations/worker/callbacks.py).
                callback_state=Case(
                    When(callback_url="", then=Value(CallbackState.NONE)), default=Value(CallbackState.PENDING)
                ),
                callback_next_at=Case(When(callback_url="", then=None), default=Value(now)),
            )
        )
        if ended == 1:  # signed as _seal_evaluation signs, in the transaction that ended it
            document = representation.batch_json(batch_id)
            Batch.objects.filter(id=batch_id).update(signature=document["signature"])
            announce(batch_id)  # once it committed: the streams' done carries the signature
    return ended == 1


def settle_stranded() -> int:
    """End the open batches none of whose evaluations is active; returns how many (the reaper's pass).

    A worker killed between an evaluation's commit and its batch's settle leaves such a batch:
    open for ever, holding one of MAX_OPEN_BATCHES, its callback never sent.
    """
    stranded = Batch.objects.filter(finished_at__isnull=True).filter(~Exists(_active_evaluations()))
    return sum(settle(batch_id) for batch_id in stranded.values_list("id", flat=True))


def _active_evaluations():
    """The batch's (OuterRef) evaluations still pending or running."""
    return Evaluation.objects.filter(batch_id=OuterRef("pk"), status__in=list(ACTIVE_STATUSES))


def cancel_batch(batch_id, reason: str) -> list[str] | None:
    """DELETE /batches/{id}: cancel what has not finished; None if the batch had already ended.

    Each evaluation goes the way DELETE /evaluate/{id} takes it (lifecycle.cancel): a pending one
    ends now, a running one is asked to stop. Returns the statuses those calls left.
    """
    if not Batch.objects.filter(id=batch_id, finished_at__isnull=True).update(cancel_requested=True):
        return None
    outcomes = []
    pending = Evaluation.objects.filter(batch_id=batch_id, status__in=list(ACTIVE_STATUSES)).order_by("created_at")
    for eval_id in pending.values_list("id", flat=True):
        outcome = cancel(eval_id, reason)
        if outcome is not None:
            outcomes.append(outcome)
    settle(batch_id)  # nothing was left to cancel: the batch ends here
    return outcomes


# -- live sandboxes (SPEC §24): starting -> ready -> stopped, expired or failed --------------------


def start_sandbox(**fields) -> Sandbox:
    """A new sandbox, ``starting`` until its process says it runs."""
    return Sandbox.objects.create(status=SandboxStatus.STARTING, **fields)


def sandbox_ready(sandbox_id, **fields) -> bool:
    """A starting sandbox is ready; False when it ended meanwhile (a DELETE, the reaper)."""
    now = timezone.now()
    return bool(
        Sandbox.objects.filter(id=sandbox_id, status=SandboxStatus.STARTING).update(
            status=SandboxStatus.READY, ready_at=now, last_active_at=now, **fields
        )
    )


def sandbox_environment(sandbox_id, environment: dict) -> None:
    """A live sandbox's ``environment`` as it is now (its compose services' states, SPEC §24)."""
    Sandbox.objects.filter(id=sandbox_id, status__in=LIVE_SANDBOX_STATUSES).update(environment=environment)


def adopt_sandbox(sandbox_id, **fields) -> bool:
    """A warm sandbox (ready, pooled) taken by a request; False when another took it first."""
    return bool(
        Sandbox.objects.filter(id=sandbox_id, pooled=True, status=SandboxStatus.READY).update(pooled=False, **fields)
    )


def end_sandbox(sandbox_id, status: str, *, error: str = "", kind: str | None = None, **fields) -> bool:
    """A live sandbox's end, written once: False when it had already ended."""
    return bool(
        Sandbox.objects.filter(id=sandbox_id, status__in=LIVE_SANDBOX_STATUSES).update(
            status=status, error=error, error_kind=kind, ended_at=timezone.now(), **fields
        )
    )
