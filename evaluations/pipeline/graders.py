"""How what a verifier left becomes a grade (SPEC §17 "Graders" and "Rewards").

Pure functions the pipeline calls after a verifier ended and no process of it is alive. The
grade is made here, in the executor, from output the runtime captured or files read without
following a link: never by a program in the sandbox, whose word would be the agent's.

1. ``read_reward`` (grader ``reward_file``, Harbor's): ``reward.json``, else ``reward.txt``,
   from the verifier's fresh ``/logs/verifier`` folder.
2. ``grade_pytest`` (grader ``pytest``, Terminal-Bench 1.x's): the last ``-rA`` short test
   summary, cross-checked with pytest's final counts line and the command's exit status.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from evaluations.safefs import SafeFSError, open_root_dir, read_file_at

REWARD_FILES = ("reward.json", "reward.txt")  # in this order: the first present is the reward
MAX_REWARD_BYTES = 64 * 1024  # a reward is a few numbers; anything larger is refused unread
# SPEC §21: a reward is a score, not a magnitude; one of 1e308 would outweigh every other in a
# batch's mean (and overflow a sum of a few). Anything outside is refused, naming the file.
MAX_REWARD = 1e9
_RANGE = "the range a reward may take, [-1e9, 1e9]"  # MAX_REWARD, as a person writes it


class GradeError(Exception):
    """The verifier's result cannot be graded; ``message`` names the file as the task sees it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Reward:
    """A verifier's reward: the headline, every named number, and the file they came from."""

    reward: float
    rewards: dict[str, float]
    source: str  # "reward.json" or "reward.txt"


def read_reward(folder: Path, shown: str = "/logs/verifier") -> Reward:
    """The reward the verifier wrote in ``folder`` (its ``/logs/verifier``, named ``shown`` in errors).

    1. ``reward.json`` if anything has that name: a JSON object whose values are all finite
       numbers (not booleans, not nested); the headline is key ``reward``, else the only key.
       Duplicate keys are refused: parsers disagree on which one wins.
    2. Else ``reward.txt``: one finite decimal number, surrounding whitespace allowed;
       ``rewards`` is then ``{"reward": value}``.
    3. Neither, or anything else (a link, a FIFO, a folder, over ``MAX_REWARD_BYTES``, empty,
       not UTF-8, not a number, NaN, infinite or outside [-MAX_REWARD, MAX_REWARD]): ``GradeError``,
       never a reward.

    A ``folder`` that cannot be opened is the executor's own fault: its ``SafeFSError`` is raised as is.
    """
    dir_fd = open_root_dir(folder)
    try:
        for name in REWARD_FILES:
            where = f"{shown}/{name}"
            try:
                data = read_file_at(dir_fd, name, max_bytes=MAX_REWARD_BYTES, shown=where)
            except SafeFSError as exc:
                raise GradeError(str(exc)) from None
            if data is None:
                continue
            text = _text(data, where)
            if name == "reward.json":
                rewards = _json_rewards(text, where)
                return Reward(_headline(rewards, where), rewards, name)
            value = _text_reward(text, where)
            return Reward(value, {"reward": value}, name)
    finally:
        os.close(dir_fd)
    raise GradeError(f"the verifier wrote no reward: neither {shown}/reward.json nor {shown}/reward.txt exists")


def _text(data: bytes, where: str) -> str:
    if not data.strip():
        raise GradeError(f"{where} is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise GradeError(f"{where} is not UTF-8 text") from None


def _json_rewards(text: str, where: str) -> dict[str, float]:
    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for key, value in items:
            if key in seen:
                raise GradeError(f"{where} has the key {json.dumps(key)} twice")
            seen[key] = value
        return seen

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise GradeError(f"{where} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # an integer of over 4300 digits
        raise GradeError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise GradeError(f'{where} holds {_json_kind(value)}, not an object of numbers such as {{"reward": 1.0}}')
    if not value:
        raise GradeError(f"{where} holds an empty object: it names no reward")
    rewards = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise GradeError(f"{where}: the value of {json.dumps(key)} is {_json_kind(item)}, not a number")
        number = _finite(item)
        if number is None:
            raise GradeError(f"{where}: the value of {json.dumps(key)} is not a finite number ({item})")
        if abs(number) > MAX_REWARD:
            raise GradeError(f"{where}: the value of {json.dumps(key)} is {item}, outside {_RANGE}")
        rewards[key] = number
    return rewards


def _headline(rewards: dict[str, float], where: str) -> float:
    if "reward" in rewards:
        return rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.values()))
    keys = ", ".join(json.dumps(k) for k in list(rewards)[:5]) + (", ..." if len(rewards) > 5 else "")
    raise GradeError(f'{where} has several keys ({keys}) and none is "reward": which one is the reward is unclear')


_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def _text_reward(text: str, where: str) -> float:
    word = text.strip()
    shown = json.dumps(word[:40] + ("..." if len(word) > 40 else ""), ensure_ascii=False)
    if _DECIMAL.fullmatch(word):
        number = _finite(float(word))
        if number is not None and abs(number) > MAX_REWARD:
            raise GradeError(f"{where} holds {shown}, outside {_RANGE}")
        if number is not None:
            return number
    elif word.lower().lstrip("+-") not in ("nan", "inf", "infinity"):
        raise GradeError(f"{where} holds {shown}, not one number")
    raise GradeError(f"{where} holds {shown}, not a finite number")


def _finite(value: int | float) -> float | None:
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return number if math.isfinite(number) else None


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a number"


# -- pytest -----------------------------------------------------------------------------------

# How each status of the short test summary counts (Terminal-Bench 1.x's parser counts them so,
# SKIPPED aside; SWE-bench's grading agrees on PASSED, XFAIL, FAILED and ERROR):
#   PASSED, XFAIL          a result that passed (XFAIL: the failure the author marked as expected)
#   FAILED, ERROR, XPASS   a result that failed (ERROR: in setup, teardown or collection;
#                          XPASS: a test marked as failing passed, the task's premise is off)
#   SKIPPED                no result: a skipped test did not run (counted in ``skipped``)
PASSING = {"PASSED": True, "XFAIL": True, "FAILED": False, "ERROR": False, "XPASS": False}

# The words of pytest's final counts line ("2 failed, 5 passed, 1 error in 0.09s") and the
# summary status each counts.
_COUNT_WORDS = {
    "passed": "PASSED",
    "failed": "FAILED",
    "error": "ERROR",
    "errors": "ERROR",
    "skipped": "SKIPPED",
    "xfailed": "XFAIL",
    "xpassed": "XPASS",
}
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_HEADER = re.compile(r"=+ short test summary info =+")
_COUNTS = re.compile(
    r"(?:=+ )?(?P<body>no tests ran|\d+ [a-z ]+(?:, \d+ [a-z ]+)*) in [\d.]+ ?s(?:econds)?(?: \([^)]*\))?(?: =+)?"
)
_STATUS = re.compile(r"(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+)")
_FOLDED_SKIPS = re.compile(r"\[(\d+)\] ")
_MAX_NAMED = 5  # failed tests named in a reason


@dataclass(frozen=True)
class PytestGrade:
    """What pytest's ``-rA`` output says: each test a result, and whether the whole passed."""

    results: list[tuple[str, bool]]  # (node id, passed), in the summary's order, each test once
    passed: bool
    reason: str  # why not passed, one sentence; "" when passed
    skipped: int = 0


def grade_pytest(output: str, exit_code: int | None) -> PytestGrade:
    """Grade the output of a command that ran ``pytest -rA`` (``exit_code``: None if it was killed).

    Passed iff at least one test ran, every one passed and the command exited 0. Only the last
    short test summary counts, up to the last final counts line after it; what came before it
    (a summary the agent's code printed while the tests ran) is ignored. Inside it:

    1. A line is a result when it starts with a status (``PASSING``); the node id is what
       follows, up to `` - `` and the message (a parametrized id keeps its brackets, spaces
       and dashes); ANSI colours and CR are removed first.
    2. A test listed twice (PASSED, then ERROR in its teardown) is one result, failed if any was.
    3. The lines of each status must number what the final counts line says: a skip or xfail
       reason is printed as it is, so a reason holding "\\nPASSED x" would add a line no test
       earned (and without -rA passes are not listed). A mismatch fails the grade.

    Code running inside the tests' own process (the agent's code under test) can do anything
    pytest can, exit status included; the task's isolation, not this parser, answers that.
    """
    lines = [line.rstrip("\r") for line in _ANSI.sub("", output).split("\n")]
    header = next((i for i in range(len(lines) - 1, -1, -1) if _HEADER.fullmatch(lines[i].strip())), None)
    if header is None:
        return PytestGrade(
            [], False, "no test ran: the output holds no pytest short test summary (pytest -rA prints it)"
        )
    end = next((i for i in range(len(lines) - 1, header, -1) if _COUNTS.fullmatch(lines[i].strip())), None)
    if end is None:
        return PytestGrade([], False, "the output ends without pytest's final counts line after the short test summary")
    verdicts: dict[str, bool] = {}
    listed = dict.fromkeys(_COUNT_WORDS.values(), 0)
    for line in lines[header + 1 : end]:
        match = _STATUS.fullmatch(line.rstrip())
        if not match:
            continue
        status, rest = match.groups()
        if status == "SKIPPED":
            folded = _FOLDED_SKIPS.match(rest)  # "SKIPPED [2] test_x.py:5: reason": a place, not a test
            listed[status] += int(folded.group(1)) if folded else 1
            continue
        listed[status] += 1
        name = rest if status == "PASSED" else _node_id(rest)
        verdicts[name] = verdicts.get(name, True) and PASSING[status]
    results = list(verdicts.items())
    skipped = listed["SKIPPED"]
    failed = [name for name, ok in results if not ok]
    counted = _counts(lines[end].strip())
    mismatch = next((s for s in listed if listed[s] != counted.get(s, 0)), None)
    if failed:
        named = ", ".join(failed[:_MAX_NAMED]) + (
            f" and {len(failed) - _MAX_NAMED} more" if len(failed) > _MAX_NAMED else ""
        )
        reason = f"{len(failed)} of {len(results)} {'test' if len(results) == 1 else 'tests'} failed ({named})"
    elif mismatch:
        have, want = listed[mismatch], counted.get(mismatch, 0)
        why = "a line in it does not stand for a test" if have > want else "run pytest with -rA to list every test"
        reason = f"the short test summary lists {have} {mismatch} but pytest's final line counts {want}: {why}"
    elif not results:
        reason = f"no test ran ({skipped} skipped)" if skipped else "no test ran"
    elif exit_code is None:
        reason = "pytest was killed before it exited, though the summary shows every test passed"
    elif exit_code != 0:
        reason = f"pytest exited {exit_code} though the summary shows every test passed"
    else:
        reason = ""
    return PytestGrade(results, reason == "", reason, skipped)


def _node_id(rest: str) -> str:
    """The node id of ``rest`` ("<node id> - <message>"): it ends at the first " - " where the id,
    if parametrized (a "[" after its last "::"), has closed its brackets ("test[a - b] - boom")."""
    start = 0
    while (cut := rest.find(" - ", start)) != -1:
        name = rest[:cut]
        if "[" not in name.rpartition("::")[2] or name.endswith("]"):
            return name
        start = cut + 1
    return rest


def _counts(line: str) -> dict[str, int]:
    """{status: count} of pytest's final line ("1 failed, 2 passed, 3 subtests passed in 0.1s")."""
    body = _COUNTS.fullmatch(line).group("body")
    counts: dict[str, int] = {}
    for item in body.split(", "):
        number, _, word = item.partition(" ")
        if word in _COUNT_WORDS:
            counts[_COUNT_WORDS[word]] = counts.get(_COUNT_WORDS[word], 0) + int(number)
    return counts
