"""The reaper (evaluations/worker/reaper.py): RETENTION_DAYS purges old rows (the counters /metrics and
/status report never go down), and session folders, image builds and image pins a dead process left
are removed."""

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from types import SimpleNamespace

import pytest
from django.utils import timezone

from evaluations import lifecycle, safefs
from evaluations.db import stats
from evaluations.images.store import BUILD_REACH, ImageRecord, ImageStore, now_iso
from evaluations.models import Evaluation, PurgedTotals, SandboxStatus, Status, WorkerHeartbeat
from evaluations.pipeline.session import RETIRED_PREFIX, Session
from evaluations.runtime import sandbox_uid
from evaluations.sandboxes import reaping as sandbox_reaping
from evaluations.sandboxes.host import session_name
from evaluations.worker import reaper
from tests.helpers.service import PROJECT

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


# -- the image store (SPEC §16): builds and pins of dead processes ----------------------------------

DEAD_BUILD = """
import fcntl, os, subprocess, sys, time
builds, name, reach = sys.argv[1], sys.argv[2], sys.argv[3]
lock = os.open(f"{builds}/{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(lock, fcntl.LOCK_EX)
os.makedirs(f"{builds}/{name}/1/.image/upper")
open(f"{builds}/{name}/1/.image/upper/file", "w").write("x")
os.makedirs(f"{reach}/{name}/1-rootfs")  # where the build mounts a step's root, the sandbox uid reaching it
if os.geteuid() == 0:  # a step's root, mounted as a build's overlay is
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", f"{reach}/{name}/1-rootfs"], check=True)
    open(f"{reach}/{name}/1-rootfs/inside", "w").write("x")
print("building", flush=True)
time.sleep(600)
"""


def _started(code, *args):
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=PROJECT,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout.readline() != "", "the child died before it was ready"
    return child


def _killed(child):
    child.send_signal(signal.SIGKILL)
    child.wait()


def _mounted_below(folder) -> bool:
    with open("/proc/self/mountinfo") as info:
        return any(line.split()[4].startswith(str(folder) + "/") for line in info)


def _build_folders(settings, tmp_path):
    """A config with a store and a WORKSPACE_BASE of the test's own; the store's ``builds/`` and the
    builds' roots (BUILD_REACH), made empty."""
    config = dataclasses.replace(
        settings.EXECUTOR, images_dir=tmp_path / "images", workspace_base=tmp_path / "sessions"
    )
    store = ImageStore(config.images_root)
    (store.root / "builds").mkdir()
    (config.workspace_base / BUILD_REACH).mkdir(parents=True)
    return config, store, store.root / "builds", config.workspace_base / BUILD_REACH


def test_the_reaper_removes_builds_whose_process_died_unmounting_them_but_not_live_ones(settings, tmp_path):
    config, _, builds, reach = _build_folders(settings, tmp_path)
    dead = _started(DEAD_BUILD, builds, "deadbuild", reach)
    live = _started(DEAD_BUILD, builds, "livebuild", reach)
    try:
        _killed(dead)
        assert (builds / "deadbuild.lock").exists()  # a killed build leaves its folders and lock
        assert reaper.tend_images(config) == (1, 0, 0)
        assert sorted(p.name for p in builds.iterdir()) == ["livebuild", "livebuild.lock"]
        assert [p.name for p in reach.iterdir()] == ["livebuild"]
        assert not _mounted_below(builds / "deadbuild") and not _mounted_below(reach / "deadbuild")
        assert reaper.tend_images(config) == (0, 0, 0)  # idempotent; the live one untouched
        assert (builds / "livebuild" / "1" / ".image" / "upper" / "file").exists()
    finally:
        _killed(live)
    summary = reaper.reap(config)
    assert summary.image_builds_removed == 1 and "image_builds_removed=1" in summary.line()
    assert list(builds.iterdir()) == [] and not _mounted_below(builds)
    assert list(reach.iterdir()) == [] and not _mounted_below(reach)


def test_what_a_killed_build_left_is_counted_in_the_store_and_reported_by_prune(settings, tmp_path):
    """A killed build's ``builds/<id>/`` is disk the store takes (``total_bytes``, so ``image list`` and
    IMAGES_MAX_BYTES see it) until ``image prune`` or the reaper removes it; prune's figure says so."""
    config, store, builds, reach = _build_folders(settings, tmp_path)
    dead = _started(DEAD_BUILD, builds, "deadbuild", reach)
    live = _started(DEAD_BUILD, builds, "livebuild", reach)
    try:
        for name in ("deadbuild", "livebuild"):  # what a step wrote: 2 MB of real blocks each
            (builds / name / "1" / ".image" / "upper" / "written").write_bytes(os.urandom(2_000_000))
        _killed(dead)
        assert store.total_bytes() >= 4_000_000
        freed = store.prune()
        assert 2_000_000 <= freed < 3_000_000  # the dead build's folder, not the live one's
        assert sorted(p.name for p in builds.iterdir()) == ["livebuild", "livebuild.lock"]
        assert 2_000_000 <= store.total_bytes() < 3_000_000  # the live build still counts
    finally:
        _killed(live)
    reaper.reap(config)
    assert list(builds.iterdir()) == []


PINNER = """
import sys, time
from evaluations.images.store import ImageStore
with ImageStore(sys.argv[1]).pin(sys.argv[2], sys.argv[3]):
    print("pinned", flush=True)
    time.sleep(600)
"""


def test_the_reaper_removes_pins_whose_holder_died_but_not_live_ones(settings, tmp_path):
    config = dataclasses.replace(settings.EXECUTOR, images_dir=tmp_path / "images")
    store = ImageStore(config.images_root)
    digests = []
    for n in range(2):
        digest = "sha256:" + f"{n}" * 64
        store.save_image(ImageRecord(digest, [], {}, [], 0, "import", now_iso(), now_iso()), refs=[f"local/x{n}:v1"])
        digests.append(digest)
    dead = _started(PINNER, store.root, digests[0], "eval-dead")
    live = _started(PINNER, store.root, digests[1], "eval-live")
    try:
        _killed(dead)
        pins = store.root / "pins"
        assert (pins / digests[0].removeprefix("sha256:") / "eval-dead").exists()
        with store.using():  # a pull adding layers (and perhaps making a pin): no sweep meanwhile
            assert reaper.tend_images(config) == (0, 0, 0)
        assert (pins / digests[0].removeprefix("sha256:") / "eval-dead").exists()
        assert reaper.tend_images(config) == (0, 1, 0)
        assert sorted(p.name for p in pins.iterdir()) == [digests[1].removeprefix("sha256:")]  # empty folder gone
        assert store.pinned(digests[1])
        assert reaper.tend_images(config) == (0, 0, 0)
    finally:
        _killed(live)
    assert reaper.tend_images(config) == (0, 1, 0)
    assert list((store.root / "pins").iterdir()) == []


# -- kept artifacts (SPEC §17): gone with their row ---------------------------------------------------


def _with_artifacts(config, tmp_path, evaluation):
    from evaluations import artifacts

    folder = tmp_path / f"agent-{evaluation.id}"
    folder.mkdir()
    (folder / "trajectory.json").write_text("{}")
    kept = artifacts.keep(evaluation.id, folder, config, owner_uid=os.getuid())
    Evaluation.objects.filter(id=evaluation.id).update(artifacts=kept.artifacts)
    return artifacts.store_root(config) / str(evaluation.id)


def test_purge_removes_the_artifacts_of_the_rows_it_deletes(settings, tmp_path):
    config = dataclasses.replace(settings.EXECUTOR, data_dir=tmp_path / "data", retention_days=7)
    old, recent = ended(Status.COMPLETED, 10), ended(Status.FAILED, 1)
    old_files, recent_files = _with_artifacts(config, tmp_path, old), _with_artifacts(config, tmp_path, recent)
    assert reaper.purge_old(config.retention_days, dry_run=True, config=config) == 1
    assert old_files.is_dir()
    assert reaper.purge_old(config.retention_days, config=config) == 1
    assert not old_files.exists() and (recent_files / "trajectory.json").read_text() == "{}"


def test_the_reaper_removes_orphan_artifacts_and_dead_copies_but_nothing_else(settings, tmp_path):
    from evaluations.artifacts import KEEPING_PREFIX

    config = dataclasses.replace(
        settings.EXECUTOR, data_dir=tmp_path / "data", workspace_base=tmp_path / "sessions", retention_days=0
    )
    kept_row = _with_artifacts(config, tmp_path, ended(Status.COMPLETED, 1))
    gone = ended(Status.COMPLETED, 1)
    orphan = _with_artifacts(config, tmp_path, gone)
    Evaluation.objects.filter(id=gone.id).delete()  # deleted by other means than the purge
    WorkerHeartbeat.objects.create(worker_id="w-alive", hostname="h", pid=1, capacity=1, sandbox="none")
    running = Evaluation.objects.create(
        task_url="https://x/t", agent_code="x", status=Status.RUNNING, worker_id="w-alive"
    )
    store = orphan.parent
    copying = store / f"{KEEPING_PREFIX}{running.id}-0a0b0c0d"  # keep() at work for a running evaluation
    dead_copy = store / f"{KEEPING_PREFIX}{kept_row.name}-01020304"  # its worker died while copying
    not_ours = store / "lost+found"
    for folder in (copying, dead_copy, not_ours):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "file").write_text("x")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("not the store's")
    os.symlink(target, store / str(uuid.uuid4()))  # a link named like an evaluation: removed as a link
    assert reaper.remove_orphan_artifacts(config, dry_run=True) == 3
    assert orphan.exists() and dead_copy.exists()
    summary = reaper.reap(config)
    assert summary.artifacts_removed == 3 and "artifacts_removed=3" in summary.line()
    assert sorted(p.name for p in store.iterdir()) == sorted([kept_row.name, copying.name, not_ours.name])
    assert (target / "precious").read_text() == "not the store's"  # the link's target untouched
    assert reaper.remove_orphan_artifacts(config) == 0  # idempotent


def test_purge_keeps_a_batchs_evaluations_until_the_batch_is_past_retention(settings, api):
    """A batch's signed object (SPEC §18) lists its evaluations: none goes before the batch does."""
    from evaluations.models import Batch

    body = {"agent_code": "x", "task_urls": ["https://x/a", "https://x/b"]}
    batch_id = api.post("/batches", data=body, format="json").json()["batch_id"]
    first, second = Evaluation.objects.filter(batch_id=batch_id).order_by("created_at")
    for evaluation in (first, second):
        assert lifecycle.finish(evaluation.id, Status.COMPLETED, expect=[Status.PENDING])
    assert lifecycle.settle(batch_id)
    signed = api.get(f"/batches/{batch_id}").json()
    Evaluation.objects.filter(id=first.id).update(finished_at=timezone.now() - timezone.timedelta(days=30))
    assert reaper.purge_old(7) == 0  # the batch ended today
    assert api.get(f"/batches/{batch_id}").json() == signed
    Evaluation.objects.filter(id=second.id).update(finished_at=timezone.now() - timezone.timedelta(days=21))
    Batch.objects.filter(id=batch_id).update(finished_at=timezone.now() - timezone.timedelta(days=20))
    assert reaper.purge_old(7) == 2  # the batch past retention: it and all its evaluations go together
    assert not Batch.objects.filter(id=batch_id).exists()


# -- a live sandbox's leftovers (SPEC §24): what a dying process still holds -------------------------


def _hold(path):
    """``path`` made impossible to remove until ``_release``: immutable, refused to root too, as what a
    process still holds refuses the reaper."""
    subprocess.run(["chattr", "+i", str(path)], check=True)
    return path


def _release(held) -> None:
    subprocess.run(["chattr", "-i", str(held)], check=True)


def _released_at_the_first_pause(monkeypatch, held) -> list:
    """The reapers' pause between two tries (safefs.remove_patiently), taken without waiting: the
    holder lets go meanwhile. Returns the pauses taken."""
    waits = []

    def wait(seconds):
        waits.append(seconds)
        _release(held)

    monkeypatch.setattr(safefs, "time", SimpleNamespace(monotonic=time.monotonic, sleep=wait))
    return waits


def _held_leftovers(settings, tmp_path):
    """A failed sandbox's row and its session folder, holding a file that cannot be removed yet."""
    from tests.admin.test_sandboxes import make

    config = dataclasses.replace(settings.EXECUTOR, workspace_base=tmp_path / "sessions")
    sandbox = make(SandboxStatus.FAILED)
    folder = config.workspace_base / session_name(str(sandbox.id))
    (folder / "root").mkdir(parents=True)
    (folder / "root" / "held").write_text("x")
    return config, folder, _hold(folder / "root" / "held")


def test_an_evaluation_folder_held_for_a_moment_goes_in_the_same_pass(tmp_path, monkeypatch):
    """The evaluations' sweep waits the same way (one retry loop for both: safefs.remove_patiently)."""
    base = tmp_path / "sessions"
    session = _session(base)  # no row: not a live evaluation's
    waits = _released_at_the_first_pause(monkeypatch, _hold(session.repo / "deep" / "er" / "file"))
    assert reaper.remove_orphan_folders(base) == (1, 0)
    assert len(waits) == 1 and not session.root.exists()


def test_a_sandbox_leftover_held_for_a_moment_goes_in_the_same_pass(settings, tmp_path, monkeypatch):
    """The flake this was found by: the reaper ended a lost sandbox and removed its folder in one pass,
    once, while a process of it was still letting go: the folder stayed, only logged."""
    config, folder, held = _held_leftovers(settings, tmp_path)
    waits = _released_at_the_first_pause(monkeypatch, held)
    assert sandbox_reaping.remove_orphans(config) == 1
    assert len(waits) == 1 and not folder.exists()


def test_a_sandbox_leftover_held_past_the_patience_is_left_to_the_next_pass(settings, tmp_path, monkeypatch, caplog):
    config, folder, held = _held_leftovers(settings, tmp_path)
    clock = [0.0]

    def wait(seconds):  # no real wait: the clock moves on
        clock[0] += seconds

    monkeypatch.setattr(safefs, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=wait))
    try:
        assert sandbox_reaping.remove_orphans(config) == 0  # counted only once removed
    finally:
        _release(held)
    assert clock[0] >= safefs.REMOVAL_PATIENCE_SECS and (folder / "root" / "held").exists()
    assert "could not remove sandbox" in caplog.text and "yet" in caplog.text
    assert sandbox_reaping.remove_orphans(config) == 1
    assert not folder.exists()
