"""Imported only by the worker's forkserver process, once, before it forks evaluations.

The forkserver outlives a worker killed with SIGKILL (it is reparented to init),
and with it every evaluation process. So the forkserver asks the kernel to kill
it when the worker dies; each evaluation process in turn learns of the
forkserver's death through its own PR_SET_PDEATHSIG (see child.py).
"""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1

ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
if os.getppid() == 1:  # the worker died before the prctl took effect
    os._exit(1)

from evaluations.worker import child  # noqa: E402,F401  (Django set up once, before any fork)
