"""workspace.yaml `cache:` (SPEC §13): true by default, false opts the task out, nothing else accepted."""

from __future__ import annotations

import pytest

from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import TaskError
from tests.tasks.test_workspace import task_with_yaml, yaml_error

WORKSPACE = "repo: https://example.com/r.git\nbase_commit: " + "a" * 40 + "\n"


@pytest.mark.parametrize(("line", "cache"), [("", True), ("cache: true\n", True), ("cache: false\n", False)])
def test_cache_key(tmp_path, line, cache):
    assert load_task(task_with_yaml(tmp_path, WORKSPACE + line)).cache is cache


@pytest.mark.parametrize("value", ["'no'", "0", "off-ish", "[]"])
def test_anything_but_a_boolean_is_refused(tmp_path, value):
    assert yaml_error(tmp_path, WORKSPACE + f"cache: {value}\n").startswith(
        "workspace.yaml: 'cache' must be true or false"
    )
    with pytest.raises(TaskError):
        load_task(task_with_yaml(tmp_path, WORKSPACE + f"cache: {value}\n"))
