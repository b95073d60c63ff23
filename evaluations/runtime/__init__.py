"""Starting, watching and killing every process of an evaluation (no Django here).

The pipeline builds one ``Spawner`` per evaluation, in the evaluation's own
process, with the runtime chosen at start by ``select_runtime``; every
command of every step goes through ``Spawner.run``, and ``Spawner.sweep``
after each step kills what a step left behind.
"""

from evaluations.runtime.killer import TAG_VAR, become_subreaper, protect
from evaluations.runtime.sandbox import (
    Bubblewrap,
    NoSandbox,
    Runtime,
    SandboxUnavailable,
    command_path,
    probe_bwrap,
    sandbox_uid,
    select_runtime,
)
from evaluations.runtime.spawner import CommandResult, Limits, Mount, Spawner

__all__ = [
    "TAG_VAR",
    "Bubblewrap",
    "CommandResult",
    "Limits",
    "Mount",
    "NoSandbox",
    "Runtime",
    "SandboxUnavailable",
    "Spawner",
    "become_subreaper",
    "command_path",
    "probe_bwrap",
    "protect",
    "sandbox_uid",
    "select_runtime",
]
