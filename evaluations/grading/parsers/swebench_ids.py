"""A task graded ``swebench`` (SPEC §19): the test command's log becomes a status per id, and a verdict.

1. The region. The executor's wrapper (``wrapper_script``) prints ``<marker> START`` before the test
   command and ``<marker> END`` after it; only the lines between the two are parsed (SWE-bench's
   ``>>>>> Start Test Output`` / ``>>>>> End Test Output``). SWE-bench's markers are fixed strings
   anyone can print; ours is random per evaluation (``new_marker``), handed to the wrapper on its
   stdin (never in an argument, the environment or a file the tests can read), and the test command
   runs with stdin from /dev/null: a line of the tests' cannot end the region early or stand for the
   wrapper's. What a process left behind prints after the command ended is after the end: ignored.
2. Each id's status comes from the region with the task's parser (swebench_logs.py), matched as SWE-bench
   matches (``resolve``): the exact name; for the parsers that cut names at the first blank, the id
   cut there too (``t.py::test[a b]`` is the log's ``t.py::test[a``); and SWE-bench's fallback for
   ids cut mid-parameter (more ``[`` than ``]``): the log's names starting with the id, when they all
   agree on passed or not.
3. Passed (SWE-bench's ``test_passed``/``test_maintained``): PASSED or XFAIL; a pass_to_pass id also
   when SKIPPED (a skipped test is no regression), a fail_to_pass id never. An id the log does not
   name is failed: "not found in the log".
4. Resolved iff every fail_to_pass and pass_to_pass id passed, and the exit status agrees with the
   log (SWE-bench's cross-check): a command that exited non-zero while the log shows no FAILED or
   ERROR test did not run as its log says. A zero exit is not required: tests outside the ids may
   fail (SWE-bench's FAIL_TO_FAIL). A command that never printed a test (a crash at import) leaves
   every id missing: not resolved.

5. SWE-bench 5.0's rows bring their own ``eval_script`` (``eval_script_test``): it is the test command,
   run whole in the wrapper but stopped at its ``: '>>>>> End Test Output'`` line with the test
   command's own status (what follows only resets the test files; SWE-bench records the same
   status, ``record_test_exit_code``), and its log is read between its ``>>>>> Start Test Output`` and
   ``>>>>> End Test Output`` lines, all of the region when they hold no test (``get_logs_eval``).
   ``eval_type: fail_only`` (SWE-bench's ``check_fail_only``): an id passed unless the log says it
   FAILED, which is only a verdict when the parser found some test in the log.

Code that runs inside the test process (the agent's code under test) can do anything the test runner
can, its exit status included; the task's isolation answers that, not the log's reader.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass

from . import swebench_logs

FAIL_TO_PASS, PASS_TO_PASS = "fail_to_pass", "pass_to_pass"
PASS_AND_FAIL, FAIL_ONLY = "pass_and_fail", "fail_only"
EVAL_TYPES = (PASS_AND_FAIL, FAIL_ONLY)  # SWE-bench's EvalType
START_TEST_OUTPUT, END_TEST_OUTPUT = ">>>>> Start Test Output", ">>>>> End Test Output"  # SWE-bench's
MAX_EVAL_SCRIPT_BYTES = 4 * 1024 * 1024  # a test patch in a heredoc; SWE-bench's largest are under 1 MiB
MISSING = "not found in the log"
# The parsers that keep a name only up to its first blank (SWE-bench's parse_log_pytest and kin).
CUT_AT_BLANK = frozenset({"pytest", "pytest_options", "matplotlib", "seaborn"})
_PASSING = {swebench_logs.PASSED, swebench_logs.XFAIL}
_FAILING = {swebench_logs.FAILED, swebench_logs.ERROR}
_NAMED = 5  # ids named in a reason


def new_marker() -> str:
    """A marker no test can know in advance: 128 random bits."""
    return f"TE-SWEBENCH-{secrets.token_hex(16)}"


def check_eval_script(script: str) -> str:
    """``script`` if it can be a SWE-bench eval script here; ValueError saying why not."""
    if "\0" in script:
        raise ValueError("contains a NUL byte")
    if len(script.encode()) > MAX_EVAL_SCRIPT_BYTES:
        raise ValueError(f"is over {MAX_EVAL_SCRIPT_BYTES} bytes")
    if _end_line(script.split("\n")) is None or START_TEST_OUTPUT not in script:
        raise ValueError(
            f"has no {START_TEST_OUTPUT!r} and {END_TEST_OUTPUT!r} lines around its test command "
            "(SWE-bench's eval scripts mark the test output so)"
        )
    return script


def _end_line(lines: list[str]) -> int | None:
    return next((i for i, line in enumerate(lines) if END_TEST_OUTPUT in line and not line.startswith("#")), None)


def eval_script_command(script: str) -> str:
    """SWE-bench's eval script as the wrapper's test command: up to its END line, then exiting with the
    status of the test command before it (SWE-bench's record_test_exit_code)."""
    lines = [line for line in script.strip("\n").split("\n") if line not in ("#!/bin/bash", "set -uxo pipefail")]
    end = _end_line(lines)
    return "\n".join(["set -uxo pipefail", *lines[:end], "te_test_status=$?", lines[end], 'exit "$te_test_status"'])


def wrapper_script(test_cmd: str, test_files: list[str], deleted_files: list[str] = ()) -> str:
    """The bash script the executor runs: the marker read from stdin, the files the test patch deletes
    removed, then ``test_cmd`` (one line, or an eval script's command) with each test file quoted,
    between the two marker lines; it exits with the test command's status."""
    lines = [
        "#!/bin/bash",
        "# made by the executor for a task graded swebench (SPEC §19): the test command between two markers",
        "IFS= read -r marker || exit 125",
        "exec </dev/null",
    ]
    lines += [f"rm -f -- {shlex.quote(path)}" for path in deleted_files]
    command = " ".join([test_cmd, *(shlex.quote(name) for name in test_files)])
    lines += [
        "printf '%s START\\n' \"$marker\"",
        f"( {command}\n)",
        "status=$?",
        "printf '\\n%s END\\n' \"$marker\"",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def region(output: str, marker: str) -> str | None:
    """The lines between the wrapper's START line and the END line after it; None when either is absent."""
    lines = output.split("\n")
    start = next((i for i, line in enumerate(lines) if line.rstrip("\r") == f"{marker} START"), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].rstrip("\r") == f"{marker} END"), None)
    if end is None:
        return None
    return "\n".join(lines[start + 1 : end])


def resolve(test_id: str, statuses: dict[str, str], parser: str) -> tuple[str, str] | None:
    """(the log's name, its status) for ``test_id``, as SWE-bench matches ids; None: not in the log."""
    if test_id in statuses:
        return test_id, statuses[test_id]
    words = test_id.split()
    if parser in CUT_AT_BLANK and words and words[0] != test_id and words[0] in statuses:
        return words[0], statuses[words[0]]
    if test_id.count("[") > test_id.count("]"):
        matches = [name for name in statuses if name.startswith(test_id)]
        if matches and len({statuses[name] in _PASSING for name in matches}) == 1:
            return matches[0], statuses[matches[0]]
    return None


@dataclass(frozen=True)
class IdResult:
    test_id: str
    kind: str  # fail_to_pass | pass_to_pass
    status: str | None  # the log's status; None: not found in the log
    passed: bool
    logged_as: str = ""  # the log's name when it is not the id itself

    @property
    def shown(self) -> str:
        """What the id's row says: its status (and the log's name for it), or that the log lacks it."""
        if self.status is None:
            return MISSING
        return self.status + (f", in the log as {self.logged_as}" if self.logged_as else "")


@dataclass(frozen=True)
class SwebenchGrade:
    results: list[IdResult]  # fail_to_pass ids, then pass_to_pass ids, in the task's order
    passed: bool
    reason: str  # why not resolved, one sentence; "" when resolved
    counts: dict  # {fail_to_pass: {total, passed, failed, missing}, pass_to_pass: {...}}

    def rows_order(self) -> list[IdResult]:
        """Failing ids first (those the row cap must keep), then the passing ones; each in the task's order."""
        return [r for r in self.results if not r.passed] + [r for r in self.results if r.passed]


def grade(
    output: str,
    exit_code: int | None,
    marker: str | None,
    parser: str,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    *,
    eval_type: str = PASS_AND_FAIL,
    marked: bool = False,
    check_exit: bool = True,
) -> SwebenchGrade:
    """Grade a finished test command's ``output`` (the wrapper's; ``marker`` None: the whole output is
    the log) and exit status. ``marked``: the log is read between SWE-bench's own marker lines (an eval
    script's); ``check_exit`` False: the exit status says nothing of the tests (Terminal-Bench's
    run-tests.sh, whose status is its own grader's)."""
    text = region(output, marker) if marker is not None else output
    statuses = _statuses(text, parser, marked) if text is not None else {}
    results = []
    for kind, ids in ((FAIL_TO_PASS, fail_to_pass), (PASS_TO_PASS, pass_to_pass)):
        passing = _PASSING | ({swebench_logs.SKIPPED} if kind == PASS_TO_PASS else set())
        for test_id in ids:
            found = resolve(test_id, statuses, parser)
            if eval_type == FAIL_ONLY:  # SWE-bench's check_fail_only: passed unless the log says FAILED
                status = found[1] if found else None
                shown = found[0] if found and found[0] != test_id else ""
                results.append(
                    IdResult(test_id, kind, status, status != swebench_logs.FAILED and bool(statuses), shown)
                )
                continue
            if found is None:
                results.append(IdResult(test_id, kind, None, False))
                continue
            name, status = found
            results.append(IdResult(test_id, kind, status, status in passing, name if name != test_id else ""))
    counts = {
        kind: {
            "total": sum(r.kind == kind for r in results),
            "passed": sum(r.kind == kind and r.passed for r in results),
            "failed": sum(r.kind == kind and not r.passed and r.status is not None for r in results),
            "missing": sum(r.kind == kind and r.status is None for r in results),
        }
        for kind in (FAIL_TO_PASS, PASS_TO_PASS)
    }
    exit_code = exit_code if check_exit else 0
    return SwebenchGrade(results, *_verdict(results, text, statuses, exit_code, parser), counts)


def _statuses(text: str, parser: str, marked: bool) -> dict[str, str]:
    read = swebench_logs.PARSERS[parser]
    if marked and START_TEST_OUTPUT in text:
        inside = text.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
        statuses = read(inside)
        if statuses:
            return statuses
    return read(text)


def _verdict(results, text, statuses, exit_code, parser) -> tuple[bool, str]:
    if text is None:
        return False, "the test command's output has no end marker: it did not run to its end"
    failing = [r for r in results if not r.passed]
    if failing:
        named = ", ".join(f"{r.test_id} ({r.shown})" for r in failing[:_NAMED])
        more = f" and {len(failing) - _NAMED} more" if len(failing) > _NAMED else ""
        empty = f"; the {parser} parser found no test in the log" if not statuses else ""
        return False, f"{len(failing)} of {len(results)} test ids did not pass: {named}{more}{empty}"
    if exit_code != 0 and not any(status in _FAILING for status in statuses.values()):
        return False, (
            f"the test command exited {exit_code} though its log shows no failing test: "
            "the log does not describe the run"
        )
    return True, ""
