"""Evaluations on this machine, through the worker's own pipeline: what `manage.py evaluate` runs.

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
5. Several tasks are a batch (SPEC §14): its evaluations are created claimed at
   once and run here one after the other, each as one task is.
6. ``manage.py image build`` builds a Dockerfile here (``build_image``) with what an evaluation's
   build gets from the pipeline: the worker's sandbox (``prepare_to_run``), a uid of the pool leased
   as the pipeline leases one, and an egress proxy under the EGRESS rules for its RUNs.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import os
import re
import shutil
import socket
import tarfile
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.db import DatabaseError, connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.models.functions import Now
from django.utils import timezone

from evaluations import agents, languages, lifecycle
from evaluations.models import (
    ACTIVE_STATUSES,
    Batch,
    ErrorKind,
    Evaluation,
    Status,
    Transition,
    WorkerHeartbeat,
)
from evaluations.pipeline.archive import is_task_root
from evaluations.pipeline.cancel import CancelState, start_watching
from evaluations.pipeline.run import EGRESS_SOCKET, lease_uid, run_pipeline
from evaluations.runtime import Runtime

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class LocalRunError(Exception):
    """Something the user gave cannot be run; the message says what to do."""


def unapplied_migrations() -> list[str]:
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]


def check_database(needed_by: str = "") -> None:
    """Raise LocalRunError unless the configured database answers and is migrated.

    ``needed_by`` starts the message when the need is an option's (import_swebench's --verify).
    """
    prefix = f"{needed_by}: " if needed_by else ""
    try:
        pending = unapplied_migrations()
    except DatabaseError as exc:
        raise LocalRunError(f"{prefix}cannot use the database: {exc}") from exc
    if pending:
        raise LocalRunError(
            f"{prefix}the database is not migrated ({len(pending)} migration(s) to apply): "
            "run `python manage.py migrate` first"
        )


# Every member's time, and no owner: the same folder packs to the same bytes, so an archive's
# sha256 (import_swebench's index.json, agent_sha256) changes only when its content does.
# 1980-01-01, the floor of zip's dates, in case a build tool repacks the files as a zip.
FIXED_MTIME = 315532800


def pack_folder(folder: Path, archive: Path, *, at_root: bool = False) -> None:
    """The folder as a .tar.gz, reproducibly: under one top folder (its name), or its contents at
    the root (``at_root``, for agent projects, without .git, __pycache__ and .pyc files).
    Links are stored as links: the archive rules refuse them, with a message naming the member."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if at_root and (info.name.endswith(".pyc") or Path(info.name).name in ("__pycache__", ".git")):
            return None
        info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
        return info

    with (
        open(archive, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w") as tar,
    ):
        if not at_root:
            tar.add(folder, arcname=folder.name or "task", filter=normalise)
            return
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name, filter=normalise)


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
        if not is_task_root(path):
            raise LocalRunError(
                f"TASK {task}: the folder has no workspace.yaml, task.toml or task.yaml (is it the task's root?)"
            )
        archive = Path(tempfile.mkdtemp(dir=scratch)) / "task.tar.gz"  # several tasks, several archives
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


def agent_request(agent: Path, explicit_language: str | None, entrypoint: str | None, scratch: Path) -> dict:
    """AGENT -> the agent's fields of the request body (SPEC §14), which the serializer then checks.

    A source file is ``agent_code``; a folder is packed into a .tar.gz (the folder's contents at
    its root, links kept as links, which the archive rules refuse) and an archive file (.tar.gz,
    .tgz, .tar or .zip) is sent as it is, both as ``agent_archive``.
    """
    if agent.is_dir():
        archive = scratch / "agent.tar.gz"
        pack_folder(agent, archive, at_root=True)
        body = {"agent_archive": archive.read_bytes(), "agent_language": _project_language(agent, explicit_language)}
    elif agent.name.lower().endswith(AGENT_ARCHIVE_SUFFIXES):
        body = {"agent_archive": agent.read_bytes(), "agent_language": explicit_language or "python"}
    else:
        return {
            "agent_code": agent.read_text(encoding="utf-8"),
            "agent_language": language_for(agent, explicit_language),
        }
    body["agent_archive"] = base64.b64encode(body["agent_archive"]).decode()
    if entrypoint:
        body["agent_entrypoint"] = entrypoint
    return body


AGENT_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def _project_language(folder: Path, explicit: str | None) -> str:
    """--language, else the language whose default entry point the folder holds (agent.py: python)."""
    if explicit:
        return language_for(folder, explicit)
    for name, entrypoints in agents.DEFAULT_ENTRYPOINTS.items():
        if any((folder / entry).is_file() for entry in entrypoints):
            return name
    return "python"  # the serializer names the missing entry point


def worker_id() -> str:
    return f"cli-{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def create_claimed(fields: dict, owner: str, *, started: bool = True) -> Evaluation:
    """Insert the evaluation and claim it for ``owner`` before anyone else can see it pending.

    ``started=False``: a batch's evaluation that waits its turn here; LocalRun.start sets its
    started_at, so the session TTL counts from when it really starts.
    """
    with transaction.atomic():
        evaluation = Evaluation(**fields)
        lifecycle.queue([evaluation])
        claimed = lifecycle.record(
            evaluation.id,
            status=Status.RUNNING,
            expect=[Status.PENDING],
            worker_id=owner,
            started_at=timezone.now() if started else None,
        )
        if not claimed:  # cannot happen inside our own transaction; say so loudly if it does
            raise RuntimeError(f"evaluation {evaluation.id} could not be claimed")
    return evaluation


def create_claimed_batch(fields: dict, task_urls: list[str], owner: str) -> tuple[Batch, list[Evaluation]]:
    """A batch (SPEC §14) of claimed evaluations, one per task, in one transaction, run here one at a time.

    All are made at once, so the batch ends (lifecycle.settle) when the last one does and not
    when the first does; claimed, so no worker sharing the database runs them meanwhile.
    """
    with transaction.atomic():
        batch = Batch.objects.create(**{name: value for name, value in fields.items() if name != "task_url"})
        evaluations = [
            create_claimed({**fields, "task_url": url, "batch": batch}, owner, started=False) for url in task_urls
        ]
    return batch, evaluations


def cancel_unstarted(batch: Batch, evaluations: list[Evaluation], reason: str) -> None:
    """Ctrl-C in a batch: the evaluations that never started end cancelled, and with them the batch."""
    Batch.objects.filter(id=batch.id, finished_at__isnull=True).update(cancel_requested=True)
    for evaluation in evaluations:
        lifecycle.finish(
            evaluation.id,
            Status.CANCELLED,
            error=f"queued: {reason}",
            expect=[Status.RUNNING],
            cancel_reason=reason,
        )


class Heartbeat:
    """The run's heartbeat as a worker of capacity 0, from the first evaluation to the last."""

    def __init__(self, owner: str, runtime: Runtime):
        self.owner = owner
        self.runtime = runtime

    def __enter__(self) -> Heartbeat:
        WorkerHeartbeat.objects.create(
            worker_id=self.owner,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            capacity=0,  # it takes nothing from the queue
            sandbox=self.runtime.name,
            last_beat_at=Now(),  # the database's clock, as run_worker and the reaper use
        )
        return self

    def __exit__(self, *exc) -> None:
        WorkerHeartbeat.objects.filter(worker_id=self.owner).delete()


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
        """Within a Heartbeat of ``owner``."""
        Evaluation.objects.filter(id=self.eval_id, started_at__isnull=True).update(started_at=timezone.now())
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
        """After the thread ended: make sure the evaluation ended too, return the row."""
        row = Evaluation.objects.filter(id=self.eval_id).values("status", "step").first()
        if row and row["status"] in ACTIVE_STATUSES:
            cause = f"{type(self.crash).__name__}: {self.crash}" if self.crash else "the pipeline stopped early"
            error = f"{row['step']}: internal error: {cause}"
            lifecycle.finish(self.eval_id, Status.FAILED, error=error, kind=ErrorKind.INFRASTRUCTURE)
        return Evaluation.objects.prefetch_related("transitions", "test_results").get(id=self.eval_id)


def build_image(
    dockerfile: Path,
    context: Path,
    build_args: dict[str, str],
    target: str | None,
    *,
    tag: str | None,
    store,
    config,
    progress,
):
    """Build ``dockerfile`` (images/build.py) as an evaluation's build runs: every RUN in the sandbox as a
    leased uid of the pool (root in name only over its image id range), egress through a proxy of
    its own under the EGRESS rules when BUILD_NETWORK is on. LocalRunError when this host cannot
    (no sandbox, not root); ImageError for what the Dockerfile or its images get wrong."""
    from evaluations.environments.toolchains import CA_VARIABLES, host_ca
    from evaluations.images.build import BuildEnvironment, build
    from evaluations.network.egress import EgressProxy, egress_policy
    from evaluations.runtime import initbin
    from evaluations.runtime.idmap import image_id_base
    from evaluations.worker.startup import StartupError, prepare_to_run

    try:
        runtime = prepare_to_run(config)
    except StartupError as exc:
        raise LocalRunError(str(exc)) from exc
    if not runtime.isolated or os.geteuid() != 0:
        raise LocalRunError("Building an image needs the sandbox (SANDBOX=bwrap) and root (user namespaces, mounts).")
    with contextlib.ExitStack() as stack:
        lease = lease_uid(config)
        stack.callback(lease.release)  # not marked clean: the next holder scrubs it
        folder = Path(tempfile.mkdtemp(prefix="te-image-build-", dir=config.workspace_base))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        os.chmod(folder, 0o711)  # the lease passes through to its proxy's socket
        fields = {}
        if config.build_network == "on":
            proxy = EgressProxy(folder / EGRESS_SOCKET, egress_policy(config), allowed_uid=lease.uid).start()
            stack.callback(proxy.close)
            fields = {
                "egress_socket": Path(proxy.socket_path),
                "relay_init": initbin.ensure_init(config.workspace_base),
            }
        ca = host_ca(config, sandboxed=True)
        environment = BuildEnvironment(
            runtime=runtime,
            uid=lease.uid,
            id_base=image_id_base(config.image_uid_base, lease.uid, config.sandbox_uid),
            config=config,
            progress=progress,
            ca_bundle=ca.host if ca is not None else None,
            extra_env=dict.fromkeys(CA_VARIABLES, ca.sandbox) if ca is not None else {},
            eval_id=f"cli-{os.getpid()}",
            exclusive_uid=True,
            **fields,
        )
        return build(dockerfile, context, build_args, target, store=store, env=environment, tag=tag)
