"""Grader ``reward_file`` (Harbor's, SPEC §17 "Graders" and "Rewards"): the reward the verifier left.

1. What runs: the task's verifier (Harbor), or a workspace task's test scripts (scripts.py), with an
   empty ``/logs/verifier`` (the session's fresh folder) mounted writable.
2. ``read_reward``, after they ended and no process of theirs is alive: ``reward.json``, else
   ``reward.txt``, from that folder, read by the executor without following a link: never by a
   program in the sandbox, whose word would be the agent's. The verifier's row passed iff the reward
   is at least 1; a workspace task's rows are its scripts' exit statuses.
3. The verdict is the reward's alone: completed iff it is at least 1; ``reward`` and ``rewards`` are
   written whatever the end.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from evaluations.models import ErrorKind, Status, TestResult
from evaluations.safefs import SafeFSError, open_root_dir, read_file_at

from .base import Grade, Grader, HostFault, Sandbox, Verdict, VerifierRun, run_verifier
from .scripts import run_scripts

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


class RewardFile(Grader):
    name = "reward_file"

    def run(self, sandbox: Sandbox) -> Grade:
        if sandbox.task.verifier is not None:
            return run_verifier(sandbox, _verifier_reward)
        logs = sandbox.reward_folder()
        grade = run_scripts(sandbox, logs=logs)
        return Grade(grade.results, grade.output, **_reward(logs))

    def verdict(self, grade: Grade, results: list[tuple[str, bool]]) -> Verdict:
        """completed only if the reward is at least 1 (SPEC §17); the rows say nothing of it."""
        fields = {"reward": grade.reward, "rewards": grade.rewards}
        if grade.error:
            return Verdict(Status.FAILED, f"running_tests: {grade.error}", ErrorKind.TESTS_FAILED, fields)
        if grade.reward < 1:
            error = f"running_tests: reward {grade.reward:g} < 1 (/logs/verifier/{grade.source})"
            return Verdict(Status.FAILED, error, ErrorKind.TESTS_FAILED, fields)
        return Verdict(Status.COMPLETED, "", None, fields)


def _verifier_reward(sandbox: Sandbox, run: VerifierRun, row: TestResult) -> Grade:
    fields = _reward(run.logs)
    row.passed = fields["reward"] is not None and fields["reward"] >= 1
    return Grade([row], run.block, **fields)


def _reward(logs: Path) -> dict:
    """The grade's fields from the reward in ``logs``, whatever the commands exited with; a reward that
    cannot be read is the error (``reward`` None)."""
    try:
        reward = read_reward(logs)
    except GradeError as exc:
        return {"reward": None, "rewards": None, "error": str(exc)}
    except SafeFSError as exc:  # the session's own folder: the host's fault
        raise HostFault(f"could not read /logs/verifier: {exc}") from None
    return {"reward": reward.reward, "rewards": reward.rewards, "source": reward.source}
