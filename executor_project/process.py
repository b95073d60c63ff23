"""Process names for the service's processes (``ps -o pid,comm``, /proc/PID/comm), and the
descriptors a process keeps open on purpose.

``manage.py serve`` forks every process of the service from one interpreter, so
their command lines are all serve's: the name tells them apart.

An evaluation process is kept for the next evaluation only if the last one left no descriptor
open (worker/pool.py, ``ProcessState``), except those a process-wide cache holds for its life
and names here (``keep_descriptor``): a user namespace of the idmap cache. (Database connections
are closed before the check, with what they hold.)
"""

from __future__ import annotations

import ctypes

_PR_SET_NAME = 15


def name_process(name: str) -> None:
    """The process's name as ps, top and /proc/PID/comm show it (15 bytes at most)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


_kept: set[int] = set()


def keep_descriptor(fd: int) -> None:
    """``fd`` stays open for the process's life, on purpose."""
    _kept.add(fd)


def kept_descriptors() -> frozenset[int]:
    return frozenset(_kept)
