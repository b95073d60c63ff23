"""pytest's ``-rA`` short test summary as a grade (SPEC §17 "Graders", §22): two readings of one text.

1. ``grade_pytest``, the ``pytest`` grader of a workspace task: the LAST summary, up to pytest's final
   counts line after it, each status's lines numbering what that line counts, and exit status 0.
2. ``grade_terminal_bench``, the ``pytest`` grader of a Terminal-Bench task (and of one ``import_tasks``
   converted), as Terminal-Bench 1.x's ``PytestParser`` and harness grade: the results are the
   ``STATUS name`` lines after the FIRST ``short test summary info`` header, to the end of the output;
   passed iff there is at least one and each counts as passed in its mapping (``PASSED``, ``XFAIL``,
   ``SKIPPED``; ``FAILED``, ``ERROR``, ``XPASS`` fail). Where pytest's own counts line closes a summary
   (from the summary header before it), the lines between must number what it counts and the exit
   status must be 0 (the forgery check: a skip reason printed as it is can hold "\\nPASSED x", SWE-bench
   PR #620); where the task's script printed the summary itself (aider polyglot's
   ``=== short test summary info ===`` / ``PASSED aider_polyglot_test``, no counts line), its lines
   are the results and the exit status is the script's business, as in Terminal-Bench.

In both, pytest 9's subtests count: ``SUBFAILED[msg] ID`` (``SUBFAIL ID``) makes ``ID`` failed whatever
its own ``PASSED`` line says, and numbers among the ``failed`` of the counts line (pytest 9 counts
each failed subtest there; pytest-subtests said ``N subtests failed``, counted the same).

Code running inside the tests' own process (the agent's code under test) can do anything pytest can,
exit status included; the task's isolation, not this parser, answers that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .swebench_logs import node_id, subfailed_id

# How each status counts in the workspace grader (SKIPPED: no result, counted in ``skipped``):
#   PASSED, XFAIL          a result that passed (XFAIL: the failure the author marked as expected)
#   FAILED, ERROR, XPASS   a result that failed (ERROR: in setup, teardown or collection;
#                          XPASS: a test marked as failing passed, the task's premise is off)
PASSING = {"PASSED": True, "XFAIL": True, "FAILED": False, "ERROR": False, "XPASS": False}
# Terminal-Bench's PytestTestStatus.to_test_status: SKIPPED passes too.
TERMINAL_BENCH_PASSING = {**PASSING, "SKIPPED": True}

# The words of pytest's final counts line ("2 failed, 5 passed, 1 error in 0.09s") and the
# summary status each counts.
_COUNT_WORDS = {
    "passed": "PASSED",
    "failed": "FAILED",
    "subtests failed": "FAILED",
    "error": "ERROR",
    "errors": "ERROR",
    "skipped": "SKIPPED",
    "xfailed": "XFAIL",
    "xpassed": "XPASS",
}
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_HEADER = re.compile(r"=+ short test summary info =+")
_ANY_HEADER = re.compile(r"=+\s*short test summary info\s*=+", re.IGNORECASE)  # Terminal-Bench's pattern
_COUNTS = re.compile(
    r"(?:=+ )?(?P<body>no tests ran|\d+ [a-z ]+(?:, \d+ [a-z ]+)*) in [\d.]+ ?s(?:econds)?(?: \([^)]*\))?(?: =+)?"
)
_STATUS = re.compile(r"(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED):? (.+)")
_FOLDED_SKIPS = re.compile(r"\[(\d+)\] ")
_MAX_NAMED = 5  # failed tests named in a reason


@dataclass(frozen=True)
class PytestGrade:
    """What pytest's ``-rA`` output says: each test a result, and whether the whole passed."""

    results: list[tuple[str, bool]]  # (node id, passed), in the summary's order, each test once
    passed: bool
    reason: str  # why not passed, one sentence; "" when passed
    skipped: int = 0


class _Summary:
    """The results of summary lines read one by one, and how many lines of each status it listed."""

    def __init__(self, passing: dict[str, bool]):
        self.passing = passing
        self.verdicts: dict[str, bool] = {}
        self.listed = dict.fromkeys(_COUNT_WORDS.values(), 0)

    def read(self, line: str) -> None:
        """1. ``SUBFAILED[...] ID``: ``ID`` failed (a ``failed`` of the counts line).
        2. ``STATUS name``: the node id is what follows, up to `` - `` and the message (a parametrized id
           keeps its brackets, spaces and dashes); a test listed twice (PASSED, then ERROR in its
           teardown) is one result, failed if any was. ``SKIPPED [2] t.py:5: reason`` lists two skips
           of one place."""
        line = line.rstrip()
        sub = subfailed_id(line)
        if sub is not None:
            self.listed["FAILED"] += 1
            self.verdicts[sub] = False
            return
        match = _STATUS.fullmatch(line)
        if not match:
            return
        status, rest = match.groups()
        if status == "SKIPPED":
            folded = _FOLDED_SKIPS.match(rest)  # "SKIPPED [2] test_x.py:5: reason": a place, not a test
            self.listed[status] += int(folded.group(1)) if folded else 1
            if "SKIPPED" not in self.passing:
                return
            name = rest
        else:
            self.listed[status] += 1
            name = rest if status == "PASSED" else node_id(rest)
        self.verdicts[name] = self.verdicts.get(name, True) and self.passing[status]

    def mismatch(self, counted: dict[str, int]) -> str:
        """Why the lines listed disagree with pytest's counts line; "" when they agree."""
        status = next((s for s in self.listed if self.listed[s] != counted.get(s, 0)), None)
        if status is None:
            return ""
        have, want = self.listed[status], counted.get(status, 0)
        why = "a line in it does not stand for a test" if have > want else "run pytest with -rA to list every test"
        return f"the short test summary lists {have} {status} but pytest's final line counts {want}: {why}"


def grade_pytest(output: str, exit_code: int | None) -> PytestGrade:
    """Grade the output of a command that ran ``pytest -rA`` (``exit_code``: None if it was killed).

    Passed iff at least one test ran, every one passed and the command exited 0. Only the last
    short test summary counts, up to the last final counts line after it; what came before it
    (a summary the agent's code printed while the tests ran) is ignored.
    """
    lines = _lines(output)
    header = next((i for i in range(len(lines) - 1, -1, -1) if _HEADER.fullmatch(lines[i].strip())), None)
    if header is None:
        return PytestGrade(
            [], False, "no test ran: the output holds no pytest short test summary (pytest -rA prints it)"
        )
    end = next((i for i in range(len(lines) - 1, header, -1) if _COUNTS.fullmatch(lines[i].strip())), None)
    if end is None:
        return PytestGrade([], False, "the output ends without pytest's final counts line after the short test summary")
    summary = _Summary(PASSING)
    for line in lines[header + 1 : end]:
        summary.read(line)
    return _verdict(summary, summary.mismatch(_counts(lines[end].strip())), exit_code, counted=True)


def grade_terminal_bench(output: str, exit_code: int | None) -> PytestGrade:
    """Grade a Terminal-Bench task's ``run-tests.sh`` output as Terminal-Bench's pytest parser does
    (the module's 2.), with the forgery check wherever pytest's counts line closes a summary."""
    lines = _lines(output)
    first = next((i for i, line in enumerate(lines) if _ANY_HEADER.search(line)), None)
    if first is None:
        return PytestGrade(
            [], False, "no test ran: the output holds no 'short test summary info' header (pytest -rA prints it)"
        )
    summary = _Summary(TERMINAL_BENCH_PASSING)
    since_header = _Summary(TERMINAL_BENCH_PASSING)  # the lines of the summary a counts line closes
    mismatch, counted = "", False
    for line in lines[first + 1 :]:
        text = line.strip()
        if _ANY_HEADER.search(text):
            since_header = _Summary(TERMINAL_BENCH_PASSING)
            continue
        if _COUNTS.fullmatch(text):
            counted = True
            mismatch = mismatch or since_header.mismatch(_counts(text))
            since_header = _Summary(TERMINAL_BENCH_PASSING)
            continue
        summary.read(line)
        since_header.read(line)
    return _verdict(summary, mismatch, exit_code, counted=counted)


def _verdict(summary: _Summary, mismatch: str, exit_code: int | None, *, counted: bool) -> PytestGrade:
    results = list(summary.verdicts.items())
    skipped = summary.listed["SKIPPED"]
    failed = [name for name, ok in results if not ok]
    if failed:
        named = ", ".join(failed[:_MAX_NAMED]) + (
            f" and {len(failed) - _MAX_NAMED} more" if len(failed) > _MAX_NAMED else ""
        )
        reason = f"{len(failed)} of {len(results)} {'test' if len(results) == 1 else 'tests'} failed ({named})"
    elif mismatch:
        reason = mismatch
    elif not results:
        reason = f"no test ran ({skipped} skipped)" if skipped else "no test ran"
    elif not counted:
        reason = ""  # the script printed its own summary: its lines are the results (Terminal-Bench)
    elif exit_code is None:
        reason = "pytest was killed before it exited, though the summary shows every test passed"
    elif exit_code != 0:
        reason = f"pytest exited {exit_code} though the summary shows every test passed"
    else:
        reason = ""
    return PytestGrade(results, reason == "", reason, skipped)


def _lines(output: str) -> list[str]:
    """The output's lines, ANSI colours and CR removed."""
    return [line.rstrip("\r") for line in _ANSI.sub("", output).split("\n")]


def _counts(line: str) -> dict[str, int]:
    """{status: count} of pytest's final line ("1 failed, 2 passed, 3 subtests passed in 0.1s")."""
    body = _COUNTS.fullmatch(line).group("body")
    counts: dict[str, int] = {}
    for item in body.split(", "):
        number, _, word = item.partition(" ")
        if word in _COUNT_WORDS:
            counts[_COUNT_WORDS[word]] = counts.get(_COUNT_WORDS[word], 0) + int(number)
    return counts
