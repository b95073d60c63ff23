"""Process names for the service's processes (``ps -o pid,comm``, /proc/PID/comm).

``manage.py serve`` forks every process of the service from one interpreter, so
their command lines are all serve's: the name tells them apart.
"""

from __future__ import annotations

import ctypes

_PR_SET_NAME = 15


def name_process(name: str) -> None:
    """The process's name as ps, top and /proc/PID/comm show it (15 bytes at most)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
