"""workspace.yaml's ``swebench:`` mapping (SPEC §19), read and checked; each refusal names the key.

    grader: swebench
    swebench:
      test_cmd: pytest -rA               # shell text, one line; the test files follow it, quoted
      test_files: [tests/test_x.py]      # relative paths (Django: module paths); may be empty
      parser: pytest                     # one of grading/parsers/swebench_logs.PARSERS
      fail_to_pass: ["tests/test_x.py::test_a"]   # at least one id
      pass_to_pass: []                   # may be empty
      deleted_files: [tests/test_old.py] # optional: removed before the command runs
      eval_script: |                     # optional, instead of test_cmd and test_files: SWE-bench 5.0's
        ...                              #   script, its test output between its >>>>> marker lines
      eval_type: pass_and_fail           # optional: or fail_only (SWE-bench's EvalType)

The mapping is read only with ``grader: swebench`` and is required by it; such a task has no
``tests/*.sh`` scripts and no checks.txt (its ``tests/`` folder holds support files only).
"""

from __future__ import annotations

from evaluations.grading.parsers.swebench_ids import EVAL_TYPES, PASS_AND_FAIL, check_eval_script
from evaluations.grading.parsers.swebench_logs import PARSERS
from evaluations.tasks.readers import type_name
from evaluations.tasks.spec import SwebenchTests, TaskError

KEY = "workspace.yaml: 'swebench'"
_KEYS = (
    "test_cmd",
    "test_files",
    "parser",
    "fail_to_pass",
    "pass_to_pass",
    "deleted_files",
    "eval_script",
    "eval_type",
)


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
    eval_script = value.get("eval_script")
    if eval_script is not None:
        return _with_eval_script(value, eval_script)
    test_cmd = value.get("test_cmd")
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise TaskError(f"{KEY}: 'test_cmd' must be a non-empty string (a shell command)")
    if any(c in test_cmd for c in "\0\n\r"):
        raise TaskError(f"{KEY}: 'test_cmd' must be one line without NUL bytes (the test files follow it)")
    return SwebenchTests(
        test_cmd=test_cmd,
        test_files=_paths(value, "test_files", required=True),
        parser=_parser(value),
        fail_to_pass=_ids(value, "fail_to_pass", required=True),
        pass_to_pass=_ids(value, "pass_to_pass", required=True, empty=True),
        deleted_files=_paths(value, "deleted_files", required=False),
        eval_type=_eval_type(value),
    )


def _with_eval_script(value: dict, eval_script: object) -> SwebenchTests:
    if not isinstance(eval_script, str):
        raise TaskError(f"{KEY}: 'eval_script' must be a string (a bash script), not {type_name(eval_script)}")
    try:
        check_eval_script(eval_script)
    except ValueError as exc:
        raise TaskError(f"{KEY}: 'eval_script' {exc}") from None
    for key in ("test_cmd", "test_files"):
        if value.get(key):
            raise TaskError(f"{KEY}: '{key}' and 'eval_script' both say what runs: keep one")
    return SwebenchTests(
        test_cmd="",
        test_files=[],
        parser=_parser(value),
        fail_to_pass=_ids(value, "fail_to_pass", required=True),
        pass_to_pass=_ids(value, "pass_to_pass", required=True, empty=True),
        deleted_files=_paths(value, "deleted_files", required=False),
        eval_script=eval_script,
        eval_type=_eval_type(value),
    )


def _parser(value: dict) -> str:
    parser = value.get("parser")
    if parser not in PARSERS:
        shown = repr(parser) if isinstance(parser, str) else type_name(parser)
        raise TaskError(f"{KEY}: 'parser' must be one of {', '.join(PARSERS)}, got {shown}")
    return parser


def _eval_type(value: dict) -> str:
    eval_type = value.get("eval_type", PASS_AND_FAIL)
    if eval_type not in EVAL_TYPES:
        shown = repr(eval_type) if isinstance(eval_type, str) else type_name(eval_type)
        raise TaskError(f"{KEY}: 'eval_type' must be one of {', '.join(EVAL_TYPES)}, got {shown}")
    return eval_type


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
