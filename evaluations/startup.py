"""What a process that runs evaluations does once, before the first: `run_worker` and `evaluate`.

1. WORKSPACE_BASE exists, mode 0711: commands may pass through to their own
   session folder and never list the others.
2. The runtime is chosen by probing bubblewrap as the sandbox uid would run
   it (as `nobody`, outside the uid pool: a pool uid may be scrubbed by a
   concurrent evaluation's lease at any moment). The resolved object is what
   every evaluation process gets; nothing downstream probes again.
3. The start-up warnings are logged.
"""

from __future__ import annotations

import os

from evaluations.checks import log_startup_warnings
from evaluations.runtime import Runtime, become_subreaper, sandbox_uid, select_runtime
from executor_project.config import Config


class StartupError(Exception):
    """The process cannot run evaluations; the message says what to fix."""


def prepare_to_run(config: Config) -> Runtime:
    config.workspace_base.mkdir(parents=True, exist_ok=True)
    os.chmod(config.workspace_base, 0o711)
    try:
        runtime = select_runtime(config.sandbox, uid=sandbox_uid(), workdir=config.workspace_base)
    except Exception as exc:
        raise StartupError(f"SANDBOX={config.sandbox}: {exc}") from exc
    log_startup_warnings()
    become_subreaper()  # orphans of a dead evaluation process come to us, not to init
    return runtime
