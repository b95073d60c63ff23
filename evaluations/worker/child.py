"""The process an evaluation runs in.

The worker's forkserver preloads this module, so Django is set up once and
every evaluation process is a cheap fork of a ready interpreter. The child
opens its own database connection (none is inherited) and runs the pipeline.
If the worker dies, the kernel tells the child (PR_SET_PDEATHSIG through the
forkserver), which kills its commands and fails the evaluation as lost.
"""

from __future__ import annotations

import ctypes
import os
import signal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from evaluations.pipeline.run import run_pipeline  # noqa: E402

_PR_SET_PDEATHSIG = 1


class CancelFlag:
    """Set by the worker (a multiprocessing.Event) or by our own parent's death."""

    def __init__(self, event):
        self.event = event
        self.lost = False

    def is_set(self) -> bool:
        return self.lost or self.event.is_set()


class LostFlag:
    def __init__(self, flag: CancelFlag):
        self.flag = flag

    def is_set(self) -> bool:
        return self.flag.lost


def main(eval_id: str, sandbox: str, cancel_event) -> None:
    flag = CancelFlag(cancel_event)

    def parent_died(signum, frame):
        flag.lost = True  # a plain attribute: safe to set from a signal handler

    signal.signal(signal.SIGUSR1, parent_died)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl took effect
        flag.lost = True
    connections.close_all()
    try:
        run_pipeline(eval_id, settings.EXECUTOR, sandbox=sandbox, cancel_event=flag, lost_flag=LostFlag(flag))
    finally:
        connections.close_all()
