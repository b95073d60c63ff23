"""A Harbor task's ``[[steps]]`` (SPEC §23, multi-step tasks), read against Harbor 0.25's own model:
``StepConfig`` and ``multi_step_reward_strategy`` (``harbor/models/task/config.py``), the step's files
(``paths.py``: ``steps/<name>/instruction.md``, ``tests/``, ``solution/``), its verifier's tests
(``verifier/verifier.py``) and its oracle (``agents/oracle.py``).

1. A step is a table with a ``name`` (a portable folder name, unique as Harbor compares them: NFC,
   case folded), its own ``steps/<name>/instruction.md`` (the prompt, held to the prompt's cap) and
   optional ``[steps.agent]`` (``timeout_sec``, ``network_mode``, ``allowed_hosts``, ``user``),
   ``[steps.verifier]`` (the same, and ``[steps.verifier.env]``), ``min_reward`` (a number, or a
   table of numbers by reward key), ``healthcheck`` and ``artifacts`` (read as [environment.healthcheck]
   and the top-level ``artifacts`` are) and ``steps/<name>/workdir/`` (its files, ``setup.sh`` among them).
2. What Harbor resolves, resolved here: the agent's timeout is the step's, else [agent]'s; the
   verifier's is the step's, else 600 s (Harbor's ``VerifierConfig`` default, which its fallback to
   [verifier]'s never reaches); a phase's network is the step's table's, else [agent]'s or [verifier]'s,
   else [environment]'s; the verifier's variables are [verifier.env] under [steps.verifier.env]; the
   verifier's user the step's, else [verifier]'s; where the verifier runs (Harbor's
   ``resolve_step_verifier_mode``): ``[steps.verifier] environment_mode``, else ``separate`` when
   [steps.verifier.environment] is there, else the task's ([verifier]'s, harbor.py), else shared; a
   separate one's image and environment as harbor.py's ``_separate_verifier`` chooses them, the step's
   table and steps/<name>/tests/ before [verifier]'s and tests/ (its network the step's phase's, else
   [verifier]'s, else its environment's).
3. The verifier's /tests: tests/ (if any), then steps/<name>/tests/ over it; its script the step's
   tests/test.sh, else tests/test.sh (one of the two is required). The reference solution: the step's
   solution/ (solve.sh required there), else the task's solution/.
4. What would run differently here is refused with a sentence naming the step (its number from 1 and
   its name) and the key: a step's agent user other than the task's (the agent's user is the map's,
   fixed when the root is mounted); grader other than
   reward_file and ``[verifier] isolated`` with steps. A step's keys not read here are kept in the
   metadata, under ``steps``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from evaluations.tasks.readers import (
    TaskLimits,
    folder_files,
    is_folder,
    is_number,
    jsonable,
    prompt_cap,
    read_text,
    type_name,
)
from evaluations.tasks.spec import (
    MEAN,
    REWARD_STRATEGIES,
    SupportFile,
    TaskError,
    TaskRequest,
    TaskStep,
    Verifier,
)

MAX_STEPS = 100  # Harbor has no bound; each step is a prompt, a verifier run and a row of the evaluation
HARBOR_VERIFIER_TIMEOUT_SECS = 600.0  # VerifierConfig.timeout_sec's default: a step's unless it sets its own
_BAD_NAME_CHARS = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')  # Harbor's step_name.py
_DEVICE_NAME = re.compile(r"(CON|PRN|AUX|NUL|CONIN\$|CONOUT\$|(?:COM|LPT)[1-9¹²³])", re.IGNORECASE)


class Readers(NamedTuple):
    """harbor.py's readers of task.toml's tables, given by it (this module is below it): ``table`` its
    ``_Table``, ``phase_network`` and ``literal_env`` as it reads [agent]'s network and [verifier.env],
    ``user`` a phase's user, ``healthcheck`` a table's ``healthcheck``, ``artifacts`` a table's
    ``artifacts`` and ``collect`` a verifier table's ``collect`` as it reads [agent] user,
    [environment.healthcheck], the top-level ``artifacts`` and [[verifier.collect]], and ``separate``, given a
    step's verifier table and its tests folder, its separate verifier (or None) and that one's network, the
    task's [verifier] under it as Harbor's ``resolve_step_verifier_mode`` resolves it."""

    table: Callable
    phase_network: Callable
    literal_env: Callable
    user: Callable
    healthcheck: Callable
    artifacts: Callable
    collect: Callable
    separate: Callable


class Steps(NamedTuple):
    """What a multi-step task's reading gives ``harbor.load``: its steps, how their rewards make the
    task's, the prompt and verifier the task shows (the first step's), and a step's keys not read."""

    steps: tuple[TaskStep, ...]
    strategy: str
    prompt: str
    verifier: Verifier
    kept: list[dict]


def read(
    root: Path,
    entries: object,
    strategy: object,
    *,
    request: TaskRequest,
    verifier: Verifier,
    grader: str,
    solution: tuple[str | None, list[SupportFile]],
    limits: TaskLimits,
    readers: Readers,
) -> Steps:
    """The task's steps, ``entries`` being task.toml's ``steps`` (present and not empty)."""
    if strategy is not None and strategy not in REWARD_STRATEGIES:
        shown = repr(strategy) if isinstance(strategy, str) else type_name(strategy)
        raise TaskError(f"task.toml: multi_step_reward_strategy must be mean or final, got {shown}")
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise TaskError(f"task.toml: [[steps]] must be an array of tables, got {type_name(entries)}")
    if len(entries) > MAX_STEPS:
        raise TaskError(f"task.toml: [[steps]] has {len(entries)} steps, over the {MAX_STEPS} this executor runs")
    if grader != "reward_file":
        raise TaskError(
            f"task.toml: [verifier] grader = {grader!r} with [[steps]]: a step is graded by its reward file"
        )
    if verifier.isolated:
        raise TaskError(
            "task.toml: [verifier] isolated = true with [[steps]]: every step's verifier shares the environment"
        )
    if not is_folder(root / "steps", "steps"):
        raise TaskError("task.toml has [[steps]] but the task has no steps/ folder (steps/<name>/instruction.md)")
    steps, kept, seen = [], [], set()
    for index, entry in enumerate(entries):
        name = entry.get("name")
        label = f"task.toml: [[steps]] #{index + 1}" + (f" ({name[:80]!r})" if isinstance(name, str) else "")
        try:
            step, rest = _step(
                root, entry, readers, request=request, verifier=verifier, solution=solution, limits=limits
            )
        except TaskError as exc:
            raise TaskError(f"{label}: {str(exc).removeprefix('task.toml: ')}") from None
        key = unicodedata.normalize("NFC", step.name).casefold()
        if key in seen:
            raise TaskError(
                f"{label}: name is another step's too (names are compared case- and form-blind, as Harbor does)"
            )
        seen.add(key)
        steps.append(step)
        kept.append(rest)
    return Steps(tuple(steps), strategy or MEAN, steps[0].prompt, steps[0].verifier, kept)


def _step(root, entry: dict, readers: Readers, *, request, verifier, solution, limits) -> tuple[TaskStep, dict]:
    table = readers.table(entry, "steps")
    name = _name(table.take("name"))
    healthcheck = readers.healthcheck(table)
    artifacts = readers.artifacts(table)
    agent = table.table("agent")
    verifier_table = table.table("verifier")
    agent_user = readers.user(agent)
    if agent_user is not None and agent_user != request.agent_user:
        task_user = "the image's User" if request.agent_user is None else f"[agent] user {request.agent_user!r}"
        raise TaskError(
            f"[steps.agent] user = {agent_user!r}: a step's agent user other than the task's ({task_user}) is not "
            "supported here: the agent's user is the evaluation's uid in the image's id map, fixed when the root "
            "is mounted before the first step"
        )
    verifier_user = readers.user(verifier_table)
    folder = root / "steps" / name
    shown = f"steps/{name}"
    separate, baseline = readers.separate(verifier_table, f"{shown}/tests")
    collect = readers.collect(verifier_table)  # Harbor's: run after this step's agent, after the task's own
    step_request = dataclasses.replace(
        request,
        agent_timeout_secs=agent.number("timeout_sec") or request.agent_timeout_secs,
        verifier_timeout_secs=verifier_table.number("timeout_sec") or HARBOR_VERIFIER_TIMEOUT_SECS,
        agent_network=readers.phase_network(agent) or request.agent_network,
        verifier_network=readers.phase_network(verifier_table) or request.verifier_network or baseline,
        verifier_user=verifier_user or request.verifier_user,
    )
    env = {**verifier.env, **readers.literal_env(verifier_table.table("env"))}
    min_reward = _min_reward(table)
    if not is_folder(folder, shown):
        raise TaskError(f"name: there is no {shown}/ folder (its instruction.md, tests/ and solution/)")
    workdir = folder / "workdir"
    workdir_files = folder_files(workdir, f"{shown}/workdir") if is_folder(workdir, f"{shown}/workdir") else []
    prompt = read_text(
        folder / "instruction.md",
        f"{shown}/instruction.md",
        required=True,
        cap=prompt_cap(limits.max_prompt_bytes, instruction=True),
    )
    step = TaskStep(
        name=name,
        prompt=prompt,
        verifier=dataclasses.replace(verifier, files=_tests(folder, shown, verifier.files), env=env, separate=separate),
        request=step_request,
        min_reward=min_reward,
        healthcheck=healthcheck,
        artifacts=artifacts,
        collect=collect,
        workdir_files=workdir_files,
        **_solution(folder, shown, solution),
    )
    return step, jsonable(table.rest())


def _name(name: object) -> str:
    """Harbor's ``validate_step_name``: a name every host can make a folder of."""
    if name is None:
        raise TaskError("[steps] name is required (the step's folder under steps/)")
    if not isinstance(name, str):
        raise TaskError(f"[steps] name must be a string, got {type_name(name)}")
    if (
        not name.strip()
        or name in (".", "..")
        or name.endswith((".", " "))
        or _BAD_NAME_CHARS.search(name)
        or _DEVICE_NAME.fullmatch(name.partition(".")[0].rstrip(" "))
        or len(name.encode("utf-8")) > 255
    ):
        raise TaskError(
            f"[steps] name {name[:80]!r} is not a portable folder name (no path separators, control or "
            "reserved characters, device names or trailing dots and spaces; at most 255 bytes)"
        )
    return name


def _min_reward(table) -> float | dict[str, float] | None:
    value = table.take("min_reward")
    where = "[steps] min_reward"
    if value is None:
        return None
    if isinstance(value, dict):
        if not value:
            raise TaskError(f"{where} is an empty table: give a number, or thresholds by reward key")
        return {key: _threshold(item, f"{where}.{key}") for key, item in value.items()}
    return _threshold(value, where)


def _threshold(value: object, where: str) -> float:
    if not is_number(value):
        raise TaskError(f"{where} must be a number, got {type_name(value)}")
    if not math.isfinite(value):
        raise TaskError(f"{where} must be a finite number, got {value}")
    return float(value)


def _tests(folder: Path, shown: str, shared: list[SupportFile]) -> list[SupportFile]:
    """/tests as Harbor's verifier fills it for the step: tests/, then the step's tests/ over it."""
    own = folder_files(folder / "tests", f"{shown}/tests") if is_folder(folder / "tests", f"{shown}/tests") else []
    merged = {file.relpath: file for file in shared}
    for file in own:
        merged[file.relpath] = file
    paths = set(merged)
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in paths:
                raise TaskError(
                    f"{shown}/tests/{path} and tests/{'/'.join(parts[:depth])}: a file where the other has a folder"
                )
    if "test.sh" not in merged:
        raise TaskError(f"the step has no test script: neither {shown}/tests/test.sh nor tests/test.sh exists")
    return [merged[path] for path in sorted(merged)]


def _solution(folder: Path, shown: str, task: tuple[str | None, list[SupportFile]]) -> dict:
    """The step's solution/ (its solve.sh then required, as Harbor's oracle requires it), else the task's."""
    if not is_folder(folder / "solution", f"{shown}/solution"):
        return {"solution": task[0], "solution_files": task[1]}
    script = read_text(folder / "solution" / "solve.sh", f"{shown}/solution/solve.sh", required=True)
    return {"solution": script, "solution_files": folder_files(folder / "solution", f"{shown}/solution")}
