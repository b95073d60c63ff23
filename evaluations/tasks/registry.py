"""The one table of task formats, and ``load_task``, which walks it (the package's docstring says why).

A format is (name, what it looks for, detect, load): ``detect(root)`` answers from the folder's
entries alone, reading no file; ``load(root, limits)`` reads the folder into a TaskSpec or raises
TaskError. The first format whose ``detect`` answers yes reads the folder, and only it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evaluations.tasks import harbor, terminal_bench, workspace
from evaluations.tasks.readers import TaskLimits
from evaluations.tasks.spec import TaskError, TaskSpec
from executor_project.config import Config


@dataclass(frozen=True)
class Format:
    name: str  # TaskSpec.format of what it loads
    looked_for: str  # what detect looks for, named when no format matches
    detect: Callable[[Path], bool]
    load: Callable[[Path, TaskLimits], TaskSpec]


# In the order they are tried: a folder holding task.toml is Harbor's whatever else it holds,
# task.yaml is Terminal-Bench's, workspace.yaml ours only when neither is there.
FORMATS = (
    Format("harbor", "task.toml (Harbor)", harbor.detect, harbor.load),
    Format("terminal-bench", "task.yaml (Terminal-Bench)", terminal_bench.detect, terminal_bench.load),
    Format("workspace", "workspace.yaml", workspace.detect, workspace.load),
)


def load_task(
    task_root: Path | str,
    *,
    allow_file_urls: bool = False,
    max_prompt_bytes: int = Config.max_prompt_bytes,
    max_tests: int = Config.max_tests,
) -> TaskSpec:
    """Read and validate the task folder in the first format that detects it; raise TaskError.

    The caps (MAX_PROMPT_BYTES, MAX_TESTS) are checked before the text they bound is read: a
    file's size from its inode (what the archive member declared, as extraction wrote and
    counted it), the tests as they are counted; nothing over a cap reaches memory or the row.
    """
    root = Path(task_root)
    limits = TaskLimits(max_prompt_bytes=max_prompt_bytes, max_tests=max_tests, allow_file_urls=allow_file_urls)
    for found in FORMATS:
        if found.detect(root):
            return found.load(root, limits)
    *others, last = (f.looked_for for f in FORMATS)
    raise TaskError(f"task has no {', '.join(others)} or {last} at its root")
