"""--verify: each imported task through the executor's own pipeline, twice (SPEC §15).

1. Each run is ``manage.py evaluate --json ARCHIVE AGENT`` (localrun.py): the
   worker's pipeline, sandbox, limits and database, file:// allowed for that
   run only. A process per run because the spawner owns its process (it is
   the child subreaper of its evaluation's commands): ``--jobs N`` is N such
   processes at once, never N pipelines in one.
2. The gold run's agent applies the row's ``patch`` as SWE-bench's harness
   does (``git apply``, then ``patch --fuzz``); the patch travels base64
   encoded in a quoted here-document, so no byte of it is shell syntax.
   Every test must pass.
3. The no-op run's agent changes nothing: every fail_to_pass script must
   fail (a test that passes without the fix grades nobody).
4. A task is verified when both hold; else the reason names what did not.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.conf import settings

from .build import Built

RUNS = ("gold", "noop")
NOOP_AGENT = "#!/bin/bash\n# the no-op agent of manage.py import_swebench --verify: changes nothing\necho no-op\n"
_HEREDOC_END = "GOLD_PATCH_END"  # '_' is not in base64's alphabet: no line of the patch can end the document


def gold_agent(instance_id: str, patch: str) -> str:
    encoded = base64.encodebytes(patch.encode("utf-8")).decode("ascii")
    return (
        "#!/bin/bash\n"
        f"# the gold patch of {instance_id}, applied by manage.py import_swebench --verify\n"
        "set -u\n"
        'cd "$REPO_DIR" || exit 1\n'
        "patch_file=$(mktemp) || exit 1\n"
        f"base64 -d > \"$patch_file\" <<'{_HEREDOC_END}' || exit 1\n"
        f"{encoded}{_HEREDOC_END}\n"
        'if git apply --verbose "$patch_file"; then exit 0; fi\n'
        'echo "git apply failed; trying patch --fuzz=5"\n'
        'exec patch --batch --fuzz=5 -p1 -i "$patch_file"\n'
    )


@dataclass
class RunOutcome:
    status: str  # the evaluation's status, or "not_started" when evaluate could not start it
    passed: bool
    error: str | None
    error_kind: str | None = None
    eval_id: str | None = None
    duration_ms: int | None = None
    tests: list[dict] = field(default_factory=list)  # name, kind, passed, exit_code, timed_out


@dataclass
class Verification:
    instance_id: str
    verified: bool
    reason: str | None
    runs: dict[str, RunOutcome]

    def as_json(self) -> dict:
        runs = {run: asdict(outcome) for run, outcome in self.runs.items()}
        return {"instance_id": self.instance_id, "verified": self.verified, "reason": self.reason, **runs}


def verdict(gold: RunOutcome, noop: RunOutcome) -> tuple[bool, str | None]:
    reasons = []
    if not gold.passed:
        reasons.append(f"with the gold patch: {gold.error or gold.status}")
    fail_to_pass = [t for t in noop.tests if t["kind"] == "fail_to_pass"]
    if not fail_to_pass:
        reasons.append(f"without the fix the tests did not run: {noop.error or noop.status}")
    passing = [t["name"] for t in fail_to_pass if t["passed"]]
    if passing:
        reasons.append(f"without the fix {', '.join(passing)} passes")
    return not reasons, "; ".join(reasons) or None


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
    )


def verify(built: list[Built], patches: dict[str, str], out: Path, scratch: Path, jobs: int, report) -> list:
    """Run every task twice, ``jobs`` runs at once; a progress line per run as it ends."""
    noop = scratch / "noop.sh"
    noop.write_text(NOOP_AGENT)
    agents = {}
    for task in built:
        agents[task.instance_id] = scratch / f"gold-{task.instance_id}.sh"
        agents[task.instance_id].write_text(gold_agent(task.instance_id, patches[task.instance_id]))
    # Every gold run before any no-op run: a task's second run then starts from the workspace cache
    # its first one filled (SPEC §13), instead of both installing at once.
    work = [(task, run) for run in RUNS for task in built]
    outcomes: dict[tuple[str, str], RunOutcome] = {}
    lock = threading.Lock()
    started = time.monotonic()

    def one(task: Built, run: str) -> None:
        agent = agents[task.instance_id] if run == "gold" else noop
        began = time.monotonic()
        outcome = evaluate(out / task.archive, agent)
        with lock:
            outcomes[task.instance_id, run] = outcome
            shown = "passed" if outcome.passed else f"{outcome.status}: {outcome.error or ''}"
            report(
                f"[{len(outcomes)}/{len(work)}] {task.instance_id} {run}: {shown} ({time.monotonic() - began:.1f} s)"
            )

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(one, task, run) for task, run in work]:
            future.result()
    report(f"verified {len(built)} task(s) in {time.monotonic() - started:.1f} s")
    results = []
    for task in built:
        runs = {run: outcomes[task.instance_id, run] for run in RUNS}
        verified, reason = verdict(runs["gold"], runs["noop"])
        results.append(Verification(task.instance_id, verified, reason, runs))
    return results


def table(results: list[Verification]) -> str:
    rows = [("instance", "gold", "no-op", "verified", "reason")]
    for item in results:
        gold, noop = item.runs["gold"], item.runs["noop"]
        rows.append(
            (
                item.instance_id,
                "passed" if gold.passed else "FAILED",
                _noop_cell(noop),
                "yes" if item.verified else "NO",
                item.reason or "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "".join(
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1] + "\n"
        for row in rows
    )


def _noop_cell(noop: RunOutcome) -> str:
    fail_to_pass = [t for t in noop.tests if t["kind"] == "fail_to_pass"]
    if not fail_to_pass:
        return "no tests"
    return f"{sum(not t['passed'] for t in fail_to_pass)}/{len(fail_to_pass)} f2p fail"
