"""The runtime objects the worker would resolve at start, by name, for tests that run pipelines."""

from __future__ import annotations

import functools
import os

from django.conf import settings

from evaluations.pipeline.cancel import CancelState
from evaluations.pipeline.run import run_pipeline
from evaluations.runtime import Bubblewrap, NoSandbox, Runtime, cgroups, sandbox_uid
from evaluations.runtime.sandbox import usable_language_runtimes


@functools.cache
def runtime_named(name: str) -> Runtime:
    """As startup.prepare_to_run resolves it: cgroups too, where this host offers them (as root)."""
    reachable = usable_language_runtimes(sandbox_uid())
    support = cgroups.detect(settings.EXECUTOR.cgroup_parent) if os.geteuid() == 0 else None
    return Bubblewrap(reachable, cgroups=support) if name == "bwrap" else NoSandbox(reachable, cgroups=support)


def run_evaluation(eval_id: str, config, sandbox: str, cancel: CancelState | None = None, claimed=None) -> None:
    """The pipeline as an evaluation process runs it, with the runtime ``sandbox`` names (``claimed``:
    the claim's transition, as the worker hands it over)."""
    run_pipeline(eval_id, config, runtime=runtime_named(sandbox), cancel=cancel or CancelState(), claimed=claimed)


# The package registries, by name: a test that installs from them inside a sandbox allows them
# through EGRESS_ALLOW (here they resolve to a TEST-NET address the default rules refuse).
REGISTRIES = ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org")
