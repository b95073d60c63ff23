"""``python -m bench.swebench [--runs N] [--json FILE]``: import_swebench and --verify per task, against the
same install and test command by hand in a venv (issue 27).

Every figure is measured in this run, on this machine, and printed; none is judged by an assertion.

The rows are SWE-bench's shape, built as the test suite builds them (tests/helpers/swebench.py
``Instances``): ROWS real git repositories served over dumb HTTP on 127.0.0.1, one per row (so each
row's gold run is a cold install), each a package ``calc`` (a pyproject.toml depending on a pinned
``attrs`` from PyPI) with 54 pytest tests in five files; the test patch adds tests/test_add.py
(FAIL_TO_PASS, 12 ids) and extends tests/test_sub.py (PASS_TO_PASS, 12 ids); the gold patch fixes
``add``. The install recipe is a ``--specs`` file as SWE-bench's specifications are written
(``pip_packages`` pytest and attrs pinned, ``install`` ``pip install -e .``, ``test_cmd`` ``pytest
-rA``), so each task installs from PyPI through the executor's egress proxy (EGRESS_ALLOW names
the registries: here they resolve to a TEST-NET address the default rules refuse).

1. ``manage.py import_swebench ROWS --out DIR --repo-url URL --specs FILE`` as a subprocess: its wall
   time, and per row the time between its progress lines (the first row's includes the process
   starting; PYTHONUNBUFFERED, the lines are read as they come).
2. ``... --verify --jobs 1`` on a scratch DATA_DIR (migrated database, WORKSPACE_BASE under /tmp,
   tests/helpers/cli.py's EvaluateCli): ``--runs`` times cold, each on a data folder of its own (an
   empty workspace cache: every gold run clones and installs; the no-op runs, queued after every gold
   run, start from the snapshot their gold run left), then ``--runs`` times warm on the last one's
   (the same command again: every run from the cache). Per task
   and run: the evaluation's duration_ms (verification.json), the wall time of its ``manage.py
   evaluate`` process (the progress line), the cache use, and the transitions' duration_ms per step
   (read from the scratch database with dumpdata, as bench/harbor.py does).
3. By hand: per task and run kind, ``--runs`` times, as plain processes with the environment the
   executor gives its commands (PATH, a fresh HOME: no pip cache, no user pip.conf): ``git clone``
   of the served repository and ``checkout`` of base_commit; ``python3 -m venv`` with the python
   the executor's commands find; the task's install commands (from its workspace.yaml, the same
   text) with the venv first on PATH; ``git apply`` of the test patch and (gold) of the gold patch;
   the task's test command over its test files (``pytest -rA tests/test_add.py tests/test_sub.py``),
   graded by the executor's own grader (grading/parsers/swebench_ids.py). Each phase timed; beside
   them, not in the total, ``python3 -m venv --without-pip --system-site-packages``: the venv the
   executor writes (environments/toolchains.py make_venv), without ensurepip's 2-3 s.
4. The executor's share = (executor - by hand) / executor: cold, the cold gold evaluation against
   the whole by-hand run (and against it with the pip-less venv's time in place of ``python3 -m
   venv``'s: "pip-less"); warm, the warm evaluation against the by-hand run without the venv and
   the install (clone, apply, test: what the workspace cache cannot save).

Traffic goes to 127.0.0.1 and to PyPI (through the egress proxy for the executor, directly by
hand); the server, the scratch folders and the database go with the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
django.setup()  # the task reader, the grader and the executor's choice of python below are the pipeline's

from bench.common import PROJECT, bench_folder, load_average, machine  # noqa: E402
from bench.harbor import _median, _ms, _secs, _table, stored_evaluations  # noqa: E402
from bench.images import cpu_model  # noqa: E402
from evaluations.environments import toolchains  # noqa: E402
from evaluations.grading.parsers import swebench_ids  # noqa: E402
from evaluations.models import Step  # noqa: E402
from evaluations.runtime.sandbox import SYSTEM_PATH, usable_language_runtimes  # noqa: E402
from evaluations.tasks.registry import load_task  # noqa: E402
from executor_project.config import Config  # noqa: E402
from tests.helpers.cli import EvaluateCli  # noqa: E402
from tests.helpers.httpserver import TestHTTPServer  # noqa: E402
from tests.helpers.runtimes import REGISTRIES  # noqa: E402
from tests.helpers.swebench import Instances, write_jsonl  # noqa: E402

ROWS = 3
VERSION = "1.0"
DEPENDENCY = "attrs==23.2.0"
PYTEST = "pytest==7.4.4"
SPEC = {
    "python": "3.11",
    "pip_packages": [PYTEST, DEPENDENCY],
    "install": "pip install -e .",
    "test_cmd": "pytest -rA",
}
RUNS = ("gold", "noop")
STEPS = tuple(step for step in Step.values if step not in ("queued", "done"))
TIMEOUT_SECS = 1800
PLAIN_TIMEOUT_SECS = 600
PROGRESS = re.compile(r"^\[\d+/\d+\] (?P<task>\S+) (?P<run>gold|noop): .* \((?P<secs>[\d.]+) s\)$", re.M)
IMPORTED = re.compile(r"^\[\d+/\d+\] (?P<task>\S+): ")
PLAIN_PHASES = ("clone", "venv", "install", "apply", "test")

# -- the rows --------------------------------------------------------------------------------------

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "calc"
version = "1.0"
dependencies = ["attrs"]

[tool.setuptools]
packages = ["calc"]
"""
OPS_BUGGY = (
    "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    if b == 0:\n        raise ZeroDivisionError('b is 0')\n"
    "    return a / b\n"
)
OPS_FIXED = OPS_BUGGY.replace("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b")
MONEY = (
    "import attrs\n\n\n@attrs.frozen\nclass Money:\n    cents: int\n    currency: str = 'EUR'\n\n"
    "    def plus(self, other):\n        if other.currency != self.currency:\n"
    "            raise ValueError('currencies differ')\n        return Money(self.cents + other.cents, self.currency)\n\n"
    "    def times(self, factor):\n        return Money(self.cents * factor, self.currency)\n"
)


def _parametrized(module: str, function: str, expression: str, cases: list[tuple[int, int, object]]) -> str:
    return (
        f"import pytest\n\nfrom calc.{module} import {function}\n\n\n"
        f"@pytest.mark.parametrize(('a', 'b', 'want'), {cases!r})\n"
        f"def test_{function}(a, b, want):\n    assert {expression} == want\n"
    )


def _ids(path: str, function: str, cases: list[tuple]) -> list[str]:
    return [f"{path}::test_{function}[{'-'.join(str(v) for v in case)}]" for case in cases]


ADD_CASES = [(a, b, a + b) for a, b in zip(range(1, 13), range(3, 15), strict=True)]
SUB_CASES = [(a, b, a - b) for a, b in zip(range(20, 30), range(1, 11), strict=True)]
MUL_CASES = [(a, b, a * b) for a, b in zip(range(1, 11), range(2, 12), strict=True)]
DIV_CASES = [(a * b, b, a) for a, b in zip(range(1, 11), range(2, 12), strict=True)]
SUB_EXTRA = (
    "\n\ndef test_sub_zero():\n    assert sub(0, 0) == 0\n\n\ndef test_sub_negative():\n    assert sub(1, 4) == -3\n"
)
MONEY_TESTS = (
    "import pytest\n\nfrom calc.money import Money\n\n\n"
    "@pytest.mark.parametrize('cents', [0, 1, 5, 99, 100, 250, 1000, 12345])\n"
    "def test_plus(cents):\n    assert Money(cents).plus(Money(1)) == Money(cents + 1)\n\n\n"
    "def test_times():\n    assert Money(3).times(4).cents == 12\n\n\n"
    "def test_currencies_differ():\n    with pytest.raises(ValueError):\n        Money(1).plus(Money(1, 'USD'))\n"
)
BASE = {
    "pyproject.toml": PYPROJECT,
    "calc/__init__.py": "from calc.money import Money\nfrom calc.ops import add, div, mul, sub\n",
    "calc/ops.py": OPS_BUGGY,
    "calc/money.py": MONEY,
    "tests/__init__.py": "",
    "tests/test_sub.py": _parametrized("ops", "sub", "sub(a, b)", SUB_CASES),
    "tests/test_mul.py": _parametrized("ops", "mul", "mul(a, b)", MUL_CASES),
    "tests/test_div.py": _parametrized("ops", "div", "div(a, b)", DIV_CASES),
    "tests/test_money.py": MONEY_TESTS,
}
TESTS = {
    "tests/test_add.py": _parametrized("ops", "add", "add(a, b)", ADD_CASES),
    "tests/test_sub.py": BASE["tests/test_sub.py"] + SUB_EXTRA,
}
FAIL_TO_PASS = _ids("tests/test_add.py", "add", ADD_CASES)
PASS_TO_PASS = _ids("tests/test_sub.py", "sub", SUB_CASES) + [
    "tests/test_sub.py::test_sub_zero",
    "tests/test_sub.py::test_sub_negative",
]
TEST_COUNT = len(ADD_CASES) + len(SUB_CASES) + 2 + len(MUL_CASES) + len(DIV_CASES) + 10


def make_rows(instances: Instances) -> list[dict]:
    """ROWS instances, each a repository of its own (a NOTE file apart), so each gold run installs cold."""
    return [
        instances.make(
            f"bench__calc-{n}",
            repo=f"bench/calc-{n}",
            base={**BASE, "NOTE": f"row {n}\n"},
            tests=TESTS,
            fix={"calc/ops.py": OPS_FIXED},
            fail_to_pass=FAIL_TO_PASS,
            pass_to_pass=PASS_TO_PASS,
            version=VERSION,
            problem_statement="calc.add subtracts: `add(2, 3)` returns -1, it should return 5.\n",
        )
        for n in range(ROWS)
    ]


# -- 1. and 2. the command -------------------------------------------------------------------------


@dataclass
class Imported:
    wall_secs: float
    first_row_secs: float  # process start to the first row's progress line
    row_secs: list[float]  # between consecutive progress lines (rows 2..n)
    end_secs: float  # the last row's line to the process's exit


def timed_import(cli: EvaluateCli, rows: Path, out: Path, url: str, specs: Path) -> Imported:
    """``import_swebench`` without --verify; its progress lines timed as they arrive."""
    argv = [sys.executable, "manage.py", "import_swebench", str(rows), "--out", str(out), "--repo-url", url,
            "--specs", str(specs)]  # fmt: skip
    started = time.monotonic()
    process = subprocess.Popen(
        argv, cwd=PROJECT, env={**cli.env, "PYTHONUNBUFFERED": "1"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    stamps, lines = [], []
    for line in process.stdout:
        lines.append(line)
        if IMPORTED.match(line):
            stamps.append(time.monotonic())
    stderr = process.stderr.read()
    status = process.wait(timeout=TIMEOUT_SECS)
    ended = time.monotonic()
    if status != 0 or len(stamps) != ROWS:
        raise SystemExit(f"import_swebench exited {status}:\n{''.join(lines)}\n{stderr[-3000:]}")
    return Imported(
        ended - started,
        stamps[0] - started,
        [b - a for a, b in zip(stamps, stamps[1:], strict=False)],
        ended - stamps[-1],
    )


@dataclass
class Pass:
    label: str  # "cold" or "warm N"
    wall_secs: float
    tasks: list[dict]  # verification.json's
    run_secs: dict[tuple[str, str], float]  # (task, run) -> its manage.py evaluate's wall time


def verify_pass(cli: EvaluateCli, rows: Path, out: Path, url: str, specs: Path, label: str) -> Pass:
    started = time.monotonic()
    done = cli.manage("import_swebench", str(rows), "--out", str(out), "--repo-url", url, "--specs", str(specs),
                      "--verify", "--jobs", "1", timeout=TIMEOUT_SECS)  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"import_swebench --verify ({label}) exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    tasks = json.loads((out / "verification.json").read_text())["tasks"]
    run_secs = {(m["task"], m["run"]): float(m["secs"]) for m in PROGRESS.finditer(done.stdout)}
    print(f"  import_swebench --verify {label}: {wall:.1f} s, {sum(t['verified'] for t in tasks)}/{len(tasks)} "
          f"verified (load {load_average()})", file=sys.stderr, flush=True)  # fmt: skip
    return Pass(label, wall, tasks, run_secs)


def evaluation_rows(cli: EvaluateCli) -> dict[str, dict]:
    """Each evaluation's cache use and the python its tests ran on (pytest's header), by id."""
    done = cli.manage("dumpdata", "evaluations.Evaluation", timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"manage.py dumpdata failed: {done.stderr[-2000:]}")
    found = {}
    for row in json.loads(done.stdout):
        header = re.search(r"platform \S+ -- Python (\S+), pytest-(\S+)", row["fields"].get("test_output") or "")
        found[str(row["pk"])] = {"cache": row["fields"].get("cache"), "python": header and header[1]}
    return found


# -- 3. by hand ------------------------------------------------------------------------------------


def executor_python() -> toolchains.Python:
    """The python3 the executor's commands find (host runtimes reachable by the sandbox uid, then the system's)."""
    path = ":".join([*(f"{p}/bin" for p in usable_language_runtimes(Config().sandbox_uid)), SYSTEM_PATH])
    python = toolchains.find_python(path)
    if python is None:
        raise SystemExit(f"no python3 on {path}")
    return python


@dataclass
class PlainRun:
    phases_ms: dict[str, float] = field(default_factory=dict)
    resolved: bool | None = None
    reason: str = ""

    @property
    def total_ms(self) -> float:
        return sum(self.phases_ms[p] for p in PLAIN_PHASES)

    @property
    def pipless_ms(self) -> float:
        """The same with the venv as the executor makes it (no ensurepip): the install itself ran with the
        ensurepip venv's pip, the same version as the interpreter's own, which the executor's venv runs."""
        return self.total_ms - self.phases_ms["venv"] + self.phases_ms["venv_pipless"]

    @property
    def warm_ms(self) -> float:
        """What the workspace cache cannot save: the checkout, the patches, the tests."""
        return sum(self.phases_ms[p] for p in ("clone", "apply", "test"))


def by_hand(task_dir: Path, row: dict, url: str, work: Path, python: str, *, gold: bool) -> PlainRun:
    """The task as plain processes; each phase timed, the test output graded as the executor grades it."""
    task = load_task(task_dir)
    spec = task.swebench
    work.mkdir()
    (work / "home").mkdir()
    repo, venv = work / "repo", work / "venv"
    env = {"PATH": f"{venv}/bin:{SYSTEM_PATH}", "HOME": str(work / "home"), "LANG": "C.UTF-8", **task.env}
    run = PlainRun()

    def phase(name: str, *commands: list[str], cwd: Path = work, stdin: str | None = None) -> tuple[str, int]:
        """``commands`` one after the other, timed as ``name``; each must exit 0 but the test command."""
        started = time.perf_counter()
        output, status = "", 0
        for argv in commands:
            done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, input=stdin,
                                  timeout=PLAIN_TIMEOUT_SECS)  # fmt: skip
            output, status = output + done.stdout + done.stderr, done.returncode
            if name != "test" and status != 0:
                raise RuntimeError(f"{task_dir.name} by hand: {shlex.join(argv)} exited {status}: {output[-2000:]}")
        run.phases_ms[name] = run.phases_ms.get(name, 0) + (time.perf_counter() - started) * 1000
        return output, status

    phase("clone", ["git", "clone", "--quiet", "--no-checkout", "--", url, str(repo)],
          ["git", "-C", str(repo), "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach",
           row["base_commit"]])  # fmt: skip
    phase("venv", [python, "-m", "venv", str(venv)])
    phase("venv_pipless", [python, "-m", "venv", "--without-pip", "--system-site-packages", str(work / "venv-pipless")])
    phase("install", *(["bash", "-c", command] for command in task.install), cwd=repo)
    patches = [row["test_patch"]] + ([row["patch"]] if gold else [])
    for patch in patches:
        phase("apply", ["git", "apply", "-"], cwd=repo, stdin=patch)
    command = " ".join([spec.test_cmd, *(shlex.quote(name) for name in spec.test_files)])
    output, status = phase("test", ["bash", "-c", command], cwd=repo)
    marker = swebench_ids.new_marker()
    grade = swebench_ids.grade(f"{marker} START\n{output}\n{marker} END\n", status, marker, spec.parser,
                          spec.fail_to_pass, spec.pass_to_pass)  # fmt: skip
    run.resolved, run.reason = grade.passed, grade.reason
    header = re.search(r"platform \S+ -- Python (\S+)", output)
    run.reason = run.reason or (f"python {header[1]}" if header else "")
    return run


# -- 4. the report ---------------------------------------------------------------------------------


def _steps_median(runs: list[dict]) -> dict:
    return {s: _median([r["steps_ms"].get(s, 0) for r in runs]) for s in STEPS} | {
        "other": _median([r["other_ms"] for r in runs])
    }


def figures_of(imports: list[Imported], colds: list[Pass], warm: list[Pass], stored, rows_info, plain) -> dict:
    tasks = {}
    for entry in colds[0].tasks:
        name = entry["instance_id"]
        per_run = {}
        for run in RUNS:

            def one(p: Pass, run=run, name=name) -> dict:
                found = next(t for t in p.tasks if t["instance_id"] == name)[run]
                steps = stored[found["eval_id"]].steps_ms
                return {
                    "duration_ms": found["duration_ms"],
                    "wall_secs": p.run_secs.get((name, run)),
                    "passed": found["passed"],
                    "cache": rows_info[found["eval_id"]]["cache"],
                    "python": rows_info[found["eval_id"]]["python"],
                    "steps_ms": steps,
                    "other_ms": found["duration_ms"] - sum(steps.get(s, 0) for s in STEPS),
                }

            cold_runs, warm_runs = [one(p) for p in colds], [one(p) for p in warm]
            by = plain[name, run]
            per_run[run] = {
                "cold": cold_runs,
                "cold_duration_ms_median": _median([r["duration_ms"] for r in cold_runs]),
                "cold_wall_secs_median": _median([r["wall_secs"] for r in cold_runs]),
                "cold_steps_ms_median": _steps_median(cold_runs),
                "warm": warm_runs,
                "warm_duration_ms_median": _median([r["duration_ms"] for r in warm_runs]),
                "warm_wall_secs_median": _median([r["wall_secs"] for r in warm_runs]),
                "warm_steps_ms_median": _steps_median(warm_runs),
                "plain": [asdict(r) | {"total_ms": r.total_ms, "warm_ms": r.warm_ms} for r in by],
                "plain_phases_ms_median": {
                    p: _median([r.phases_ms[p] for r in by]) for p in (*PLAIN_PHASES, "venv_pipless")
                },
                "plain_ms_median": _median([r.total_ms for r in by]),
                "plain_pipless_ms_median": _median([r.pipless_ms for r in by]),
                "plain_warm_ms_median": _median([r.warm_ms for r in by]),
            }
            r = per_run[run]
            executor_cold, executor_warm = r["cold_duration_ms_median"], r["warm_duration_ms_median"]
            r["share_cold"] = (executor_cold - r["plain_ms_median"]) / executor_cold if run == "gold" else None
            r["share_cold_pipless"] = (
                (executor_cold - r["plain_pipless_ms_median"]) / executor_cold if run == "gold" else None
            )
            r["share_warm"] = (executor_warm - r["plain_warm_ms_median"]) / executor_warm if executor_warm else None
        tasks[name] = per_run
    return {
        "rows": ROWS,
        "tests_per_repository": TEST_COUNT,
        "import": [asdict(i) for i in imports],
        "verify_wall_secs": {"cold": [p.wall_secs for p in colds], "warm": [p.wall_secs for p in warm]},
        "tasks": tasks,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f} %"


def report(figures: dict, runs: int) -> str:
    imports = figures["import"]
    rows = figures["rows"]
    wall = figures["verify_wall_secs"]
    out = [
        f"{rows} rows, each a repository of its own on 127.0.0.1 ({figures['tests_per_repository']} pytest tests; "
        f"the test files run: 24 of them, 12 FAIL_TO_PASS and 12 PASS_TO_PASS ids); recipe {json.dumps(SPEC)}",
        "",
        f"import_swebench (no --verify), {len(imports)} times: wall "
        + ", ".join(f"{i['wall_secs']:.2f}" for i in imports)
        + f" s; process start to row 1's line, median {_median([i['first_row_secs'] for i in imports]):.2f} s; "
        f"each further row, median {_median([s for i in imports for s in i['row_secs']]) * 1000:.0f} ms; "
        f"last row to exit, median {_median([i['end_secs'] for i in imports]) * 1000:.0f} ms",
        f"import_swebench --verify --jobs 1 ({2 * rows} evaluations), each on an empty workspace cache, median "
        f"of {runs}: {_median(wall['cold']):.1f} s ({_median(wall['cold']) / rows:.1f} s a task; each "
        f"{', '.join(f'{w:.1f}' for w in wall['cold'])} s); then again on the last one's cache, median of {runs}: {_median(wall['warm']):.1f} s "
        f"({_median(wall['warm']) / rows:.1f} s a task; each {', '.join(f'{w:.1f}' for w in wall['warm'])} s)",
        "",
        "Per task and run: the evaluation's duration_ms / the wall time of its `manage.py evaluate` process; "
        f"cache use; passed (each cold; each warm); medians of {runs}.",
        "",
    ]
    table = [("task", "run", "cold", "cold cache", "warm", "warm cache", "passed", "python")]
    for name, task in figures["tasks"].items():
        for run in RUNS:
            r = task[run]
            table.append((
                name, run,
                f"{_ms(r['cold_duration_ms_median'])} / {_secs(r['cold_wall_secs_median'])}",
                " ".join(c["cache"] for c in r["cold"]),
                f"{_ms(r['warm_duration_ms_median'])} / {_secs(r['warm_wall_secs_median'])}",
                " ".join(w["cache"] for w in r["warm"]),
                " ".join(str(c["passed"]) for c in r["cold"]) + "; " + " ".join(str(w["passed"]) for w in r["warm"]),
                " ".join(sorted({str(c["python"]) for c in r["cold"] + r["warm"]})),
            ))  # fmt: skip
    out += [
        _table(table),
        "",
        "Where the time goes: the transitions' duration_ms per step (cold median; warm median).",
        "",
    ]
    shown_steps = [
        s for s in STEPS if any(t[r]["cold_steps_ms_median"][s] for t in figures["tasks"].values() for r in RUNS)
    ]
    table = [("task", "run", *shown_steps, "queued + other")]
    for name, task in figures["tasks"].items():
        for run in RUNS:
            r = task[run]
            cold_steps, warm_steps = r["cold_steps_ms_median"], r["warm_steps_ms_median"]
            cells = [f"{_ms(cold_steps[s])}; {_ms(warm_steps[s])}" for s in shown_steps]
            table.append((name, run, *cells, f"{_ms(cold_steps['other'])}; {_ms(warm_steps['other'])}"))
    out += [_table(table), ""]
    out += [
        f"By hand (plain processes, fresh HOME, no pip cache), median of {runs}, per phase: "
        + ", ".join(PLAIN_PHASES)
        + " (`python3 -m venv`, ensurepip included); graded by the executor's grader. Beside it, not in the "
        "total: `python3 -m venv --without-pip --system-site-packages`, the venv the executor writes.",
        "",
    ]
    table = [("task", "run", *PLAIN_PHASES, "total", "resolved", "venv --without-pip")]
    for name, task in figures["tasks"].items():
        for run in RUNS:
            r = task[run]
            phases = r["plain_phases_ms_median"]
            table.append((name, run, *(_ms(phases[p]) for p in PLAIN_PHASES), _ms(r["plain_ms_median"]),
                          " ".join(str(p["resolved"]) for p in r["plain"]), _ms(phases["venv_pipless"])))  # fmt: skip
    out += [_table(table), ""]
    out += [
        f"The executor against by hand (medians of {runs}); executor's share = (executor - by hand) / executor. "
        "Cold: the cold gold evaluation against the whole by-hand run, and against it with the pip-less venv in place of "
        '`python3 -m venv` ("pip-less"). Warm: the warm evaluation against by hand without venv and '
        "install (clone + apply + test).",
        "",
    ]
    table = [("task", "run", "executor cold", "by hand (all)", "share cold", "by hand pip-less", "share cold pip-less",
              "executor warm", "by hand (clone+apply+test)", "share warm")]  # fmt: skip
    for name, task in figures["tasks"].items():
        for run in RUNS:
            r = task[run]
            cold_cells = (
                (
                    _ms(r["cold_duration_ms_median"]),
                    _ms(r["plain_ms_median"]),
                    _pct(r["share_cold"]),
                    _ms(r["plain_pipless_ms_median"]),
                    _pct(r["share_cold_pipless"]),
                )
                if run == "gold"
                else ("-", _ms(r["plain_ms_median"]), "-", _ms(r["plain_pipless_ms_median"]), "-")
            )
            table.append((name, run, *cold_cells, _ms(r["warm_duration_ms_median"]), _ms(r["plain_warm_ms_median"]),
                          _pct(r["share_warm"])))  # fmt: skip
    out.append(_table(table))
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="warm --verify passes, imports and by-hand repeats")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    info = machine()
    python = executor_python()
    print(f"machine: {info['nproc']} CPUs ({cpu_model()}), {info['ram']} RAM, Linux {info['kernel']}, "
          f"Python {info['python']}; commit {info['commit']}; load {info['load']}; the tasks' python "
          f"{python.path} ({python.version})", flush=True)  # fmt: skip
    started = time.monotonic()
    with bench_folder() as root:
        (root / "www").mkdir()
        with TestHTTPServer(root / "www") as server:
            rows = make_rows(Instances(root / "www", root / "repos"))
            path = write_jsonl(root / "rows.jsonl", rows)
            specs = root / "specs.json"
            specs.write_text(json.dumps({f"bench/calc-{n}": {VERSION: SPEC} for n in range(ROWS)}))
            template = server.url("/{repo}.git")
            out = root / "out"
            imports, colds, warm, stored, rows_info = [], [], [], {}, {}
            for number in range(args.runs):  # each on a data folder of its own: an empty workspace cache
                cli = EvaluateCli(root / f"cli-{number}", EGRESS_ALLOW=",".join(REGISTRIES)).migrate()
                try:
                    imports.append(timed_import(cli, path, root / f"import-{number}", template, specs))
                    colds.append(verify_pass(cli, path, out, template, specs, f"cold {number + 1}"))
                    if number == args.runs - 1:
                        warm += [
                            verify_pass(cli, path, out, template, specs, f"warm {n + 1}") for n in range(args.runs)
                        ]
                    stored |= stored_evaluations(cli)
                    rows_info |= evaluation_rows(cli)
                finally:
                    cli.close()
            plain: dict[tuple[str, str], list[PlainRun]] = {}
            for number in range(args.runs):
                for row in rows:
                    url = template.replace("{repo}", row["repo"])
                    for run in RUNS:
                        work = root / f"hand-{row['instance_id']}-{run}-{number}"
                        result = by_hand(out / row["instance_id"], row, url, work, python.path, gold=run == "gold")
                        plain.setdefault((row["instance_id"], run), []).append(result)
                        shutil.rmtree(work, ignore_errors=True)
                print(f"  by hand {number + 1}/{args.runs} (load {load_average()})", file=sys.stderr, flush=True)
    figures = figures_of(imports, colds, warm, stored, rows_info, plain)
    figures["machine"] = info
    if args.json:  # first: the figures outlive a report that fails
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    print(report(figures, args.runs))
    print(f"\nload average at the end {load_average()}; bench took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
