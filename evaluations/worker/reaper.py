"""Keeping the host and the database clean: what `reap_sessions` and the worker's timer do.

Every function is idempotent and conditional on the state it expects, so it
is safe beside a running worker and safe to run twice.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from evaluations import artifacts, lifecycle
from evaluations.cache import mounts
from evaluations.cache.store import Store
from evaluations.db import stats
from evaluations.models import (
    ACTIVE_STATUSES,
    TTL_EXPIRED,
    WORKER_LOST,
    AgentArchive,
    Batch,
    ErrorKind,
    Evaluation,
    Status,
)
from evaluations.pipeline.session import RETIRED_PREFIX
from evaluations.safefs import remove_patiently, remove_tree_nofollow
from evaluations.sandboxes import reaping as sandbox_reaping

logger = logging.getLogger("term_executor.reaper")

RETIRED_GRACE_SECS = 60.0


@dataclass
class ReapSummary:
    expired: int = 0
    lost: int = 0
    folders_removed: int = 0
    purged: int = 0
    processes_killed: int = 0
    cgroups_removed: int = 0
    image_builds_removed: int = 0
    image_pins_removed: int = 0
    image_tmp_removed: int = 0
    artifacts_removed: int = 0
    sandboxes_lost: int = 0
    sandboxes_removed: int = 0

    def line(self, dry_run: bool = False) -> str:
        prefix = "reap_sessions (dry run):" if dry_run else "reap_sessions:"
        return (
            f"{prefix} expired={self.expired} lost={self.lost} folders_removed={self.folders_removed} "
            f"purged={self.purged} processes_killed={self.processes_killed} cgroups_removed={self.cgroups_removed} "
            f"image_builds_removed={self.image_builds_removed} image_pins_removed={self.image_pins_removed} "
            f"image_tmp_removed={self.image_tmp_removed} artifacts_removed={self.artifacts_removed} "
            f"sandboxes_lost={self.sandboxes_lost} sandboxes_removed={self.sandboxes_removed}"
        )


def live_worker_ids(stale_secs: int) -> set[str]:
    return {w.worker_id for w in stats.live_workers(stale_secs)}


def expire_sessions(ttl_secs: int, *, dry_run: bool = False) -> int:
    """Pending evaluations past the TTL are cancelled; running ones are asked to stop."""
    cutoff = timezone.now() - timezone.timedelta(seconds=ttl_secs)
    count = 0
    for eval_id in Evaluation.objects.filter(status=Status.PENDING, created_at__lt=cutoff).values_list("id", flat=True):
        if dry_run or lifecycle.finish(
            eval_id,
            Status.CANCELLED,
            error=f"queued: {TTL_EXPIRED}",
            kind=ErrorKind.CANCELLED,
            expect=[Status.PENDING],
            cancel_reason=TTL_EXPIRED,
        ):
            count += 1
    running = Evaluation.objects.filter(status=Status.RUNNING, started_at__lt=cutoff, cancel_requested=False)
    count += running.count() if dry_run else running.update(cancel_requested=True, cancel_reason=TTL_EXPIRED)
    return count


def fail_lost(stale_secs: int, *, dry_run: bool = False) -> list:
    """Running evaluations whose worker stopped beating are failed; returns their ids."""
    live = live_worker_ids(stale_secs)
    lost = []
    for eval_id, step in (
        Evaluation.objects.filter(status=Status.RUNNING).exclude(worker_id__in=live).values_list("id", "step")
    ):
        if dry_run or lifecycle.finish(
            eval_id,
            Status.FAILED,
            error=f"{step}: {WORKER_LOST}",
            kind=ErrorKind.INFRASTRUCTURE,
            expect=[Status.RUNNING],
        ):
            lost.append(eval_id)
    return lost


def _kill_tagged(eval_id) -> int:
    from evaluations.runtime.killer import kill_all

    return kill_all(str(eval_id))


def remove_orphan_folders(workspace_base: Path, *, dry_run: bool = False) -> tuple[int, int]:
    """Delete session folders of evaluations that are not live; never anything outside the base."""
    try:
        entries = list(os.scandir(workspace_base))
    except FileNotFoundError:
        return 0, 0
    names = {}
    retired = []
    for entry in entries:
        name = entry.name
        if name.startswith(RETIRED_PREFIX):
            name = name[len(RETIRED_PREFIX) :]
        try:
            eval_id = uuid.UUID(name)
        except ValueError:
            continue  # not ours: the reaper only touches folders named by an eval_id
        if name == entry.name:
            names[entry.name] = eval_id
        elif _older_than(entry, RETIRED_GRACE_SECS):  # else its own process may be removing it now
            retired.append(entry)
    live = set(
        str(i)
        for i in Evaluation.objects.filter(id__in=list(names.values()), status__in=ACTIVE_STATUSES).values_list(
            "id", flat=True
        )
    )
    removed = killed = 0
    for entry in entries:
        if entry.name not in names or str(names[entry.name]) in live:
            continue
        removed += 1
        if dry_run:
            continue
        killed += _kill_tagged(names[entry.name])
        if not _remove_entry(entry):
            removed -= 1  # left for the next pass
    for entry in retired:  # moved away at cleanup (Session.retire), its process died before removing it
        removed += 1
        if not dry_run and not _remove_entry(entry):
            removed -= 1
    return removed, killed


def _older_than(entry: os.DirEntry, seconds: float) -> bool:
    try:
        return time.time() - entry.stat(follow_symlinks=False).st_ctime > seconds  # a rename sets ctime
    except OSError:
        return False


def _remove_entry(entry: os.DirEntry) -> bool:
    """Remove one session folder (a link as a link). A process of a lost evaluation may still
    be writing into it for a moment (it sees its row ended within WATCH_SECS, 1 s, then kills its
    command and cleans up): retried for a few seconds (``remove_patiently``), then left to the next
    pass rather than failing the whole reap."""

    def remove() -> None:
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.path)  # its target is untouched
        else:
            if os.geteuid() == 0:
                mounts.unmount_below(Path(entry.path))  # the workspace cache's overlays, before the walk
            remove_tree_nofollow(Path(entry.path))

    error = remove_patiently(remove)
    if error is not None:
        logger.warning("could not remove %s yet: %s", entry.path, error)
    return error is None


def purge_old(retention_days: int, *, dry_run: bool = False, config=None) -> int:
    """Delete ended evaluations older than the retention; their counts move to PurgedTotals.

    Their kept artifacts (``config``'s store; reap passes its own) go first, then the rows: a crash
    between leaves rows past retention without their files, which the next pass purges, never
    files without a row. Without ``config`` the orphan sweep (remove_orphan_artifacts) removes them.
    """
    if retention_days <= 0:
        return 0
    cutoff = timezone.now() - timezone.timedelta(days=retention_days)
    old = Evaluation.objects.filter(finished_at__lt=cutoff).exclude(status__in=ACTIVE_STATUSES)
    # A batch's evaluations go with the batch, once it is past retention too: one purged early would
    # change the batch object its signature (SPEC §18) and its counts were made over.
    old = old.filter(Q(batch__isnull=True) | Q(batch__finished_at__lt=cutoff))
    if dry_run:
        return old.count()
    with transaction.atomic():
        ids = list(old.values_list("id", flat=True)[:10000])
        if not ids:
            return 0
        if config is not None:
            artifacts.remove(ids, config)
        batch = Evaluation.objects.filter(id__in=ids)
        stats.add_to_purged_totals(batch)
        _total, per_model = batch.delete()
        _purge_emptied(cutoff)
    return per_model.get("evaluations.Evaluation", 0)


def _purge_emptied(cutoff) -> None:
    """Batches ended before the cutoff whose evaluations are all purged (a batch of none would read
    total 0), then agent archives that no row points at and nobody submitted since the cutoff
    (agents.store_archive touches a row it reuses, so a submission in flight keeps its archive)."""
    has_evaluations = Exists(Evaluation.objects.filter(batch=OuterRef("pk")))
    Batch.objects.filter(finished_at__lt=cutoff).exclude(has_evaluations).delete()
    used = Exists(Evaluation.objects.filter(agent_archive=OuterRef("pk"))) | Exists(
        Batch.objects.filter(agent_archive=OuterRef("pk"))
    )
    AgentArchive.objects.filter(last_used_at__lt=cutoff).exclude(used).delete()


def reap(config, *, dry_run: bool = False) -> ReapSummary:
    summary = ReapSummary()
    summary.expired = expire_sessions(config.session_ttl_secs, dry_run=dry_run)
    lost = fail_lost(config.worker_stale_secs, dry_run=dry_run)
    summary.lost = len(lost)
    if not dry_run:
        for eval_id in lost:
            summary.processes_killed += _kill_tagged(eval_id)
    summary.folders_removed, killed = remove_orphan_folders(config.workspace_base, dry_run=dry_run)
    summary.processes_killed += killed
    summary.sandboxes_lost = len(
        sandbox_reaping.end_lost(config, live_worker_ids(config.worker_stale_secs), dry_run=dry_run)
    )
    summary.sandboxes_removed = sandbox_reaping.remove_orphans(config, dry_run=dry_run)
    summary.purged = purge_old(config.retention_days, dry_run=dry_run, config=config)
    summary.artifacts_removed = remove_orphan_artifacts(config, dry_run=dry_run)
    summary.cgroups_removed = remove_stale_cgroups(config, dry_run=dry_run)
    if not dry_run:
        tend_cache(config)
        summary.image_builds_removed, summary.image_pins_removed, summary.image_tmp_removed = tend_images(config)
        if ended := lifecycle.settle_stranded():
            logger.warning("ended %d batch(es) whose last evaluation ended without ending them", ended)
    return summary


ORPHAN_QUERY_CHUNK = 500  # ids per query: under SQLite's oldest limit of 999 parameters


def remove_orphan_artifacts(config, *, dry_run: bool = False) -> int:
    """Kept artifacts whose evaluation row is gone (deleted by other means than purge_old, which
    removes its own), and unfinished copies whose evaluation is no longer running (its worker died
    in ``artifacts.keep``). Returns how many folders were (or, dry, would be) removed."""
    folders = artifacts.stored_folders(config)
    if not folders:
        return 0
    ids = sorted({folder.eval_id for folder in folders})
    existing, active = set(), set()
    for start in range(0, len(ids), ORPHAN_QUERY_CHUNK):
        chunk = ids[start : start + ORPHAN_QUERY_CHUNK]
        for eval_id, status in Evaluation.objects.filter(id__in=chunk).values_list("id", "status"):
            existing.add(eval_id)
            if status in ACTIVE_STATUSES:
                active.add(eval_id)
    removed = 0
    for folder in folders:
        if folder.eval_id in (existing if folder.complete else active):
            continue
        removed += 1
        if dry_run:
            continue
        try:
            artifacts.remove_folder(config, folder.name)
        except OSError as exc:
            logger.warning("could not remove artifacts folder %s: %s", folder.name, exc)
            removed -= 1
    return removed


def remove_stale_cgroups(config, *, dry_run: bool = False) -> int:
    """The cgroups of evaluations that are not live (their worker was killed): processes and all."""
    if os.geteuid() != 0:
        return 0
    from evaluations.runtime import cgroups

    support = cgroups.detect(config.cgroup_parent)
    live = [str(i) for i in Evaluation.objects.filter(status__in=ACTIVE_STATUSES).values_list("id", flat=True)]
    live += sandbox_reaping.live_tags()
    if dry_run:
        return len(cgroups.stale_cgroups(live, support=support))
    return len(cgroups.remove_stale(live, support=support))


def tend_cache(config) -> int:
    """Unfinished snapshot builds of evaluations that ended (a killed worker's), then eviction (SPEC §13).

    A build folder is never an entry (only its rename is), so removing one loses nothing; an
    evaluation still running keeps its own. Returns how many builds were removed.
    """
    store = Store(config.cache_root)
    builds = store.builds()
    if not builds:
        removed = 0
    else:
        ids = [eval_id for _, eval_id in builds if _is_uuid(eval_id)]
        live = {
            str(i)
            for i in Evaluation.objects.filter(id__in=ids, status__in=ACTIVE_STATUSES).values_list("id", flat=True)
        }
        removed = 0
        for folder, eval_id in builds:
            if eval_id not in live:
                store.abandon(folder)
                removed += 1
    try:
        store.evict(
            max_bytes=config.cache_max_bytes,
            max_files=config.cache_max_files,
            max_age_secs=config.cache_max_age_secs,
        )
    except OSError as exc:
        logger.warning("workspace cache eviction failed: %s", exc)
    return removed


def tend_images(config) -> tuple[int, int, int]:
    """The image store (SPEC §16, §21): build folders of builds whose process died (their lock free;
    unmounted, then removed), pins whose holder died, and what killed pulls, imports and exports
    left in its ``tmp/`` (their owner's lock free). (builds removed, pin files removed, tmp entries
    removed); nothing when there is no store yet."""
    root = config.images_root
    if not root.is_dir():
        return 0, 0, 0
    from evaluations.images.store import BUILD_REACH, ImageStore

    store = ImageStore(root)
    try:
        builds = store.remove_dead_builds(config.workspace_base / BUILD_REACH)
        return builds, store.remove_dead_pins(), store.remove_dead_tmp()[0]
    except OSError as exc:
        logger.warning("image store upkeep failed: %s", exc)
        return 0, 0, 0


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
