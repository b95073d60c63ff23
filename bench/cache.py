"""``python -m bench.cache [--runs N] [--count N] [--json FILE]``: the workspace cache (issue 16).

The task is built here, realistic: a repository of 3000 commits whose base
holds a ``pyproject.toml`` depending on requests, rich and sympy (about 7000
files in the venv, from the registry), installed with ``pip install -e .``
and ``pip install pytest``; the fix is the last commit. Three figures:

1. clone + install, cold (WORKSPACE_CACHE=off) against warm (a hit), from
   the evaluations' own transitions (target: warm <= 5 % of cold);
2. a warm evaluation, POST to terminal state, against warm_baseline.sh: only
   the agent and the tests on a copy prepared once (target: +150 ms at p50);
3. evaluations per minute, ``--count`` evaluations of the task posted at
   once at MAX_CONCURRENT_EVALS=2: cold each time, then cached (an empty
   cache: the first builds, the others wait for it and start from it).

Traffic goes to 127.0.0.1 and the package registry only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import PROJECT, Task, bench_folder, get_json, live_service, machine, percentile, submit
from bench.e2e import one_evaluation
from tests.helpers.archives import write_archive
from tests.helpers.gitrepos import GIT_TEST_ENV, git, make_bare
from tests.helpers.httpserver import TestHTTPServer

WARM_BASELINE = PROJECT / "bench" / "warm_baseline.sh"
COMMITS = 3000
PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "ledger"
version = "0.1.0"
dependencies = ["requests", "rich", "sympy"]

[tool.setuptools]
packages = ["ledger"]
"""
BUGGY = "import rich, sympy\n\n\ndef total(values):\n    return sum(values) - 1\n"
FIXED = "import rich, sympy\n\n\ndef total(values):\n    return sum(values)\n"
TEST = """\
import ledger, requests, sympy

def test_total():
    assert ledger.total([1, 2, 3]) == 6

def test_dependencies():
    assert sympy.Integer(2) ** 10 == 1024 and requests.__version__
"""
SOLVER = """\
import pathlib
f = pathlib.Path('ledger/__init__.py')
f.write_text(f.read_text().replace('sum(values) - 1', 'sum(values)'))
"""
INSTALL = ["pip install -e .", "pip install pytest"]


def _repository(work: Path) -> tuple[str, str]:
    """COMMITS commits through git fast-import (seconds, not minutes); returns (base, fix)."""
    work.mkdir(parents=True)
    git(work, "init", "--quiet", "-b", "main")
    stream = []
    for number in range(1, COMMITS + 1):
        files = {f"history/{number % 50:02d}.txt": f"entry {number}\n"}
        if number == 1:
            files.update({"pyproject.toml": PYPROJECT, "ledger/__init__.py": BUGGY, "test_ledger.py": TEST})
        if number == COMMITS:
            files = {"ledger/__init__.py": FIXED}
        message = f"commit {number}"
        stream.append(f"commit refs/heads/main\nmark :{number}\ncommitter B <b@x> {1700000000 + number} +0000\n")
        stream.append(f"data {len(message)}\n{message}\n")
        if number > 1:
            stream.append(f"from :{number - 1}\n")
        for path, text in files.items():
            data = text.encode()
            stream.append(f"M 644 inline {path}\ndata {len(data)}\n{text}\n")
    subprocess.run(
        ["git", "fast-import", "--quiet"], cwd=work, input="".join(stream), text=True, check=True, env=GIT_TEST_ENV
    )
    git(work, "checkout", "--quiet", "main")
    return git(work, "rev-parse", "HEAD~1"), git(work, "rev-parse", "HEAD")


@contextlib.contextmanager
def realistic_task(root: Path) -> Iterator[Task]:
    www = root / "www"
    www.mkdir()
    base, _fix = _repository(root / "work" / "ledger")
    make_bare(root / "work" / "ledger", www / "ledger.git")
    agent_file = root / "agent.py"
    agent_file.write_text(SOLVER)
    with TestHTTPServer(www) as server:
        url = server.url("/ledger.git")
        yaml = f"repo: {url}\nbase_commit: {base}\ninstall:\n" + "".join(f"  - {c}\n" for c in INSTALL)
        tests = {"tests/fail_to_pass_total.sh": "pytest -q -p no:cacheprovider test_ledger.py\n"}
        files = {"workspace.yaml": yaml, "prompt.md": "Fix total().\n", **tests}
        write_archive(www / "task.tar.gz", files, "tar.gz", top="task")
        yield Task(url=server.url("/task.tar.gz"), agent_code=SOLVER, agent_file=agent_file)


def _step_ms(body: dict, step: str) -> int:
    return next(t["duration_ms"] for t in body["transitions"] if t["step"] == step)


def _clone_install_secs(body: dict) -> float:
    return (_step_ms(body, "cloning_repo") + _step_ms(body, "installing_deps")) / 1000


def clone_install(root: Path, task: Task, runs: int) -> dict:
    cold, warm = [], []
    with live_service(root, "cold", worker=True, WORKSPACE_CACHE="off", INSTALL_TIMEOUT_SECS=900) as service:
        for _ in range(max(2, runs // 3)):
            cold.append(_clone_install_secs(one_evaluation_slow(service.port, task)))
    with live_service(root, "warm", worker=True, INSTALL_TIMEOUT_SECS=900) as service:
        first = one_evaluation_slow(service.port, task)
        assert first["cache"] == "miss", first["cache"]
        for _ in range(runs):
            body = one_evaluation_slow(service.port, task)
            assert body["cache"] == "hit", body["cache"]
            warm.append(_clone_install_secs(body))
    return {
        "cold_p50": percentile(cold, 0.5),
        "warm_p50": percentile(warm, 0.5),
        "first_miss": _clone_install_secs(first),
        "cold": cold,
        "warm": warm,
    }


def one_evaluation_slow(port: int, task: Task) -> dict:
    eval_id = submit(port, task)
    while True:
        body = get_json(port, f"/evaluate/{eval_id}")[1]
        if body["status"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.2)
    if body["status"] != "completed":
        raise RuntimeError(f"bench evaluation ended {body['status']}: {body['error']}")
    return body


def _prepare_copy(root: Path, task: Task) -> Path:
    """What warm_baseline.sh runs on: the task, the repository at its base and the install done, once."""
    prepared = root / "prepared"
    prepared.mkdir()
    script = (
        'set -e; export PATH=/usr/local/bin:/usr/bin:/bin; cd "$1"; curl -sSf "$2" | tar -xzf -\n'
        "repo=$(sed -n 's/^repo: *//p' task/workspace.yaml); base=$(sed -n 's/^base_commit: *//p' task/workspace.yaml)\n"
        'git clone --quiet --no-checkout -- "$repo" repo; git -C repo -c advice.detachedHead=false checkout -q --detach "$base"\n'
        "python3 -m venv --without-pip --system-site-packages venv; mkdir home; export HOME=$PWD/home\n"
        "cd repo; ../venv/bin/python3 -m pip install -q -e .; ../venv/bin/python3 -m pip install -q pytest\n"
    )
    done = subprocess.run(["bash", "-c", script, "prepare", str(prepared), task.url], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"preparing the baseline's copy failed: {done.stderr[-1000:]}")
    return prepared


def latency(root: Path, task: Task, runs: int) -> dict:
    prepared = _prepare_copy(root, task)

    def baseline() -> float:
        started = time.perf_counter()
        done = subprocess.run(["bash", str(WARM_BASELINE), str(prepared), str(task.agent_file)], capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"warm_baseline.sh failed: {done.stderr[-500:]!r}")
        return time.perf_counter() - started

    executor, base, steps = [], [], []
    with live_service(root, "latency", worker=True, MAX_CONCURRENT_EVALS=2, INSTALL_TIMEOUT_SECS=900) as service:
        one_evaluation_slow(service.port, task)  # the build
        one_evaluation(service.port, task)  # forkserver started, pages cached
        baseline()
        for _ in range(runs):
            base.append(baseline())
            elapsed, body = one_evaluation(service.port, task)
            assert body["cache"] == "hit"
            executor.append(elapsed)
            steps.append({t["step"]: t["duration_ms"] for t in body["transitions"] if t["duration_ms"] is not None})
    return {
        "executor_p50": percentile(executor, 0.5),
        "baseline_p50": percentile(base, 0.5),
        "steps_ms_p50": {name: percentile([s[name] for s in steps], 0.5) for name in steps[0]},
    }


def per_minute(root: Path, task: Task, count: int, cache: str) -> float:
    with live_service(
        root, f"rate-{cache}", worker=True, MAX_CONCURRENT_EVALS=2, MAX_QUEUED_EVALS=count,
        WORKSPACE_CACHE=cache, INSTALL_TIMEOUT_SECS=900, SESSION_TTL_SECS=7200,
    ) as service:  # fmt: skip
        started = time.perf_counter()
        ids = [submit(service.port, task) for _ in range(count)]
        while True:
            status = get_json(service.port, "/status")[1]
            if status["passed"] + status["failed"] + status["cancelled"] >= count:
                break
            time.sleep(0.5)
        elapsed = time.perf_counter() - started
        if status["passed"] != count:
            failed = get_json(service.port, f"/evaluate/{ids[-1]}")[1]
            raise RuntimeError(f"{count - status['passed']} evaluations did not pass: {failed['error']}")
    return count / elapsed * 60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="warm evaluations per figure (default 9)")
    parser.add_argument("--count", type=int, default=20, help="evaluations per throughput run (default 20)")
    parser.add_argument("--only", default="clone,latency,rate", help="any of clone,latency,rate")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    figures: dict = {"machine": machine()}
    with bench_folder() as root, realistic_task(root) as task:
        if "clone" in only:
            figures["clone_install"] = clone_install(root, task, args.runs)
            c = figures["clone_install"]
            print(f"clone+install p50: cold {c['cold_p50']:.2f} s, warm {c['warm_p50']:.3f} s "
                  f"({100 * c['warm_p50'] / c['cold_p50']:.1f} %); the building miss {c['first_miss']:.2f} s", flush=True)  # fmt: skip
        if "latency" in only:
            figures["latency"] = lat = latency(root, task, args.runs)
            print(f"warm evaluation p50 {lat['executor_p50'] * 1000:.0f} ms, warm_baseline.sh "
                  f"{lat['baseline_p50'] * 1000:.0f} ms (+{(lat['executor_p50'] - lat['baseline_p50']) * 1000:.0f} ms); "
                  f"steps {lat['steps_ms_p50']}", flush=True)  # fmt: skip
        if "rate" in only:
            cold = per_minute(root, task, args.count, "off")
            cached = per_minute(root, task, args.count, "on")
            figures["per_minute"] = {"count": args.count, "cold": cold, "cached": cached}
            print(f"{args.count} evaluations at MAX_CONCURRENT_EVALS=2: cold {cold:.1f}/min, cached {cached:.1f}/min")
    figures["machine"]["load_after"] = machine()["load"]
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
