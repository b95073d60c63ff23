"""workspace.yaml's ``swebench:`` mapping (SPEC §19), read and checked; each refusal names the key.

    grader: swebench
    swebench:
      test_cmd: pytest -rA               # shell text, one line; the test files follow it, quoted
      test_files: [tests/test_x.py]      # relative paths (Django: module paths); may be empty
      parser: pytest                     # one of parsers.PARSERS
      fail_to_pass: ["tests/test_x.py::test_a"]   # at least one id
      pass_to_pass: []                   # may be empty
      deleted_files: [tests/test_old.py] # optional: removed before the command runs

The mapping is read only with ``grader: swebench`` and is required by it; such a task has no
``tests/*.sh`` scripts and no checks.txt (its ``tests/`` folder holds support files only).
"""

from __future__ import annotations

from evaluations.pipeline.taskbase import SwebenchTests, TaskError, type_name

from .parsers import PARSERS

KEY = "workspace.yaml: 'swebench'"
_KEYS = ("test_cmd", "test_files", "parser", "fail_to_pass", "pass_to_pass", "deleted_files")


def read_swebench(data: dict, grader: str, *, scripts: int, checks: int) -> SwebenchTests | None:
    """The ``swebench`` mapping of a task graded ``swebench`` (None for another grader); TaskError."""
    value = data.get("swebench")
    if grader != "swebench":
        if value is not None:
            raise TaskError(f"{KEY} is read only with 'grader: swebench' (the grader is {grader})")
        return None
    if value is None:
        raise TaskError("workspace.yaml: 'grader' swebench needs a 'swebench' mapping (test_cmd, test_files, "
                        "parser, fail_to_pass, pass_to_pass)")  # fmt: skip
    if not isinstance(value, dict):
        raise TaskError(f"{KEY} must be a mapping, not {type_name(value)}")
    unknown = [str(key) for key in value if key not in _KEYS]
    if unknown:
        raise TaskError(f"{KEY} has the unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    if scripts or checks:
        what = "tests/*.sh scripts" if scripts else "checks.txt"
        raise TaskError(f"workspace.yaml: 'grader' swebench runs the 'swebench' test command; the task's {what} "
                        "would not run: remove them")  # fmt: skip
    test_cmd = value.get("test_cmd")
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise TaskError(f"{KEY}: 'test_cmd' must be a non-empty string (a shell command)")
    if any(c in test_cmd for c in "\0\n\r"):
        raise TaskError(f"{KEY}: 'test_cmd' must be one line without NUL bytes (the test files follow it)")
    parser = value.get("parser")
    if parser not in PARSERS:
        shown = repr(parser) if isinstance(parser, str) else type_name(parser)
        raise TaskError(f"{KEY}: 'parser' must be one of {', '.join(PARSERS)}, got {shown}")
    fail_to_pass = _ids(value, "fail_to_pass", required=True)
    return SwebenchTests(
        test_cmd=test_cmd,
        test_files=_paths(value, "test_files", required=True),
        parser=parser,
        fail_to_pass=fail_to_pass,
        pass_to_pass=_ids(value, "pass_to_pass", required=True, empty=True),
        deleted_files=_paths(value, "deleted_files", required=False),
    )


def _list(value: dict, key: str, required: bool) -> list:
    items = value.get(key)
    if items is None and not required:
        return []
    if not isinstance(items, list):
        raise TaskError(f"{KEY}: '{key}' must be a list of strings, not {type_name(items)}")
    for number, item in enumerate(items, 1):
        if not isinstance(item, str) or not item:
            raise TaskError(f"{KEY}: '{key}' item {number} must be a non-empty string, not {type_name(item)}")
        if any(c in item for c in "\0\n\r"):
            raise TaskError(f"{KEY}: '{key}' item {number} has a NUL byte or a line break")
    return items


def _ids(value: dict, key: str, *, required: bool, empty: bool = False) -> list[str]:
    ids = _list(value, key, required)
    if not ids and not empty:
        raise TaskError(f"{KEY}: '{key}' is empty: no test would show the fix")
    return list(ids)


def _paths(value: dict, key: str, *, required: bool) -> list[str]:
    paths = _list(value, key, required)
    for number, path in enumerate(paths, 1):
        if path.startswith(("/", "-")) or ".." in path.split("/"):
            raise TaskError(
                f"{KEY}: '{key}' item {number} {path!r} must be a relative path inside the repository "
                "(no leading / or -, no '..')"
            )
    return list(paths)
