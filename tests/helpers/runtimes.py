"""The runtime objects the worker would resolve at start, by name, for tests that run pipelines."""

from __future__ import annotations

import functools

from evaluations.pipeline.cancel import CancelState
from evaluations.pipeline.run import run_pipeline
from evaluations.runtime import Bubblewrap, NoSandbox, Runtime, sandbox_uid
from evaluations.runtime.sandbox import usable_language_runtimes


@functools.cache
def runtime_named(name: str) -> Runtime:
    reachable = usable_language_runtimes(sandbox_uid())
    return Bubblewrap(reachable) if name == "bwrap" else NoSandbox(reachable)


def run_evaluation(eval_id: str, config, sandbox: str, cancel: CancelState | None = None) -> None:
    """The pipeline as an evaluation process runs it, with the runtime ``sandbox`` names."""
    run_pipeline(eval_id, config, runtime=runtime_named(sandbox), cancel=cancel or CancelState())
