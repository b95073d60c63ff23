"""SWE-bench and SWE-Forge rows in (SPEC §15): read the file, check each row, return instances.

1. FILE is a JSON list (its first character, after blanks, is ``[``) or JSON
   lines (blank lines skipped). A line that is not JSON is a bad row of its
   own, reported by line number; the other rows are still read.
2. Each row is checked before anything is cloned or written: the required
   fields (``REQUIRED``) with their types, ``FAIL_TO_PASS``/``PASS_TO_PASS``
   as lists of strings or a JSON-encoded string of one (the published
   SWE-bench datasets use the string form), and an ``instance_id`` that is
   a safe folder name (it names ``DIR/<id>/`` and ``DIR/<id>.tar.gz``).
3. SWE-Forge's rows are SWE-bench's plus ``install`` (a command or a list),
   ``language``, ``test_cmd``, ``difficulty`` and ``difficulty_score``, each
   checked the same way; the task's workspace.yaml keeps them (build.py).
   Whether a row is SWE-Forge's (its FAIL_TO_PASS are shell commands) is
   decided from its FAIL_TO_PASS entries alone (testids.py), never from which
   other fields it has: SWE-bench Verified's rows carry ``difficulty`` too.
4. SWE-bench 5.0's ``image``, ``eval_script``, ``log_parser`` and
   ``eval_type`` are read when present: ``log_parser`` must name a parser of
   SWE-bench this executor has (``grading/parsers/swebench_logs.LOG_PARSERS``), ``eval_type``
   is ``pass_and_fail`` or ``fail_only``; other extra fields are ignored.
5. A bad row raises ``BadRow`` naming the row by its id when it has a usable
   one, else by its position; the caller reports it and goes on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from evaluations.grading.parsers.swebench_ids import EVAL_TYPES, check_eval_script
from evaluations.grading.parsers.swebench_logs import LOG_PARSERS
from evaluations.tasks import sweforge

from . import testids

REQUIRED = (
    "instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS",
)  # fmt: skip
# A folder name of one component: no slash, no leading dot (no `..`, no hidden file), no blank or
# control character, not so long that `<id>.tar.gz` passes the file system's 255 bytes.
_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+@=-]{0,199}")
_RESERVED = {"index.json", "verification.json"}  # the importer's own files in DIR
MAX_DIFFICULTY_SCORE = sweforge.MAX_DIFFICULTY_SCORE
_REPO = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")


class BadRow(Exception):
    """A row that cannot become a task; ``label`` names it (its id, or where it is in FILE)."""

    def __init__(self, label: str, message: str):
        super().__init__(message)
        self.label = label
        self.message = message


@dataclass(frozen=True)
class Instance:
    instance_id: str
    repo: str  # as the row names it ("owner/name"); the clone URL comes from --repo-url
    base_commit: str
    patch: str  # the gold patch: only --verify uses it
    test_patch: str
    problem_statement: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    version: str | None = None
    language: str | None = None
    install: list[str] | None = None  # SWE-Forge's own; --install overrides it
    test_cmd: str | None = None  # SWE-Forge's own; --test-cmd overrides it
    difficulty: str | None = None  # SWE-Forge's (easy, medium, hard): the task's workspace.yaml keeps it
    difficulty_score: int | None = None  # SWE-Forge's (its dataset's uint8)
    forge: bool = False  # FAIL_TO_PASS / PASS_TO_PASS are shell commands (SWE-Forge's), not test ids
    image: str | None = None  # SWE-bench 5.0's: the row's evaluation image
    eval_script: str | None = None  # SWE-bench 5.0's: the script that runs the tests (its test command)
    log_parser: str | None = None  # SWE-bench 5.0's parser name (parse_log_pytest...), checked
    eval_type: str | None = None  # SWE-bench 5.0's: pass_and_fail | fail_only


def read_rows(path: Path) -> list[tuple[str, object]]:
    """(label, parsed row) for each row of FILE; a line that is not JSON gives a BadRow as its row.

    Raises ValueError when FILE as a whole cannot be read as either form.
    """
    text = path.read_text(encoding="utf-8-sig")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} starts with '[' but is not a JSON list: {exc}") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of instances")
        return [(f"row {number}", row) for number, row in enumerate(rows, 1)]
    rows: list[tuple[str, object]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        label = f"line {number}"
        try:
            rows.append((label, json.loads(line)))
        except json.JSONDecodeError as exc:
            rows.append((label, BadRow(label, f"not a JSON object: {exc.msg} at column {exc.colno}")))
    return rows


def parse_instance(label: str, row: object) -> Instance:
    """The row as an Instance, or BadRow naming what is wrong with it."""
    if isinstance(row, BadRow):
        raise row
    if not isinstance(row, dict):
        raise BadRow(label, f"expected a JSON object, got {type(row).__name__}")
    instance_id = row.get("instance_id")
    if isinstance(instance_id, str) and instance_id:
        label = f"{instance_id} ({label})" if not safe_id(instance_id) else instance_id
    missing = [name for name in REQUIRED if row.get(name) is None]
    if missing:
        raise BadRow(label, f"missing required field(s): {', '.join(missing)}")
    if not isinstance(instance_id, str) or not safe_id(instance_id):
        raise BadRow(
            label,
            f"instance_id {instance_id!r} is not a safe folder name "
            "(letters, digits and ._+@=- only, no slash, not starting with a dot, at most 200 characters)",
        )
    for name in ("repo", "base_commit", "patch", "test_patch", "problem_statement"):
        if not isinstance(row[name], str):
            raise BadRow(label, f"{name} must be a string")
    if not _REPO.fullmatch(row["repo"]) or row["repo"].startswith("-"):
        raise BadRow(label, f"repo {row['repo']!r} is not a repository name like owner/name")
    if not row["problem_statement"].strip():
        raise BadRow(label, "problem_statement is empty: the agent would have no task")
    if not row["test_patch"].strip():
        raise BadRow(label, "test_patch is empty: the task would have no tests of its own")
    fail_to_pass = _test_ids(label, row, "FAIL_TO_PASS")
    if not fail_to_pass:
        raise BadRow(label, "FAIL_TO_PASS is empty: no test would show the fix")
    return Instance(
        instance_id=instance_id,
        repo=row["repo"],
        base_commit=row["base_commit"],
        patch=row["patch"],
        test_patch=row["test_patch"],
        problem_statement=row["problem_statement"],
        fail_to_pass=fail_to_pass,
        pass_to_pass=_test_ids(label, row, "PASS_TO_PASS"),
        version=_optional_text(label, row, "version", numbers=True),
        language=_optional_text(label, row, "language"),
        install=_install(label, row),
        test_cmd=_optional_text(label, row, "test_cmd"),
        difficulty=_optional_text(label, row, "difficulty"),
        difficulty_score=_difficulty_score(label, row),
        forge=testids.kind_of(fail_to_pass) == testids.COMMANDS,
        image=_optional_text(label, row, "image"),
        eval_script=_eval_script(label, row),
        log_parser=_choice(label, row, "log_parser", LOG_PARSERS),
        eval_type=_choice(label, row, "eval_type", EVAL_TYPES),
    )


def safe_id(instance_id: str) -> bool:
    return (
        bool(_SAFE_ID.fullmatch(instance_id))
        and instance_id not in _RESERVED
        and not instance_id.endswith((".tar.gz", ".tmp"))  # never another id's archive or a scratch name
    )


def _test_ids(label: str, row: dict, name: str) -> list[str]:
    value = row[name]
    if isinstance(value, str):  # SWE-bench's published form: the list, JSON-encoded
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise BadRow(label, f"{name} is a string but not a JSON-encoded list of test ids") from None
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise BadRow(label, f"{name} must be a list of test ids (non-empty strings)")
    if any("\0" in item or "\n" in item for item in value):
        raise BadRow(label, f"{name} has a test id with a NUL byte or a line break")
    return list(value)


def _optional_text(label: str, row: dict, name: str, *, numbers: bool = False) -> str | None:
    value = row.get(name)
    if value is None or value == "":
        return None
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise BadRow(label, f"{name} must be a string")
    return value


def _choice(label: str, row: dict, name: str, known) -> str | None:
    value = _optional_text(label, row, name)
    if value is not None and value not in known:
        raise BadRow(label, f"{name} {value!r} is not one this executor has (it has: {', '.join(known)})")
    return value


def _eval_script(label: str, row: dict) -> str | None:
    script = _optional_text(label, row, "eval_script")
    if script is None:
        return None
    try:
        return check_eval_script(script)
    except ValueError as exc:
        raise BadRow(label, f"eval_script {exc}") from None


def _install(label: str, row: dict) -> list[str] | None:
    value = row.get("install")
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise BadRow(label, "install must be a string or a list of strings (shell commands)")


def _difficulty_score(label: str, row: dict) -> int | None:
    value = row.get("difficulty_score")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DIFFICULTY_SCORE:
        raise BadRow(label, f"difficulty_score must be a whole number from 0 to {MAX_DIFFICULTY_SCORE}, got {value!r}")
    return value
