"""Harbor and Terminal-Bench 1.x task folders -> TaskSpec (SPEC §17).

``load_task`` (taskspec.py) sends a folder holding ``task.toml`` here as a
Harbor task, one holding ``task.yaml`` (and no ``task.toml``) as a
Terminal-Bench 1.x task. Both are read with taskbase's readers (the YAML
guards, the size caps, no links), and every refusal is one sentence naming
the file and the key.

1. What a format asks of the run goes into ``TaskSpec.request`` as written;
   capping it by the operator's limits is the pipeline's job.
2. What is not understood is kept, not dropped: ``metadata`` is the file
   minus the keys read here (Harbor: ``task.toml`` in its own shape, so
   ``[metadata]`` sits under ``"metadata"`` and an unknown ``[agent] user``
   under ``"agent"``; Terminal-Bench: ``task.yaml``'s other keys).
3. What would run differently here than where the task was written is
   refused, not approximated: a Windows task, GPUs or TPUs, several
   services, multi-step tasks, a verifier container of its own, a compose
   service's own working directory, entrypoint or user, environment values
   taken from the host (``${VAR}``).
4. Harbor tasks are graded by their reward file; ``[verifier] grader =
   "pytest"`` (written by ``manage.py import_tasks`` for a converted
   Terminal-Bench task, ignored by Harbor itself) keeps Terminal-Bench's
   grading. Terminal-Bench tasks are graded by ``pytest``.
"""

from __future__ import annotations

import os
from pathlib import Path

from evaluations.pipeline.taskbase import TaskSpec

from .harbor import load_harbor
from .terminal_bench import load_terminal_bench

__all__ = ["load_harbor", "load_other_format", "load_terminal_bench"]


def load_other_format(root: Path, *, max_prompt_bytes: int) -> TaskSpec:
    if os.path.lexists(root / "task.toml"):
        return load_harbor(root, max_prompt_bytes=max_prompt_bytes)
    return load_terminal_bench(root, max_prompt_bytes=max_prompt_bytes)
