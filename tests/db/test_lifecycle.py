"""lifecycle.record: the conditional row update and the transition chain, on the configured database."""

import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from evaluations import lifecycle
from evaluations.models import Evaluation, Status, Step, Transition

pytestmark = pytest.mark.django_db

T0 = datetime.datetime(2026, 11, 23, 7, 0, 0, tzinfo=datetime.UTC)


@pytest.fixture
def clock(monkeypatch):
    """timezone.now() as record() sees it, moved by hand."""
    now = {"at": T0}
    monkeypatch.setattr(lifecycle.timezone, "now", lambda: now["at"])

    def advance(ms: int) -> None:
        now["at"] += datetime.timedelta(milliseconds=ms)

    return advance


def new_evaluation() -> Evaluation:
    return Evaluation.objects.create(
        task_url="https://example.com/t.tgz", agent_code="x", status=Status.PENDING, step=Step.QUEUED, created_at=T0
    )


def chain(evaluation) -> list[tuple]:
    return list(
        Transition.objects.filter(evaluation=evaluation)
        .order_by("at", "id")
        .values_list("step", "status", "at", "duration_ms")
    )


def test_each_change_stores_a_transition_and_closes_the_previous_one(clock):
    evaluation = new_evaluation()
    assert lifecycle.record(
        evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], worker_id="w1", started_at=T0
    )
    clock(250)
    assert lifecycle.record(str(evaluation.id), step=Step.DOWNLOADING_TASK)  # a str id works too
    clock(1500)
    assert lifecycle.record(evaluation.id, step=Step.CLONING_REPO)
    assert chain(evaluation) == [
        (Step.QUEUED, Status.RUNNING, T0, 250),
        (Step.DOWNLOADING_TASK, Status.RUNNING, T0 + datetime.timedelta(milliseconds=250), 1500),
        (Step.CLONING_REPO, Status.RUNNING, T0 + datetime.timedelta(milliseconds=1750), None),
    ]
    evaluation.refresh_from_db()
    assert (evaluation.step, evaluation.status, evaluation.worker_id, evaluation.started_at) == (
        Step.CLONING_REPO,
        Status.RUNNING,
        "w1",
        T0,
    )


def test_a_row_not_in_the_expected_status_changes_nothing(clock):
    evaluation = new_evaluation()
    lifecycle.record(evaluation.id, step=Step.QUEUED)
    before = chain(evaluation)
    clock(10)
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.RUNNING], worker_id="late") is False
    assert chain(evaluation) == before
    evaluation.refresh_from_db()
    assert (evaluation.status, evaluation.worker_id) == (Status.PENDING, "")
    assert lifecycle.record("6f1f4a56-5ad4-4f0f-9d62-0fbd3f9b3c11", step=Step.CLEANUP) is False  # no such row


def test_finish_ends_the_chain_with_done_and_the_final_status(clock):
    evaluation = new_evaluation()
    lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], started_at=timezone.now())
    clock(40)
    assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: task defines no tests")
    steps = chain(evaluation)
    assert steps[-2][3] == 40 and steps[-1][:2] == (Step.DONE, Status.FAILED) and steps[-1][3] is None
    evaluation.refresh_from_db()
    assert (evaluation.passed, evaluation.duration_ms, evaluation.error) == (
        False,
        40,
        "running_tests: task defines no tests",
    )
    assert lifecycle.finish(evaluation.id, Status.COMPLETED) is False  # already ended


# -- the pipeline's writer (lifecycle.Progress, SPEC §25) ------------------------------------------


def queued_evaluation() -> Evaluation:
    """As POST /evaluate leaves one: pending at queued, with its first transition."""
    evaluation = Evaluation(task_url="https://example.com/t.tgz", agent_code="x", created_at=T0)
    lifecycle.queue([evaluation])
    return evaluation


def running_evaluation() -> Evaluation:
    evaluation = queued_evaluation()
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], started_at=T0)
    return evaluation


def row(evaluation, *fields) -> tuple:
    return Evaluation.objects.filter(id=evaluation.id).values_list(*fields).get()


def test_the_pipelines_transitions_chain_as_records_do(clock):
    evaluation = running_evaluation()
    progress = lifecycle.Progress(str(evaluation.id))
    clock(250)
    assert progress.record(Step.DOWNLOADING_TASK)  # the first looks the claim's transition up
    clock(1500)
    assert progress.record(Step.CLONING_REPO)
    clock(30)
    assert progress.finish(Status.FAILED, error="cloning_repo: no such commit", kind="task_invalid")
    ms = datetime.timedelta(milliseconds=1)
    assert chain(evaluation) == [
        (Step.QUEUED, Status.PENDING, T0, 0),
        (Step.QUEUED, Status.RUNNING, T0, 250),
        (Step.DOWNLOADING_TASK, Status.RUNNING, T0 + 250 * ms, 1500),
        (Step.CLONING_REPO, Status.RUNNING, T0 + 1750 * ms, 30),
        (Step.DONE, Status.FAILED, T0 + 1780 * ms, None),
    ]
    assert row(evaluation, "step", "status", "duration_ms", "error_kind") == (
        Step.DONE, Status.FAILED, 1780, "task_invalid"
    )  # fmt: skip


def test_what_a_step_stages_is_written_with_the_next_transition(clock):
    evaluation = running_evaluation()
    progress = lifecycle.Progress(evaluation.id)
    assert progress.record(Step.DOWNLOADING_TASK)
    progress.stage(task_sha256="ab" * 32)
    progress.stage(task_prompt="Fix add().")
    assert row(evaluation, "task_sha256", "task_prompt") == ("", "")  # nothing before the transition
    assert progress.record(Step.PREPARING_ENVIRONMENT)
    assert row(evaluation, "step", "task_sha256", "task_prompt") == (
        Step.PREPARING_ENVIRONMENT,
        "ab" * 32,
        "Fix add().",
    )
    assert progress.staged == {}


def test_a_step_that_stages_then_fails_has_it_stored_with_the_failure(clock):
    """running_agent stages the agent's output whatever happens, then fails: cleanup's transition
    carries it, and finish carries what cleanup staged after."""
    evaluation = running_evaluation()
    progress = lifecycle.Progress(evaluation.id)
    assert progress.record(Step.RUNNING_AGENT)
    progress.stage(agent_output="out of memory\n", agent_exit_code=137)
    assert progress.record(Step.CLEANUP)
    progress.stage(log="=== running_agent ===\nout of memory\n", resources={"cpu_seconds": 1.5})
    assert progress.finish(Status.FAILED, error="running_agent: memory limit", kind="limit_exceeded")
    assert row(evaluation, "status", "agent_output", "agent_exit_code", "log", "resources") == (
        Status.FAILED, "out of memory\n", 137, "=== running_agent ===\nout of memory\n", {"cpu_seconds": 1.5}
    )  # fmt: skip


def test_finish_carries_what_no_transition_took(clock):
    evaluation = running_evaluation()
    progress = lifecycle.Progress(evaluation.id)
    progress.stage(task_sha256="cd" * 32)  # staged, then the evaluation ends before another step
    assert progress.finish(Status.FAILED, error="downloading_task: not an archive", kind="task_invalid")
    assert row(evaluation, "status", "task_sha256") == (Status.FAILED, "cd" * 32)


def test_a_cancel_after_staging_stores_it_with_the_cancel(clock):
    evaluation = running_evaluation()
    progress = lifecycle.Progress(evaluation.id)
    assert progress.record(Step.RUNNING_AGENT)
    progress.stage(agent_output="halfway\n")
    assert lifecycle.cancel(evaluation.id, "cancelled by DELETE") == Status.RUNNING  # asked to stop
    assert progress.record(Step.CLEANUP)
    assert progress.finish(Status.CANCELLED, error="running_agent: cancelled by DELETE", kind="cancelled")
    assert row(evaluation, "status", "cancel_reason", "agent_output") == (
        Status.CANCELLED, "cancelled by DELETE", "halfway\n"
    )  # fmt: skip


def test_a_row_ended_elsewhere_takes_nothing_staged(clock):
    evaluation = running_evaluation()
    progress = lifecycle.Progress(evaluation.id)
    assert progress.record(Step.RUNNING_AGENT)
    progress.stage(agent_output="late\n")
    assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_agent: executor worker lost")  # the reaper
    signature = row(evaluation, "signature")
    before = chain(evaluation)
    assert progress.record(Step.CLEANUP) is False
    assert progress.finish(Status.FAILED, error="running_agent: boom") is False
    assert chain(evaluation) == before
    assert row(evaluation, "agent_output", "error", "signature") == (
        "",
        "running_agent: executor worker lost",
        *signature,
    )


def data_statements(queries) -> list[str]:
    """What the captured queries did, as ``VERB table``: no savepoint or other transaction control."""
    found = []
    for query in queries.captured_queries:
        words = query["sql"].replace('"', "").split()
        verb = words[0].upper()
        if verb in ("UPDATE", "SELECT", "INSERT", "DELETE"):
            table = words[2] if verb == "INSERT" else words[1] if verb == "UPDATE" else _from(words)
            found.append(f"{verb} {table}")
    return found


def _from(words: list[str]) -> str:
    return words[[w.upper() for w in words].index("FROM") + 1]


def test_a_pipeline_transition_is_three_statements(clock):
    """The conditional UPDATE (with the staged fields), the previous transition's duration, the new
    transition: nothing is read back. This count must not grow back (SPEC §25)."""
    evaluation = running_evaluation()
    progress = lifecycle.Progress(evaluation.id)
    assert progress.record(Step.DOWNLOADING_TASK)
    progress.stage(task_sha256="ab" * 32)
    with CaptureQueriesContext(connection) as queries:
        assert progress.record(Step.PREPARING_ENVIRONMENT)
    assert data_statements(queries) == [
        "UPDATE evaluations_evaluation",
        "UPDATE evaluations_transition",
        "INSERT evaluations_transition",
    ]
    with CaptureQueriesContext(connection) as queries:
        assert progress.finish(Status.COMPLETED)
    # finish's own reads (the row's times, the tests for the hash) and the seal; no transition read.
    assert "SELECT evaluations_transition" not in data_statements(queries)
    assert data_statements(queries).count("UPDATE evaluations_evaluation") == 2  # the end, then its signature


STAGED_KINDS = {
    "agent_patch": "diff --git a/é b/é\n+✓\n".encode(),  # a text column as its UTF-8, made text by the database
    "agent_output": "ünïcode\n",
    "agent_exit_code": 137,
    "passed": False,
    "reward": 0.25,
    "finished_at": T0 + datetime.timedelta(seconds=3),
    "resources": {"cpu_seconds": 1.5, "peak_memory_bytes": 1 << 30},
    "egress": [{"host": "pypi.org", "allowed": True}],
    "metadata": None,
    "error_kind": None,
}


def test_a_pipeline_transition_writes_every_kind_of_column_as_the_orm_does(clock):
    """Progress.record's hand-made statements (db/progress.py) and the ORM's (lifecycle.record) store
    the same row and chain, whatever a step staged: text, its UTF-8, numbers, times, JSON, nulls."""
    written = []
    for by_progress in (True, False):
        evaluation = running_evaluation()
        progress = lifecycle.Progress(evaluation.id)
        assert progress.record(Step.RUNNING_AGENT)
        clock(40)
        if by_progress:
            progress.stage(**STAGED_KINDS)
            assert progress.record(Step.RUNNING_TESTS)
        else:
            assert lifecycle.record(evaluation.id, step=Step.RUNNING_TESTS, expect=[Status.RUNNING], **STAGED_KINDS)
        (_, _, started, closed), (step, status, at, duration) = chain(evaluation)[-2:]
        written.append(
            (row(evaluation, *STAGED_KINDS, "step", "status"), (closed, step, status, at - started, duration))
        )
    assert written[0] == written[1]
    assert written[0][0][0] == "diff --git a/é b/é\n+✓\n"
    assert written[0][1] == (40, Step.RUNNING_TESTS, Status.RUNNING, datetime.timedelta(milliseconds=40), None)


def test_record_without_a_known_row_reads_only_what_the_change_does_not_say(clock):
    evaluation = queued_evaluation()
    with CaptureQueriesContext(connection) as queries:  # a claim: the status moves, the step is the row's
        assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    assert data_statements(queries) == [
        "UPDATE evaluations_evaluation",
        "SELECT evaluations_evaluation",
        "SELECT evaluations_transition",
        "UPDATE evaluations_transition",
        "INSERT evaluations_transition",
    ]
    with CaptureQueriesContext(connection) as queries:  # step given, and the one status expected
        assert lifecycle.record(evaluation.id, step=Step.DOWNLOADING_TASK, expect=[Status.RUNNING])
    assert "SELECT evaluations_evaluation" not in data_statements(queries)


def test_each_committed_transition_is_announced_once(clock, django_capture_on_commit_callbacks):
    evaluation = running_evaluation()
    progress = lifecycle.Progress(evaluation.id)
    with django_capture_on_commit_callbacks() as announced:
        assert progress.record(Step.DOWNLOADING_TASK)
        assert progress.record(Step.CLEANUP)
    assert len(announced) == 2
    lifecycle.finish(evaluation.id, Status.FAILED, error="cleanup: executor worker lost")
    with django_capture_on_commit_callbacks() as announced:
        assert progress.record(Step.DONE) is False
    assert announced == []
