"""The process an evaluation runs in.

The worker imports this module before it forks its forkserver (pool.py), so
Django is set up once and every evaluation process is a cheap fork of a ready
interpreter, sharing the worker's pages. The child opens its own database
connection (none is inherited; a spare opens it before its id comes: ``ready``)
and runs the pipeline with the runtime the worker resolved at start.

Two watchers set the evaluation's ``CancelState`` (pipeline/cancel.py): its
row (every cancel is written there) and the worker's liveness pipe. The
worker holds the only write end of that pipe; its end of file means the
worker is gone, however it died. Not the parent's death: our parent is the
forkserver, and the worker, a child subreaper, adopts us if only the
forkserver dies, which is no reason to stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import close_old_connections, connections  # noqa: E402

from evaluations.lifecycle import Mark  # noqa: E402
from evaluations.models import WORKER_LOST, Evaluation  # noqa: E402
from evaluations.pipeline.cancel import CancelState, Stop, start_watching  # noqa: E402
from evaluations.pipeline.run import run_pipeline  # noqa: E402
from evaluations.pipeline.session import remove_retired  # noqa: E402
from evaluations.runtime import killer  # noqa: E402
from evaluations.sandboxes.host import run_sandbox  # noqa: E402


def watch_worker(channel, state: CancelState, stop: int) -> None:
    """Block on the liveness pipe until its end of file (the worker died), or until ``stop`` is
    readable: the evaluation ended, and the pipe is the spare's again (the next id comes there)."""
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLIN)
    poller.register(stop, select.POLLIN)
    try:
        while True:
            if any(fd == stop for fd, _ in poller.poll()):
                return
            if not os.read(channel.fileno(), 64):
                break  # a stray byte changes nothing; nothing else is written on it meanwhile
    except OSError:
        pass
    state.set(Stop.WORKER_LOST, WORKER_LOST)


def start_watching_worker(channel, state: CancelState) -> Callable[[], None]:
    """``watch_worker`` in a thread; returns what stops it (and waits for it)."""
    stop_r, stop_w = os.pipe2(os.O_CLOEXEC)
    thread = threading.Thread(target=watch_worker, args=(channel, state, stop_r), name="watch-worker", daemon=True)
    thread.start()

    def stop() -> None:
        os.write(stop_w, b"s")
        thread.join()
        os.close(stop_r)
        os.close(stop_w)

    return stop


logger = logging.getLogger("term_executor.worker")

_ready_pid: int | None = None  # the spare's pid, once ``ready`` opened its connection
# The session folders this process's evaluations retired (closed to every uid but ours), removed by
# ``tidy``: in a kept process once its report is sent, while the worker claims the next id.
_retired: list[Path] = []
_removing: threading.Thread | None = None  # tidy's removal under way


def ready() -> None:
    """A spare's work before it waits for its id (pool.wait_for_id; again after each evaluation
    when it is kept for another), what its evaluation would otherwise do first on the claim's path
    (SPEC §25; bench/RESULTS.md, issue 38, stop 48: the claim to the first step 10.7 -> 3.8 ms):
    it becomes the subreaper of what it will start (a scan of /proc for the children it must
    spare: none yet), opens its own database connection and makes a first query (the ORM's
    first-use work, and the pages it writes copied now). A database that cannot be reached now is
    connected to later, as without a spare."""
    global _ready_pid
    with contextlib.suppress(OSError):  # else the evaluation's spawner tries again, and says why
        killer.become_subreaper()  # its /proc scan (the children it must spare: none) here, not at its claim
    connections.close_all()  # none is inherited
    try:
        connections["default"].ensure_connection()
        Evaluation.objects.filter(id=uuid.UUID(int=0)).first()  # no row has it
    except Exception:  # the evaluation's first query connects, and reports what is wrong then
        connections.close_all()
        return
    _ready_pid = os.getpid()


def _own_connection() -> None:
    """No connection from another process; a spare's own kept unless it is too old or broken
    (as at a request's start; PostgreSQL's health check then runs at its first use)."""
    if _ready_pid == os.getpid():
        close_old_connections()
    else:
        connections.close_all()


def main(eval_id: str, runtime, alive_channel, note: str = "") -> None:
    """One evaluation; its process may be kept for another (pool.wait_for_id), its connection with it.
    ``note``: the claim's transition (lifecycle.Mark.encode), which its first step closes.

    In a spare (``ready`` ran) the retired session folder is left to ``tidy``, which the pool calls
    once it has reported the evaluation's end: its removal (a few ms, most of it waiting on the disk)
    is then not between the row's end and the next claim (bench/RESULTS.md, issue 38, stop 58); a
    process forked for one evaluation removes it before it returns."""
    claimed = Mark.decode(note) if note else None
    state = CancelState()
    stop_watching_worker = start_watching_worker(alive_channel, state)
    _own_connection()
    done = start_watching(eval_id, state)
    later = _retired.append if _ready_pid == os.getpid() else None
    try:
        run_pipeline(eval_id, settings.EXECUTOR, runtime=runtime, cancel=state, claimed=claimed, remove_later=later)
    finally:
        done.set()
        stop_watching_worker()


def tidy(*, wait: bool = False) -> None:
    """Remove the session folders this process's evaluations retired (``main``), on a thread of its
    own: most of a removal is waiting on the disk, which then overlaps the next evaluation's start
    instead of holding it up (bench/RESULTS.md, issue 38, stop 58). ``wait``: here and now, the last
    removal awaited too (before the process exits). One that cannot be removed is left to the reaper
    (a warning says why), as is what a process killed meanwhile left."""
    global _removing
    if _removing is not None and (wait or not _removing.is_alive()):
        _removing.join()
        _removing = None
    folders = list(_retired)
    _retired.clear()
    if not folders:
        return
    if wait or _removing is not None:
        _remove(folders)
        return
    _removing = threading.Thread(target=_remove, args=(folders,), name="remove-retired", daemon=True)
    _removing.start()


def _remove(folders: list[Path]) -> None:
    for folder in folders:
        try:
            remove_retired(folder)
        except OSError as exc:
            logger.warning("could not remove %s (the reaper will): %s", folder, exc)


def leave() -> None:
    """Before an evaluation process (or a spare that ran none) exits, and before a kept one's checks
    (pool.ProcessState): its connection closed."""
    connections.close_all()


def sandbox_main(sandbox_id: str, runtime, alive_channel) -> None:
    """A live sandbox's process (SPEC §24): it ends with the sandbox, or with the worker (its
    liveness pipe, read by the sandbox's own loop)."""
    connections.close_all()
    try:
        run_sandbox(sandbox_id, settings.EXECUTOR, runtime, alive_channel.fileno())
    finally:
        connections.close_all()
