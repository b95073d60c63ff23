"""Terminal-Bench's ``parser_name`` (SPEC §22): which grader a Terminal-Bench task gets here.

Terminal-Bench 1.x's ``ParserFactory`` knows ``pytest``, ``swebench``, ``swelancer``, ``mlebench`` and
``sweperf``. Here:

1. ``pytest``: the ``pytest`` grader, read as Terminal-Bench's parser reads (grading/parsers/pytest_summary.py, grading/terminal_bench.py).
2. ``swebench`` (its SWE-bench adapter's tasks): ``run-tests.sh`` applies the test patch and runs the
   row's test command, then Terminal-Bench's in-container ``parser.py`` prints its verdict between
   ``SWEBench results starts here`` / ``ends here``, a line anything in the sandbox can print. Here the
   ``swebench`` grader reads the run's log itself, per id, with SWE-bench's parser for the row's
   repository: ``tests/config.json`` is the SWE-bench row (``repo``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``,
   lists or JSON-encoded strings; a SWE-bench 5.0 ``log_parser`` wins over the repository's). The
   script's exit status is its in-container grader's, so it is not cross-checked.
3. ``swelancer``, ``mlebench``, ``sweperf``: each grades a verdict the task's own scripts compute and
   print in the sandbox (a JSON report, a score file, a speed-up ratio), with nothing the executor could
   check it against: refused, naming the parser. So is any other name.
"""

from __future__ import annotations

import json

from evaluations.grading.parsers.swebench_logs import LOG_PARSERS, PARSERS, parser_for_repo
from evaluations.tasks.readers import type_name
from evaluations.tasks.spec import SupportFile, SwebenchTests, TaskError

CONFIG = "config.json"  # in tests/, Terminal-Bench's SWE-bench adapter's copy of the row
OTHER_PARSERS = {
    "swelancer": "SWE-Lancer's",
    "mlebench": "MLE-bench's",
    "sweperf": "SWE-Perf's",
}


def grader_for(parser_name: object, files: list[SupportFile], where: str) -> tuple[str, SwebenchTests | None]:
    """(the grader, its swebench spec or None) of a task whose ``parser_name`` (``where``: the file and
    key, for errors) is ``parser_name``; ``files`` are the task's tests/ files (relpaths under tests/)."""
    if parser_name == "pytest":
        return "pytest", None
    if parser_name == "swebench":
        return "swebench", swebench_from_config(files)
    shown = repr(parser_name) if isinstance(parser_name, str) else type_name(parser_name)
    if parser_name in OTHER_PARSERS:
        raise TaskError(
            f"{where} {shown} is not supported here: {OTHER_PARSERS[parser_name]} parser reads a verdict the "
            "task's own scripts compute in the sandbox, which the executor cannot check (pytest and swebench are)"
        )
    raise TaskError(f"{where} {shown} is not a parser this executor has (pytest, swebench)")


def swebench_from_config(files: list[SupportFile]) -> SwebenchTests:
    """The ``swebench`` grading of ``tests/config.json`` (a SWE-bench row); TaskError naming the key."""
    where = f"tests/{CONFIG}"
    found = next((f for f in files if f.relpath == CONFIG), None)
    if found is None:
        raise TaskError(f"{where} is missing: a task graded swebench names its SWE-bench row there")
    try:
        row = json.loads(found.data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise TaskError(f"{where} is not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise TaskError(f"{where} must be a JSON object (a SWE-bench row), not {type_name(row)}")
    repo = row.get("repo")
    if not isinstance(repo, str) or not repo:
        raise TaskError(f"{where}: 'repo' must be a repository name (owner/name)")
    log_parser = row.get("log_parser")
    if log_parser is not None and log_parser not in LOG_PARSERS:
        raise TaskError(
            f"{where}: 'log_parser' {log_parser!r} is not a parser this executor has ({', '.join(LOG_PARSERS)})"
        )
    parser = LOG_PARSERS[log_parser] if log_parser else parser_for_repo(repo)
    assert parser in PARSERS
    fail_to_pass = _ids(row, "FAIL_TO_PASS", where)
    if not fail_to_pass:
        raise TaskError(f"{where}: 'FAIL_TO_PASS' is empty: no test would show the fix")
    return SwebenchTests(
        test_cmd="bash run-tests.sh",  # what the verifier runs; shown, never built into a script here
        test_files=[],
        parser=parser,
        fail_to_pass=fail_to_pass,
        pass_to_pass=_ids(row, "PASS_TO_PASS", where),
    )


def _ids(row: dict, key: str, where: str) -> list[str]:
    value = row.get(key, [])
    if isinstance(value, str):  # SWE-bench's published form
        try:
            value = json.loads(value)
        except ValueError:
            raise TaskError(f"{where}: '{key}' is a string but not a JSON-encoded list of test ids") from None
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise TaskError(f"{where}: '{key}' must be a list of test ids (non-empty strings)")
    if any("\0" in item or "\n" in item for item in value):
        raise TaskError(f"{where}: '{key}' has a test id with a NUL byte or a line break")
    return list(value)
