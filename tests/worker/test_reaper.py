"""The reaper (evaluations/worker/reaper.py): RETENTION_DAYS purges old rows (the counters /metrics and
/status report never go down), and session folders a dead process left are removed."""

import dataclasses
import uuid

import pytest
from django.utils import timezone

from evaluations import lifecycle, stats
from evaluations.models import Evaluation, PurgedTotals, Status
from evaluations.pipeline.session import RETIRED_PREFIX, Session
from evaluations.runtime import sandbox_uid
from evaluations.worker import reaper

pytestmark = pytest.mark.django_db


def ended(status, days_ago):
    evaluation = Evaluation.objects.create(task_url="https://x/t", agent_code="x", status=Status.RUNNING)
    lifecycle.finish(evaluation.id, status)
    Evaluation.objects.filter(id=evaluation.id).update(finished_at=timezone.now() - timezone.timedelta(days=days_ago))
    return evaluation


def test_purge_keeps_the_counters_and_only_removes_old_ended_rows(settings, api):
    old = [ended(Status.COMPLETED, 10), ended(Status.FAILED, 10), ended(Status.CANCELLED, 9)]
    recent = ended(Status.COMPLETED, 1)
    running = Evaluation.objects.create(task_url="https://x/t", agent_code="x", status=Status.RUNNING)
    before = stats.evaluation_counts()
    metrics_before = api.get("/metrics").content.decode()
    config = dataclasses.replace(settings.EXECUTOR, retention_days=7)
    assert reaper.purge_old(config.retention_days, dry_run=True) == 3
    assert Evaluation.objects.count() == 5
    assert reaper.purge_old(config.retention_days) == 3
    assert set(Evaluation.objects.values_list("id", flat=True)) == {recent.id, running.id}
    assert not Evaluation.objects.filter(id__in=[e.id for e in old]).exists()
    assert stats.evaluation_counts() == before
    assert PurgedTotals.objects.get().total == 3
    for name in ("term_executor_evaluations_total", "term_executor_evaluations_failed_total",
                 "term_executor_evaluations_cancelled_total", "term_executor_evaluations_passed_total"):  # fmt: skip
        lines = [line for line in metrics_before.splitlines() if line.startswith((name + " ", name + "{"))]
        assert lines and set(lines) <= set(api.get("/metrics").content.decode().splitlines()), name
    assert reaper.purge_old(config.retention_days) == 0  # idempotent
    assert reaper.purge_old(0) == 0  # 0 keeps everything


def test_reap_summary_counts_purged_rows(settings):
    ended(Status.COMPLETED, 30)
    summary = reaper.reap(
        dataclasses.replace(settings.EXECUTOR, retention_days=1, workspace_base=settings.EXECUTOR.data_dir / "none")
    )
    assert summary.purged == 1 and "purged=1" in summary.line()


def test_purge_removes_emptied_batches_and_unused_agent_archives(settings):
    from evaluations import agents
    from evaluations.models import AgentArchive, Batch

    long_ago = timezone.now() - timezone.timedelta(days=30)
    old_digest = agents.store_archive(b"an agent nobody submitted for a month")
    kept_digest = agents.store_archive(b"an agent a recent evaluation still uses")
    fresh_digest = agents.store_archive(b"an agent submitted just now, its evaluation not yet written")
    AgentArchive.objects.filter(sha256__in=[old_digest, kept_digest, fresh_digest]).update(last_used_at=long_ago)
    agents.store_archive(b"an agent submitted just now, its evaluation not yet written")  # touched again

    old_batch = Batch.objects.create(agent_archive_id=old_digest, finished_at=long_ago, status=Status.COMPLETED)
    in_batch = ended(Status.COMPLETED, 30)
    Evaluation.objects.filter(id=in_batch.id).update(batch=old_batch, agent_archive_id=old_digest)
    live_batch = Batch.objects.create(agent_archive_id=kept_digest, finished_at=long_ago, status=Status.COMPLETED)
    recent = ended(Status.COMPLETED, 1)
    Evaluation.objects.filter(id=recent.id).update(batch=live_batch, agent_archive_id=kept_digest)

    assert reaper.purge_old(7) == 1
    assert list(Batch.objects.values_list("id", flat=True)) == [live_batch.id]  # the emptied one is gone
    assert set(AgentArchive.objects.values_list("sha256", flat=True)) == {kept_digest, fresh_digest}
    # Submitting the purged content again stores it again.
    assert agents.store_archive(b"an agent nobody submitted for a month") == old_digest
    assert AgentArchive.objects.filter(sha256=old_digest).exists()


def _session(base):
    session = Session.create(base, str(uuid.uuid4()), sandbox_uid())
    (session.repo / "deep" / "er").mkdir(parents=True)
    (session.repo / "deep" / "er" / "file").write_text("x")
    return session


def test_the_reaper_removes_retired_folders_a_dead_process_left_but_not_fresh_ones(tmp_path, monkeypatch):
    base = tmp_path / "sessions"
    first, second = _session(base).retire(), _session(base).retire()
    not_ours = base / f"{RETIRED_PREFIX}not-an-eval-id"
    not_ours.mkdir()
    # Within the grace its own evaluation process may be removing it: left alone.
    assert reaper.remove_orphan_folders(base) == (0, 0)
    assert first.exists() and second.exists()
    monkeypatch.setattr(reaper, "RETIRED_GRACE_SECS", -1.0)  # ctime cannot be set back: shorten the grace
    assert reaper.remove_orphan_folders(base, dry_run=True) == (2, 0)
    assert first.exists() and second.exists()
    assert reaper.remove_orphan_folders(base) == (2, 0)
    assert sorted(p.name for p in base.iterdir()) == [not_ours.name]
