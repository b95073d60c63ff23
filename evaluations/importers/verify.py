"""Oracle checks: each task through the executor's own pipeline, with its reference solution as the agent
and with a no-op agent (SPEC §15 --verify, §17 verify_tasks).

1. Each run is ``manage.py evaluate --json ARCHIVE AGENT`` (localrun.py): the
   worker's pipeline, sandbox, limits and database, file:// allowed for that
   run only. A process per run because the spawner owns its process (it is
   the child subreaper of its evaluation's commands): ``--jobs N`` is N such
   processes at once, never N pipelines in one.
2. The solution run's agent is a bash script carrying the solution base64
   encoded in quoted here-documents, so no byte of it is shell syntax:
   SWE-bench's gold patch (``gold_agent``: ``git apply``, then ``patch
   --fuzz``, as SWE-bench's harness applies it) or a Harbor / Terminal-Bench
   reference solution (``solution_agent``: its files in /solution, then
   ``bash solve.sh`` from the working directory with the task's
   ``[solution.env]`` exported, as Harbor's oracle agent); for a task of
   ``[[steps]]`` each step's, chosen by the TASK_STEP it runs for
   (``steps_agent``).
3. The no-op run's agent changes nothing.
4. A task is verified when the solution's reward is 1 and the no-op's is not,
   the no-op's having been graded (its tests ran); when the task's tests
   include fail_to_pass ones (SWE-bench), each of those must fail without the
   solution. Else the reason names what did not hold.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.conf import settings

NOOP = "noop"
NOOP_AGENT = "#!/bin/bash\n# the no-op agent of an oracle check (manage.py verify_tasks): changes nothing\necho no-op\n"
_HEREDOC_END = "GOLD_PATCH_END"  # '_' is not in base64's alphabet: no line of the payload can end the document
SOLUTION_DIR = "/solution"
LOG_TAIL_LINES = 15  # the test output's last lines kept per run, for a run that did not do as it should
MISSING = "not found in the log"  # a swebench-graded id's row output when its log lacks it (SPEC §19)


@dataclass(frozen=True)
class Words:
    """How a kind of check names its runs, in progress lines, the table and the reasons."""

    solution_run: str  # the solution run's name: progress lines, verification.json's key
    task_column: str  # the table's first header
    solution_column: str
    with_solution: str  # starts a reason about the solution run
    without_solution: str  # starts a reason about the no-op run


SWEBENCH = Words("gold", "instance", "gold", "with the gold patch", "without the fix")
ORACLE = Words("solution", "task", "solution", "with the reference solution", "with the no-op agent")


@dataclass(frozen=True)
class Check:
    """One task to check: its archive and its solution agent, or why it cannot be checked (not run)."""

    name: str
    archive: Path | None
    solution_agent: str | None  # bash text
    problem: str | None = None  # set: neither run happens; this is the reason
    format: str | None = None  # workspace | harbor | terminal-bench, when known


@dataclass
class RunOutcome:
    status: str  # the evaluation's status, or "not_started" when evaluate could not start it
    passed: bool
    error: str | None
    error_kind: str | None = None
    eval_id: str | None = None
    duration_ms: int | None = None
    tests: list[dict] = field(default_factory=list)  # name, kind, passed, exit_code, timed_out
    reward: float | None = None
    rewards: dict | None = None
    # SPEC §19 (grader swebench): the ids per kind counted, those that failed and those the log lacked
    # (as far as test_results lists them, failing ones first), and the test output's last lines.
    test_counts: dict | None = None
    failed_ids: list[str] = field(default_factory=list)
    missing_ids: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    # The connections the egress proxy refused ("github.com:443 during installing_deps: resolution
    # failed"): why an install or a test that needs the network failed, when its output does not say.
    refused: list[str] = field(default_factory=list)

    @property
    def graded(self) -> bool:
        """The tests ran and judged the run: it passed, or failed by its tests (not by the agent,
        a limit, the task or the host)."""
        return self.status == "completed" or self.error_kind == "tests_failed"


@dataclass
class Verification:
    task: str
    verified: bool
    reason: str | None
    runs: dict[str, RunOutcome]  # the solution run (by its Words name) and "noop"; empty when not run
    format: str | None = None

    def reward(self, run: str) -> float | None:
        outcome = self.runs.get(run)
        return outcome.reward if outcome is not None else None

    def as_json(self, words: Words = ORACLE) -> dict:
        runs = {run: asdict(outcome) for run, outcome in self.runs.items()}
        return {
            "task": self.task,
            "verified": self.verified,
            "reason": self.reason,
            "solution_reward": self.reward(words.solution_run),
            "noop_reward": self.reward(NOOP),
            **({"format": self.format} if self.format else {}),
            **runs,
        }


# -- the agents -----------------------------------------------------------------------------------


def _heredoc(data: bytes, target: str) -> str:
    encoded = base64.encodebytes(data).decode("ascii")
    return f"base64 -d > {target} <<'{_HEREDOC_END}' || exit 1\n{encoded}{_HEREDOC_END}\n"


def gold_agent(instance_id: str, patch: str) -> str:
    """The gold patch (a row's, or a workspace task's ``patch``) as a bash agent, applied in the repository."""
    return (
        "#!/bin/bash\n"
        f"# the gold patch of {_one_line(instance_id)}, applied by manage.py import_swebench --verify or verify_tasks\n"
        "set -u\n"
        'cd "$REPO_DIR" || exit 1\n'
        "patch_file=$(mktemp) || exit 1\n"
        + _heredoc(patch.encode("utf-8"), '"$patch_file"')
        + 'if git apply --verbose "$patch_file"; then exit 0; fi\n'
        'echo "git apply failed; trying patch --fuzz=5"\n'
        'exec patch --batch --fuzz=5 -p1 -i "$patch_file"\n'
    )


def solution_agent(
    task: str,
    files: dict[str, bytes],
    script: str = "solve.sh",
    *,
    executables: frozenset[str] = frozenset(),
    where: str = SOLUTION_DIR,
    env: dict[str, str] | None = None,
) -> str:
    """Harbor's oracle as a bash agent: ``files`` (relative path -> bytes, ``script`` among them; those
    in ``executables`` made executable) written to ``where`` (/solution), then ``bash /solution/<script>``
    from the working directory, with DEBIAN_FRONTEND=noninteractive as Harbor's oracle sets it and
    ``env`` (the task's [solution.env]) over it and over the task's own variables, as Harbor scopes it.

    The agent runs as the image's user, not as root: when /solution cannot be made (or written), the
    files go to a new folder under $TMPDIR, and a line says so.
    """
    if script not in files:
        raise ValueError(f"the solution has no {script}")
    lines = [
        "#!/bin/bash",
        f"# the reference solution of {_one_line(task)}, run by manage.py verify_tasks as Harbor's oracle runs it",
        "set -u",
        'cd "$REPO_DIR" || exit 1',
        f"wanted={shlex.quote(where)}",
        "solution=$wanted",
        'if ! mkdir -p "$solution" 2>/dev/null || [ ! -w "$solution" ]; then',
        '    solution=$(mktemp -d "${TMPDIR:-/tmp}/solution.XXXXXX") || exit 1',
        '    echo "verify_tasks: $wanted cannot be made by this user; the solution is in $solution"',
        "fi",
    ]
    for relpath in sorted(files):
        quoted = shlex.quote(relpath)
        parent = str(Path(relpath).parent)
        if parent != ".":
            lines.append(f'mkdir -p "$solution"/{shlex.quote(parent)} || exit 1')
        lines.append(_heredoc(files[relpath], f'"$solution"/{quoted}').rstrip("\n"))
        if relpath in executables or relpath == script:
            lines.append(f'chmod +x "$solution"/{quoted}')
    lines += [
        "export DEBIAN_FRONTEND=noninteractive",
        *(f"export {name}={shlex.quote(value)}" for name, value in (env or {}).items()),
        f'exec bash "$solution"/{shlex.quote(script)}',
    ]
    return "\n".join(lines) + "\n"


def steps_agent(task: str, agents: dict[str, str]) -> str:
    """A multi-step task's reference solutions (SPEC §23) as one bash agent: run once per step, it runs
    the step's own (``agents``: step name -> its ``solution_agent``), chosen by TASK_STEP, the step the
    executor runs it for, as Harbor's oracle takes each step's solution in turn."""
    lines = [
        "#!/bin/bash",
        f"# the reference solutions of {_one_line(task)}'s steps, run by manage.py verify_tasks as Harbor's oracle runs them",
        'agent=$(mktemp "${TMPDIR:-/tmp}/step-agent.XXXXXX") || exit 1',
        'case "${TASK_STEP:-}" in',
    ]
    for name, text in agents.items():
        lines += [f"{shlex.quote(name)})", _heredoc(text.encode("utf-8"), '"$agent"').rstrip("\n"), ";;"]
    lines += ['*) echo "verify_tasks: no reference solution for step ${TASK_STEP:-(none)}"; exit 1 ;;', "esac"]
    lines.append('exec bash "$agent"')
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- the runs -------------------------------------------------------------------------------------


def evaluate(archive: Path, agent: Path) -> RunOutcome:
    """One `manage.py evaluate` of ``archive`` with the bash ``agent``; its evaluation object, summed up."""
    manage = Path(settings.BASE_DIR) / "manage.py"
    done = subprocess.run(
        [sys.executable, str(manage), "evaluate", "--json", "--language", "bash", str(archive), str(agent)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return RunOutcome("not_started", False, lines[-1] if lines else f"manage.py evaluate exited {done.returncode}")
    return outcome_of(document)


def outcome_of(document: dict) -> RunOutcome:
    """An evaluation object (GET /evaluate/{id}, ``evaluate --json``) summed up."""
    return RunOutcome(
        status=document["status"],
        passed=bool(document["passed"]),
        error=document.get("error"),
        error_kind=document.get("error_kind"),
        eval_id=document["eval_id"],
        duration_ms=document.get("duration_ms"),
        tests=[
            {key: t[key] for key in ("name", "kind", "passed", "exit_code", "timed_out")}
            for t in document["test_results"]
        ],
        reward=document.get("reward"),
        rewards=document.get("rewards"),
        test_counts=document.get("test_counts"),
        failed_ids=[t["name"] for t in document["test_results"] if not t["passed"] and t["output"] != MISSING],
        missing_ids=[t["name"] for t in document["test_results"] if not t["passed"] and t["output"] == MISSING],
        log_tail=last_lines(document.get("test_output") or ""),
        refused=refused_connections(document.get("egress") or []),
    )


def refused_connections(egress: list[dict]) -> list[str]:
    """The evaluation's ``egress`` entries the proxy refused, one sentence each."""
    return [
        f"{entry.get('host')}:{entry.get('port')} during {entry.get('step')}: {entry.get('reason')}"
        for entry in egress
        if not entry.get("allowed")
    ]


def last_lines(text: str, count: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``count`` non-blank lines of a test output, each at most 300 characters."""
    lines = [line.rstrip()[:300] for line in text.splitlines() if line.strip()]
    return lines[-count:]


Evaluate = Callable[[Path, Path], RunOutcome]


def verify(
    checks: list[Check],
    scratch: Path,
    jobs: int,
    report: Callable[[str], None],
    words: Words = ORACLE,
    run: Evaluate | None = None,
) -> list[Verification]:
    """Run every runnable check twice, ``jobs`` runs at once; a progress line per run as it ends.

    ``run`` is ``evaluate`` (a `manage.py evaluate` process) unless given.
    """
    run = run or evaluate
    noop = scratch / "noop.sh"
    noop.write_text(NOOP_AGENT)
    runnable = [check for check in checks if check.problem is None]
    agents = {}
    for number, check in enumerate(runnable):
        agents[check.name] = scratch / f"solution-{number}.sh"
        agents[check.name].write_text(check.solution_agent)
    # Every solution run before any no-op run: a task's second run then starts from the workspace
    # cache (and the image store) its first one filled (SPEC §13), instead of both preparing at once.
    work = [(check, name) for name in (words.solution_run, NOOP) for check in runnable]
    outcomes: dict[tuple[str, str], RunOutcome] = {}
    lock = threading.Lock()
    started = time.monotonic()

    def one(check: Check, name: str) -> None:
        began = time.monotonic()
        outcome = run(check.archive, agents[check.name] if name != NOOP else noop)
        with lock:
            outcomes[check.name, name] = outcome
            report(
                f"[{len(outcomes)}/{len(work)}] {check.name} {name}: {_shown(outcome)} ({time.monotonic() - began:.1f} s)"
            )

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(one, check, name) for check, name in work]:
            future.result()
    report(f"verified {len(runnable)} task(s) in {time.monotonic() - started:.1f} s")
    results = []
    for check in checks:
        if check.problem is not None:
            results.append(Verification(check.name, False, check.problem, {}, check.format))
            continue
        runs = {name: outcomes[check.name, name] for name in (words.solution_run, NOOP)}
        verified, reason = verdict(runs[words.solution_run], runs[NOOP], words)
        results.append(Verification(check.name, verified, reason, runs, check.format))
    return results


def _shown(outcome: RunOutcome) -> str:
    shown = "passed" if outcome.passed else f"{outcome.status}: {outcome.error or ''}"
    return shown if outcome.reward is None else f"{shown} (reward {outcome.reward:g})"


# -- the verdict ----------------------------------------------------------------------------------


def verdict(solution: RunOutcome, noop: RunOutcome, words: Words = ORACLE) -> tuple[bool, str | None]:
    reasons = []
    if solution.reward != 1:
        why = solution.error or solution.status
        if solution.reward is not None and solution.reward > 1:
            why = f"reward {solution.reward:g}, not 1"
        reasons.append(f"{words.with_solution}: {why}")
    if not noop.graded:
        reasons.append(f"{words.without_solution} the tests did not run: {noop.error or noop.status}")
    else:
        passing = [t["name"] for t in noop.tests if t["kind"] == "fail_to_pass" and t["passed"]]
        counted = ((noop.test_counts or {}).get("fail_to_pass") or {}).get("passed", len(passing))
        if passing or counted:
            shown = ", ".join(passing[:_NAMED]) or f"{counted} fail_to_pass ids"
            more = counted - min(len(passing), _NAMED) if passing else 0
            reasons.append(f"{words.without_solution} {shown}{f' and {more} more' if more else ''} passes")
        elif noop.reward == 1:
            reasons.append(f"{words.without_solution} the reward is 1: the tests pass with nothing done")
    return not reasons, "; ".join(reasons) or None


# -- the table ------------------------------------------------------------------------------------


def table(results: list[Verification], words: Words = ORACLE) -> str:
    rows = [(words.task_column, words.solution_column, "no-op", "verified", "reason")]
    for item in results:
        solution, noop = item.runs.get(words.solution_run), item.runs.get(NOOP)
        rows.append(
            (
                item.task,
                _solution_cell(solution),
                _noop_cell(noop),
                "yes" if item.verified else "NO",
                item.reason or "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "".join(
        ("  " + "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]).rstrip()
        + "\n"
        for row in rows
    )


def _reward_note(outcome: RunOutcome) -> str:
    """`` (reward 0.5)`` or `` (no reward)`` when the word alone does not say it."""
    if outcome.reward is None:
        return " (no reward)"
    return "" if outcome.reward in (0, 1) else f" (reward {outcome.reward:g})"


def _solution_cell(solution: RunOutcome | None) -> str:
    if solution is None:
        return "-"
    return "passed" if solution.reward == 1 else "FAILED" + _reward_note(solution)


def _noop_cell(noop: RunOutcome | None) -> str:
    if noop is None:
        return "-"
    counts = (noop.test_counts or {}).get("fail_to_pass")
    if counts:
        return f"{counts['total'] - counts['passed']}/{counts['total']} f2p fail"
    fail_to_pass = [t for t in noop.tests if t["kind"] == "fail_to_pass"]
    if fail_to_pass:
        return f"{sum(not t['passed'] for t in fail_to_pass)}/{len(fail_to_pass)} f2p fail"
    if not noop.graded:
        return "not graded"
    return "PASSED" if noop.reward == 1 else "failed" + _reward_note(noop)


def details(results: list[Verification], words: Words = ORACLE) -> str:
    """Below the table, for each task not verified: each run that did not do as it should, its ids that
    failed or were not found in the log (SPEC §19), the connections the egress proxy refused it, and
    its test output's last lines."""
    blocks = []
    for item in results:
        if item.verified:
            continue
        solution, noop = item.runs.get(words.solution_run), item.runs.get(NOOP)
        wrong = [(words.solution_run, solution)] if solution is not None and solution.reward != 1 else []
        if noop is not None and (not noop.graded or noop.reward == 1 or _f2p_passing(noop)):
            wrong.append((NOOP, noop))
        for name, outcome in wrong:
            lines = [f"{item.task} ({name} run):"]
            if outcome.failed_ids:
                lines.append("  failed: " + _named(outcome.failed_ids))
            if outcome.missing_ids:
                lines.append(f"  {MISSING}: " + _named(outcome.missing_ids))
            if name == NOOP and _f2p_passing(noop):
                lines.append("  fail_to_pass passing: " + _named(_f2p_passing(noop)))
            if outcome.refused:
                lines.append("  refused connections: " + "; ".join(outcome.refused))
            if outcome.log_tail:
                lines.append("  the test output's last lines:")
                lines += [f"  | {line}" for line in outcome.log_tail]
            if len(lines) > 1:
                blocks.append("\n".join(lines))
    return "".join(block + "\n" for block in blocks)


def _f2p_passing(outcome: RunOutcome) -> list[str]:
    return [t["name"] for t in outcome.tests if t["kind"] == "fail_to_pass" and t["passed"]]


def _named(ids: list[str]) -> str:
    return ", ".join(ids[:_NAMED_DETAILS]) + (
        f" and {len(ids) - _NAMED_DETAILS} more" if len(ids) > _NAMED_DETAILS else ""
    )


_NAMED = 5  # ids named in a reason
_NAMED_DETAILS = 20  # ids named below the table


def write_json(path: Path, results: list[Verification], words: Words = ORACLE) -> Path:
    """``[{task, verified, reason, solution_reward, noop_reward, format, <runs>}]``, replaced whole."""
    temporary = path.with_name(f".{path.name}.tmp")
    document = [result.as_json(words) for result in results]
    temporary.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def command_start(options: dict) -> None:
    """What import_swebench --verify and verify_tasks do first: the pipeline's log lines only with
    ``-v 2`` (the progress lines are the output), and ``--jobs`` at least 1 (else exit 2)."""
    from django.core.management.base import CommandError

    if options["verbosity"] < 2:
        for name in ("term_executor", "evaluations"):
            logging.getLogger(name).setLevel(logging.WARNING)
    if options["jobs"] < 1:
        raise CommandError("--jobs must be at least 1", returncode=2)
