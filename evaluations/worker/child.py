"""The process an evaluation runs in.

The worker imports this module before it forks its forkserver (pool.py), so
Django is set up once and every evaluation process is a cheap fork of a ready
interpreter, sharing the worker's pages. The child
opens its own database connection (none is inherited) and runs the pipeline.
If the worker dies, the kernel tells the child (PR_SET_PDEATHSIG through the
forkserver), which kills its commands and fails the evaluation as lost.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from evaluations.pipeline.run import run_pipeline  # noqa: E402

_PR_SET_PDEATHSIG = 1


WATCH_SECS = 1.0


class CancelFlag:
    """Set by the worker (a byte on our cancel pipe), by our own parent's death, or by our row.

    The pipe is read without blocking, from whichever thread asks first (the pipeline's or a
    monitor's); once a cancel is seen it stays seen. End of file is not a cancel: it means the
    worker is gone, which PR_SET_PDEATHSIG reports as ``lost``.
    """

    def __init__(self, channel):
        self.fd = channel.fileno()
        os.set_blocking(self.fd, False)
        self._channel = channel  # keeps the fd open
        self.requested = False
        self.lost = False
        self.ended_elsewhere = False

    def is_set(self) -> bool:
        if not self.requested:
            try:
                self.requested = bool(os.read(self.fd, 1))
            except (BlockingIOError, OSError):
                pass
        return self.lost or self.ended_elsewhere or self.requested


def watch_row(eval_id: str, flag: CancelFlag, stop: threading.Event) -> None:
    """Stop when our row says so, even if our worker cannot tell us.

    A frozen or partitioned worker's evaluations are failed by another host's
    reaper; without this, their processes would go on into the next step.
    A DELETE is seen here too, within WATCH_SECS, whatever the worker does.
    """
    from evaluations.models import Evaluation, Status

    try:
        while not stop.wait(WATCH_SECS):
            try:
                row = Evaluation.objects.filter(id=eval_id).values_list("status", "cancel_requested").first()
            except Exception:
                connections.close_all()
                continue  # the database is away: the worker's own signals still work
            if row is None or row[0] != Status.RUNNING:
                flag.ended_elsewhere = True
            elif row[1]:
                flag.requested = True
    finally:
        connections.close_all()


class LostFlag:
    def __init__(self, flag: CancelFlag):
        self.flag = flag

    def is_set(self) -> bool:
        return self.flag.lost


def main(eval_id: str, sandbox: str, cancel_channel) -> None:
    flag = CancelFlag(cancel_channel)

    def parent_died(signum, frame):
        flag.lost = True  # a plain attribute: safe to set from a signal handler

    signal.signal(signal.SIGUSR1, parent_died)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl took effect
        flag.lost = True
    connections.close_all()
    stop = threading.Event()
    threading.Thread(target=watch_row, args=(eval_id, flag, stop), name="watch-row", daemon=True).start()
    try:
        run_pipeline(eval_id, settings.EXECUTOR, sandbox=sandbox, cancel_event=flag, lost_flag=LostFlag(flag))
    finally:
        stop.set()
        connections.close_all()
