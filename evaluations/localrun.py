"""One evaluation on this machine, through the worker's own pipeline: what `manage.py evaluate` runs.

1. The task becomes a task_url: a folder is packed into a temporary .tar.gz,
   an archive is used where it is, both as file:// URLs, which this run (and
   only this run) allows; a URL is used as given.
2. The row is created and claimed in one transaction, so a worker sharing the
   database never sees it pending.
3. The run beats a heartbeat as a worker of capacity 0 (``cli-<host>-<pid>``),
   so the reaper of a worker sharing the database does not fail it as lost.
4. The pipeline runs in a thread of this process: the spawner makes the
   process a child subreaper and treats its children as commands, and this
   process starts no other child. DELETE, the TTL and Ctrl-C reach it as
   every cancel does: written to the row, which the evaluation watches
   (pipeline/cancel.py).
"""

from __future__ import annotations

import os
import re
import socket
import tarfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.models.functions import Now
from django.utils import timezone

from evaluations import languages, lifecycle
from evaluations.models import ACTIVE_STATUSES, Evaluation, Status, Step, Transition, WorkerHeartbeat
from evaluations.pipeline.cancel import CancelState, start_watching
from evaluations.pipeline.run import run_pipeline
from evaluations.runtime import Runtime

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class LocalRunError(Exception):
    """Something the user gave cannot be run; the message says what to do."""


def unapplied_migrations() -> list[str]:
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]


def pack_folder(folder: Path, archive: Path) -> None:
    """The folder as a .tar.gz under one top folder, links stored as links (the pipeline refuses them)."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name or "task")


def task_url_for(task: str, scratch: Path) -> str:
    """A folder, an archive, a file:// URL or any other URL -> the task_url to submit."""
    if _URL.match(task):
        parts = urlsplit(task)
        if parts.scheme.lower() != "file":
            return task
        if parts.netloc not in ("", "localhost"):
            raise LocalRunError(f"TASK {task}: a file:// URL names no host (file:///path)")
        task = unquote(parts.path)
    path = Path(task).expanduser()
    if path.is_dir():
        if not (path / "workspace.yaml").is_file():
            raise LocalRunError(f"TASK {task}: the folder has no workspace.yaml (is it the task's root?)")
        archive = scratch / "task.tar.gz"
        pack_folder(path.resolve(), archive)
        return archive.as_uri()
    if path.is_file():
        return path.resolve().as_uri()
    raise LocalRunError(f"TASK {task}: no such folder or archive, and not a URL")


def language_for(agent_file: Path, explicit: str | None) -> str:
    known = languages.available()
    if explicit:
        if explicit not in known:
            raise LocalRunError(f"--language {explicit}: not installed here; one of {', '.join(known)}")
        return explicit
    by_extension = {lang.extension: lang.name for lang in known.values()} | {"bash": "bash"}
    extension = agent_file.suffix.lstrip(".").lower()
    if extension not in by_extension:
        raise LocalRunError(f"cannot tell the language of {agent_file.name}; pass --language ({', '.join(known)})")
    return by_extension[extension]


def worker_id() -> str:
    return f"cli-{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def create_claimed(fields: dict, owner: str) -> Evaluation:
    """Insert the evaluation and claim it for ``owner`` before anyone else can see it pending."""
    with transaction.atomic():
        evaluation = Evaluation.objects.create(status=Status.PENDING, step=Step.QUEUED, **fields)
        Transition.objects.create(
            evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING, at=evaluation.created_at
        )
        claimed = lifecycle.record(
            evaluation.id, status=Status.RUNNING, expect=[Status.PENDING], worker_id=owner, started_at=timezone.now()
        )
        if not claimed:  # cannot happen inside our own transaction; say so loudly if it does
            raise RuntimeError(f"evaluation {evaluation.id} could not be claimed")
    return evaluation


@dataclass
class StepTime:
    step: str
    status: str
    duration_ms: int | None  # None: still there


def step_times(eval_id) -> list[StepTime]:
    rows = Transition.objects.filter(evaluation_id=eval_id).order_by("at", "id")
    return [StepTime(t.step, t.status, t.duration_ms) for t in rows]


@dataclass
class LocalRun:
    """The pipeline of one claimed evaluation, in a thread, watched from the caller's thread."""

    eval_id: str
    config: object
    runtime: Runtime
    owner: str
    cancel: CancelState = field(default_factory=CancelState)
    # Set by the thread as it ends. Not Thread.join/is_alive: a Ctrl-C landing inside join() can
    # leave is_alive() saying False while the thread still runs.
    done: threading.Event = field(default_factory=threading.Event)
    crash: BaseException | None = None
    next_beat: float = 0.0

    def start(self) -> None:
        WorkerHeartbeat.objects.create(
            worker_id=self.owner,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            capacity=0,  # it takes nothing from the queue
            sandbox=self.runtime.name,
            last_beat_at=Now(),  # the database's clock, as run_worker and the reaper use
        )
        self.watching = start_watching(self.eval_id, self.cancel)
        self.thread = threading.Thread(target=self._run, name=f"eval-{self.eval_id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            run_pipeline(self.eval_id, self.config, runtime=self.runtime, cancel=self.cancel)
        except BaseException as exc:  # reported by finish(); the thread must not die silently
            self.crash = exc
        finally:
            connections.close_all()  # this thread's own connection
            self.watching.set()
            self.done.set()

    @property
    def alive(self) -> bool:
        return not self.done.is_set()

    def wait(self, timeout: float) -> None:
        self.done.wait(timeout)

    def beat(self, now: float) -> None:
        """Beat the heartbeat, so no reaper takes this run for a lost worker."""
        if now >= self.next_beat:
            WorkerHeartbeat.objects.filter(worker_id=self.owner).update(last_beat_at=Now())
            self.next_beat = now + max(1.0, self.config.worker_stale_secs / 3)

    def request_cancel(self, reason: str) -> None:
        """Ask for a stop the way every cancel is asked: on the row (the watcher passes it on)."""
        Evaluation.objects.filter(id=self.eval_id, status=Status.RUNNING, cancel_requested=False).update(
            cancel_requested=True, cancel_reason=reason
        )

    def finish(self) -> Evaluation:
        """After the thread ended: make sure the evaluation ended too, drop the heartbeat, return the row."""
        WorkerHeartbeat.objects.filter(worker_id=self.owner).delete()
        row = Evaluation.objects.filter(id=self.eval_id).values("status", "step").first()
        if row and row["status"] in ACTIVE_STATUSES:
            cause = f"{type(self.crash).__name__}: {self.crash}" if self.crash else "the pipeline stopped early"
            lifecycle.finish(self.eval_id, Status.FAILED, error=f"{row['step']}: internal error: {cause}")
        return Evaluation.objects.prefetch_related("transitions", "test_results").get(id=self.eval_id)
