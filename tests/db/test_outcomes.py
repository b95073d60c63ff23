"""error_kind: set where evaluations end (lifecycle.finish), decided from data (pipeline/outcome.py),
counted by /metrics, kept when rows are purged."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from evaluations import lifecycle
from evaluations.db import stats
from evaluations.models import SHUTTING_DOWN, TTL_EXPIRED, ErrorKind, Evaluation, PurgedTotals, Status, Step
from evaluations.network import urlguard
from evaluations.pipeline import gitrepo, outcome
from evaluations.pipeline.archive import ArchiveError
from evaluations.pipeline.cancel import CancelState, Stop
from evaluations.pipeline.context import Cancelled, Context, StepFailed, WorkerLost
from evaluations.worker import reaper

pytestmark = pytest.mark.django_db


def running() -> Evaluation:
    evaluation = Evaluation.objects.create(task_url="https://x/t.tar.gz", agent_code="x")
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], started_at=timezone.now())
    return evaluation


def kind_of(evaluation) -> str | None:
    evaluation.refresh_from_db()
    return evaluation.error_kind


def test_finish_writes_the_kind_none_when_passed_and_a_default_when_not_given():
    passed, failed, cancelled, unclassified = running(), running(), running(), running()
    assert kind_of(passed) is None  # null while running
    lifecycle.finish(passed.id, Status.COMPLETED, kind=ErrorKind.TESTS_FAILED)  # a pass has none, whatever is said
    lifecycle.finish(failed.id, Status.FAILED, error="running_tests: 1 of 1 tests failed (t)", kind="tests_failed")
    lifecycle.finish(cancelled.id, Status.CANCELLED, error="running_agent: cancelled by DELETE")
    lifecycle.finish(unclassified.id, Status.FAILED, error="x: y")
    assert [kind_of(e) for e in (passed, failed, cancelled, unclassified)] == [
        None,
        "tests_failed",
        "cancelled",
        "infrastructure",
    ]
    with pytest.raises(ValueError):
        lifecycle.finish(running().id, Status.FAILED, kind="bad_luck")


def test_delete_of_a_pending_evaluation_and_the_ttl_are_cancelled_the_lost_worker_infrastructure():
    pending = Evaluation.objects.create(task_url="https://x/t.tar.gz", agent_code="x")
    assert lifecycle.cancel(pending.id, "cancelled by DELETE") == Status.CANCELLED
    assert kind_of(pending) == "cancelled"
    old = Evaluation.objects.create(
        task_url="https://x/t.tar.gz", agent_code="x", created_at=timezone.now() - timezone.timedelta(hours=2)
    )
    assert reaper.expire_sessions(60) == 1
    old.refresh_from_db()
    assert (old.status, old.cancel_reason, old.error_kind) == ("cancelled", TTL_EXPIRED, "cancelled")
    lost = running()  # no worker beats for it
    assert reaper.fail_lost(30) == [lost.id]
    lost.refresh_from_db()
    assert (lost.status, lost.error, lost.error_kind) == ("failed", "queued: executor worker lost", "infrastructure")


@pytest.mark.parametrize(
    ("step", "exc", "kind"),
    [
        # A raiser that knows says so: the agents' install of a broken archive (SPEC §14).
        (Step.INSTALLING_AGENT, StepFailed("pip install -r requirements.txt exited 1", kind="agent_invalid"),
         "agent_invalid"),
        (Step.INSTALLING_AGENT, StepFailed("no entry point"), "agent_invalid"),  # the step's rule
        (Step.RUNNING_TESTS, StepFailed("task defines no tests", kind="task_invalid"), "task_invalid"),
        (Step.DOWNLOADING_TASK, StepFailed("workspace.yaml: missing required key 'repo'"), "task_invalid"),
        (Step.CLONING_REPO, StepFailed("base_commit 1a2b not found"), "task_invalid"),
        (Step.INSTALLING_DEPS, StepFailed("install command 'make' exited with code 2: x"), "task_invalid"),
        (Step.RUNNING_AGENT, StepFailed("agent language 'node' is not installed"), "infrastructure"),
        (Step.RUNNING_AGENT, Cancelled("agent timed out after 5 s", kind="agent_timeout"), "agent_timeout"),
        (Step.RUNNING_AGENT, Cancelled("cancelled by DELETE"), "cancelled"),
        (Step.RUNNING_AGENT, WorkerLost("executor worker lost"), "infrastructure"),
        (Step.RUNNING_TESTS, OSError(28, "No space left on device"), "infrastructure"),  # an internal error
    ],
)  # fmt: skip
def test_the_kind_of_a_pipeline_that_ended_with_an_exception(step, exc, kind):
    assert outcome.of_exception(step, exc) == kind


def test_fetch_archive_and_git_errors_carry_whether_the_network_failed():
    assert outcome.of_fetch(urlguard.FetchError("task_url http://h/t: [Errno 111] refused", transient=True)) == (
        "infrastructure"
    )
    assert outcome.of_fetch(urlguard.FetchError("task_url http://h/t answered HTTP 404 Not Found")) is None
    assert outcome.of_fetch(ArchiveError("task archive cannot be extracted (No space left)", transient=True)) == (
        "infrastructure"
    )
    assert outcome.of_git(gitrepo.GitError("git clone of x timed out after 2 s", transient=True)) == "infrastructure"
    assert outcome.of_git(gitrepo.GitError("git clone was stopped: disk", limit_exceeded=True)) == "limit_exceeded"
    assert outcome.of_git(gitrepo.GitError("base_commit 1a2b not found in x")) is None
    assert outcome.of_git(urlguard.URLRefused("repo host h cannot be resolved (x)", transient=True)) == "infrastructure"
    assert outcome.of_git(urlguard.URLRefused("repo host h resolves to a private address (10.0.0.1)")) is None
    # git's own words are all there is to tell a network failure from a missing repository.
    assert gitrepo.network_trouble("fatal: unable to access 'http://h/r/': Failed to connect to h port 1")
    assert gitrepo.network_trouble("fatal: unable to access 'http://h/r/': The requested URL returned error: 502")
    assert not gitrepo.network_trouble("fatal: repository 'http://h/r/' not found")
    assert not gitrepo.network_trouble("fatal: unable to access 'http://h/r/': The requested URL returned error: 403")


def test_a_shutdown_cancel_is_infrastructure_any_other_cancel_cancelled():
    def raised(reason: str) -> Cancelled | WorkerLost:
        state = CancelState()
        state.set(Stop.CANCELLED, reason)
        ctx = Context.__new__(Context)
        ctx.cancel = state
        with pytest.raises((Cancelled, WorkerLost)) as caught:
            ctx.raise_cancelled()
        return caught.value

    assert raised(SHUTTING_DOWN).kind == "infrastructure"
    assert raised(TTL_EXPIRED).kind == "cancelled"
    assert raised("cancelled by DELETE").kind == "cancelled"


def failed_metric(text: str, family: str) -> dict[str, float]:
    return {
        kind: float(value)
        for kind, value in re.findall(
            rf'^term_executor_evaluations_{family}_total{{error_kind="(\w+)"}} (\S+)$', text, re.M
        )
    }


def test_metrics_count_by_error_kind_and_keep_purged_rows(api):
    ends = [
        (Status.FAILED, ErrorKind.TESTS_FAILED),
        (Status.FAILED, ErrorKind.TESTS_FAILED),
        (Status.FAILED, ErrorKind.TASK_INVALID),
        (Status.FAILED, ErrorKind.INFRASTRUCTURE),
        (Status.CANCELLED, ErrorKind.AGENT_TIMEOUT),
        (Status.CANCELLED, ErrorKind.CANCELLED),
        (Status.COMPLETED, None),
    ]
    rows = []
    for status, kind in ends:
        evaluation = running()
        lifecycle.finish(evaluation.id, status, kind=kind)
        rows.append(evaluation)
    Evaluation.objects.create(task_url="https://x/t", agent_code="x", status=Status.FAILED)  # ended before error_kind
    text = api.get("/metrics").content.decode()
    failed, cancelled = failed_metric(text, "failed"), failed_metric(text, "cancelled")
    assert {k: v for k, v in failed.items() if v} == {
        "tests_failed": 2,
        "task_invalid": 1,
        "infrastructure": 1,
        "unknown": 1,
    }
    assert set(ErrorKind.values) <= set(failed)  # every kind has its series, zero included
    assert {k: v for k, v in cancelled.items() if v} == {"agent_timeout": 1, "cancelled": 1}
    assert sum(failed.values()) == stats.evaluation_counts()["failed"] == 5
    # Purge all but two: the counters stay where they were.
    Evaluation.objects.exclude(id__in=[rows[0].id, rows[5].id]).update(
        finished_at=timezone.now() - timezone.timedelta(days=30)
    )
    assert reaper.purge_old(7) == 6
    assert Evaluation.objects.count() == 2
    assert PurgedTotals.objects.get().error_kinds == {
        "failed": {"tests_failed": 1, "task_invalid": 1, "infrastructure": 1, "unknown": 1},
        "cancelled": {"agent_timeout": 1},
    }
    after = api.get("/metrics").content.decode()
    assert (failed_metric(after, "failed"), failed_metric(after, "cancelled")) == (failed, cancelled)
    # A later purge adds to what was kept.
    Evaluation.objects.update(finished_at=timezone.now() - timezone.timedelta(days=30))
    assert reaper.purge_old(7) == 2
    last = api.get("/metrics").content.decode()
    assert (failed_metric(last, "failed"), failed_metric(last, "cancelled")) == (failed, cancelled)
    assert PurgedTotals.objects.get().error_kinds["failed"]["tests_failed"] == 2
