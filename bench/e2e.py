"""End-to-end: one trivial evaluation's latency, and the throughput of many, against the shell baseline.

Latency: POST, then the evaluation's event stream (SPEC §18) until its ``done``
event, as a platform client that waits for the result does; and, alternately,
POST then GET every 50 ms until a terminal status, as a polling client would.
The baseline is one run of ``baseline.sh``. Runs alternate (baseline, streamed,
polled, baseline, ...) so that a change of load on the machine hits every side
alike. The polling client's figure moves in 50 ms steps (it sees the end at its
next poll: 150 or 200 ms, whatever the evaluation took in between), so the
target is judged on the streamed figure; the row's own ``created_at`` to
``finished_at`` is reported beside both.

Throughput: N evaluations posted at once to a worker with
MAX_CONCURRENT_EVALS=c, timed from the first POST to the moment the client
sees the last one end (``/status`` polled every 0.2 s); the baseline is the
same N runs of ``baseline.sh`` through ``xargs -P c``. Beside each rate, the CPU
one evaluation cost (bench/cpu.py; the script's: every process it started):
with the machine's CPUs busy, the rate follows from it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from bench import cpu
from bench.common import BASELINE, TERMINAL, Task, get_json, live_service, percentile, run_baseline, submit

POLL_SECS = 0.05


def wait_terminal(port: int, eval_id: str, started: float, timeout: float = 120) -> dict:
    """GET the evaluation on a 50 ms grid counted from ``started`` until it has ended."""
    tick = 1
    while True:
        delay = started + tick * POLL_SECS - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        tick += 1
        body = get_json(port, f"/evaluate/{eval_id}")[1]
        if body["status"] in TERMINAL:
            return body
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"evaluation {eval_id} did not end within {timeout} s: {body['step']}")


def one_streamed(port: int, task: Task) -> tuple[float, dict]:
    """POST, then follow its event stream until ``done`` (the evaluation object): seconds, and that object."""
    import httpx
    from httpx_sse import connect_sse

    started = time.perf_counter()
    eval_id = submit(port, task)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        with connect_sse(client, "GET", f"/evaluate/{eval_id}/events") as source:
            for event in source.iter_sse():
                if event.event == "done":
                    elapsed = time.perf_counter() - started
                    body = json.loads(event.data)
                    break
            else:
                raise RuntimeError(f"the event stream of {eval_id} ended without its done event")
    if body["status"] != "completed":
        raise RuntimeError(f"bench evaluation {eval_id} ended {body['status']}: {body['error']}")
    return elapsed, body


def one_evaluation(port: int, task: Task) -> tuple[float, dict]:
    started = time.perf_counter()
    eval_id = submit(port, task)
    body = wait_terminal(port, eval_id, started)
    elapsed = time.perf_counter() - started
    if body["status"] != "completed":
        raise RuntimeError(f"bench evaluation {eval_id} ended {body['status']}: {body['error']}")
    return elapsed, body


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def step_times(bodies: list[dict]) -> dict[str, float]:
    """Median milliseconds each step took (from the stored transitions), for the breakdown."""
    per_step: dict[str, list[int]] = {}
    for body in bodies:
        for transition in body["transitions"]:
            if transition["duration_ms"] is not None:
                name = f"{transition['step']}/{transition['status']}"
                per_step.setdefault(name, []).append(transition["duration_ms"])
    return {name: percentile(values, 0.5) for name, values in per_step.items()}


def latency(root: Path, task: Task, runs: int) -> dict:
    with live_service(root, "latency", worker=True, MAX_CONCURRENT_EVALS=2) as service:
        one_evaluation(service.port, task)  # warm: forkserver started, pages cached
        one_streamed(service.port, task)
        run_baseline(task)
        streamed, polled, baseline, bodies = [], [], [], []
        for _ in range(runs):
            baseline.append(run_baseline(task))
            elapsed, body = one_streamed(service.port, task)
            streamed.append(elapsed)
            bodies.append(body)
            elapsed, body = one_evaluation(service.port, task)
            polled.append(elapsed)
            bodies.append(body)
    server = [_seconds(body["created_at"], body["finished_at"]) for body in bodies]
    return {
        "runs": runs,
        "server_p50": percentile(server, 0.5),
        "executor_p50": percentile(streamed, 0.5),
        "executor_p95": percentile(streamed, 0.95),
        "polled_p50": percentile(polled, 0.5),
        "polled_p95": percentile(polled, 0.95),
        "baseline_p50": percentile(baseline, 0.5),
        "baseline_p95": percentile(baseline, 0.95),
        "steps_ms": step_times(bodies),
    }


def executor_throughput(root: Path, task: Task, count: int, concurrency: int) -> tuple[float, dict[str, float]]:
    """Evaluations per second: `count` posted at once, until the client sees the last one end; and
    the service's CPU per evaluation meanwhile, by kind (bench/cpu.py)."""
    with live_service(
        root, f"throughput{concurrency}", worker=True, MAX_CONCURRENT_EVALS=concurrency, MAX_QUEUED_EVALS=count
    ) as service:
        port = service.port
        before = cpu.snapshot(os.getpid())
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda _: submit(port, task), range(count)))
        while True:
            status = get_json(port, "/status")[1]
            if status["passed"] + status["failed"] + status["cancelled"] >= count:
                break
            time.sleep(0.2)
        elapsed = time.perf_counter() - started
        spent = cpu.spent(before, cpu.snapshot(os.getpid()))
        if status["passed"] != count:
            failed = get_json(port, f"/evaluate/{ids[0]}")[1]
            raise RuntimeError(f"{count - status['passed']} bench evaluations did not pass: {failed['error']}")
    return count / elapsed, {kind: ms / count for kind, ms in spent.items()}


def baseline_throughput(task: Task, count: int, concurrency: int) -> tuple[float, float]:
    """Runs per second of the script through ``xargs -P``, and the CPU of one run (every process it
    started, all waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        ["xargs", "-P", str(concurrency), "-I", "{}", "bash", str(BASELINE), task.url, str(task.agent_file)],
        input="".join(f"{n}\n" for n in range(count)),
        text=True,
        check=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return count / elapsed, used * 1000 / count


def throughput(root: Path, task: Task, count: int, concurrency: int) -> dict:
    baseline, baseline_cpu = baseline_throughput(task, count, concurrency)
    executor, executor_cpu = executor_throughput(root, task, count, concurrency)
    return {
        "count": count,
        "concurrency": concurrency,
        "executor": executor,
        "baseline": baseline,
        "executor_cpu_ms": executor_cpu,
        "baseline_cpu_ms": baseline_cpu,
    }
