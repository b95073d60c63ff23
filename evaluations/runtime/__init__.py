"""Starting, watching and killing every process of an evaluation (no Django here).

The worker resolves the runtime once at start (``select_runtime``) and hands
the object to each evaluation process, which builds one ``Spawner``; every
command of every step goes through ``Spawner.run`` with the ``SandboxPolicy``
the step chose, and ``Spawner.sweep`` after each step kills what a step left
behind.
"""

from evaluations.runtime import cgroups
from evaluations.runtime.killer import TAG_VAR, become_subreaper, protect
from evaluations.runtime.policy import SandboxPolicy
from evaluations.runtime.sandbox import (
    Bubblewrap,
    NoSandbox,
    Runtime,
    SandboxUnavailable,
    probe_bwrap,
    sandbox_uid,
    select_runtime,
)
from evaluations.runtime.spawner import Spawner
from evaluations.runtime.types import CancelEvent, CommandResult, Limit, Limits, Mount, Verdict

__all__ = [
    "TAG_VAR",
    "Bubblewrap",
    "CancelEvent",
    "CommandResult",
    "Limit",
    "Limits",
    "Mount",
    "NoSandbox",
    "Runtime",
    "SandboxPolicy",
    "SandboxUnavailable",
    "Spawner",
    "Verdict",
    "become_subreaper",
    "cgroups",
    "probe_bwrap",
    "protect",
    "sandbox_uid",
    "select_runtime",
]
