"""``bench/run [--quick] [--only SECTION,...] [--json FILE] [--wait-idle]``: the executor's overhead, in one table.

Every figure is measured in this run, beside its baseline, on this machine:

- latency    one trivial evaluation, POST to its end as a client following its event stream sees
             it (and as one polling every 50 ms does, a figure that moves in 50 ms steps)
             vs bench/baseline.sh doing the same download, clone, agent and tests;
- throughput 200 evaluations at MAX_CONCURRENT_EVALS=2 and 4 vs the script under xargs -P 2 / -P 4,
             and the CPU one evaluation cost in each (bench/cpu.py; the script's: all it started);
- spawner    one command through the spawner (no sandbox, bubblewrap) vs subprocess.run;
- http       GET /evaluate/{id}, POST /evaluate admitted and refused, 32 clients, gunicorn as
             bin/serve starts it, vs a minimal WSGI app under the same gunicorn;
- memory     the service's peak memory while an agent writes 1 GB, and the psutil monitor's CPU; the
             service runs from a venv of requirements.txt alone (what bin/serve installs: made once,
             common.service_python), and again from this .venv, where the test tools are installed too;
- sandboxes  (only when named in --only) live sandboxes, ``python -m bench.sandboxes`` in a process of
             its own: create from a warm image vs ``podman run -d``, an exec round trip vs ``podman
             exec``, memory per idle sandbox vs per idle container, execs at concurrency 4.

Traffic goes only to 127.0.0.1; every load is bounded in time or count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench import e2e, http, memory, sandboxes
from bench.common import PROJECT, bench_folder, load_average, machine, service_python, trivial_task

SECTIONS = ("latency", "throughput", "spawner", "http", "memory")
OPTIONAL = ("sandboxes",)  # run only when --only names them (a registry, podman, several minutes)
FULL = {"latency_runs": 30, "throughput_count": 200, "spawner_runs": 200, "http_secs": 8.0,
        "sandboxes": ["--runs", "30", "--idle", "100", "--podman-idle", "100", "--execs", "200"]}  # fmt: skip
QUICK = {"latency_runs": 10, "throughput_count": 40, "spawner_runs": 50, "http_secs": 3.0,
         "sandboxes": ["--runs", "10", "--idle", "20", "--podman-idle", "20", "--execs", "50"]}  # fmt: skip
MB = 1024 * 1024


def cpu_idle_fraction(seconds: float = 1.0) -> float:
    def read() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        return values[3] + values[4], sum(values)  # idle + iowait, total

    idle0, total0 = read()
    time.sleep(seconds)
    idle1, total1 = read()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_idle(limit_secs: float = 900) -> None:
    """Until the CPUs have been at least 85 % idle for 3 s in a row (other work on the machine skews figures)."""
    deadline = time.monotonic() + limit_secs
    quiet = 0
    while quiet < 3 and time.monotonic() < deadline:
        quiet = quiet + 1 if cpu_idle_fraction() >= 0.85 else 0
    if quiet < 3:
        print(f"  (the machine did not go quiet within {limit_secs:.0f} s; measuring anyway)", file=sys.stderr)


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, str, str, str, str]] = []

    def add(self, figure: str, executor: str, baseline: str, ratio: str = "", target: str = "", verdict: str = ""):
        self.rows.append((figure, executor, baseline, ratio, target, verdict))

    def render(self) -> str:
        header = ("figure", "executor", "baseline", "ratio", "target", "")
        rows = [header, *self.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = []
        for number, row in enumerate(rows):
            lines.append("| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |")
            if number == 0:
                lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
        return "\n".join(lines)


# SPEC §25: a trivial evaluation within +50 ms of the shell script (§8's 100 ms before it).
E2E_OVERHEAD_SECS = 0.05


def ok(condition: bool) -> str:
    return "ok" if condition else "MISS"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def report_latency(table: Table, figures: dict) -> None:
    n = figures["runs"]
    for key in ("p50", "p95"):
        executor, baseline = figures[f"executor_{key}"], figures[f"baseline_{key}"]
        overhead = executor - baseline
        target = f"overhead <= {E2E_OVERHEAD_SECS * 1000:.0f} ms" if key == "p50" else ""
        verdict = f"+{overhead * 1000:.0f} ms"
        if key == "p50":
            verdict = f"{ok(overhead <= E2E_OVERHEAD_SECS)} ({verdict})"
        table.add(
            f"e2e latency {key}, event stream (n={n})",
            ms(executor),
            ms(baseline),
            f"{executor / baseline:.2f}x",
            target,
            verdict,
        )
    for key in ("p50", "p95"):
        polled, baseline = figures[f"polled_{key}"], figures[f"baseline_{key}"]
        table.add(
            f"  e2e latency {key}, polling every 50 ms (n={n})",
            ms(polled),
            ms(baseline),
            f"{polled / baseline:.2f}x",
            "",
            f"+{(polled - baseline) * 1000:.0f} ms (50 ms steps)",
        )
    table.add(
        f"  server side p50 (created_at to finished_at, n={n})",
        ms(figures["server_p50"]),
        ms(figures["baseline_p50"]),
        f"{figures['server_p50'] / figures['baseline_p50']:.2f}x",
        "",
        f"+{(figures['server_p50'] - figures['baseline_p50']) * 1000:.0f} ms",
    )


def report_throughput(table: Table, figures: dict) -> None:
    ratio = figures["executor"] / figures["baseline"]
    table.add(
        f"throughput, {figures['count']} evals, concurrency {figures['concurrency']}",
        f"{figures['executor']:.2f} evals/s",
        f"{figures['baseline']:.2f} evals/s",
        f"{ratio * 100:.0f} %",
        ">= 85 % of baseline",
        ok(ratio >= 0.85),
    )
    if "executor_cpu_ms" in figures:  # the reason: CPU an evaluation, the machine's CPUs kept busy (bench/cpu.py)
        split = figures["executor_cpu_ms"]
        total = sum(split.values())
        parts = ", ".join(f"{kind} {split[kind]:.0f}" for kind in ("evaluations", "worker", "web") if kind in split)
        table.add(
            f"  CPU an evaluation, concurrency {figures['concurrency']}",
            f"{total:.0f} ms ({parts})",
            f"{figures['baseline_cpu_ms']:.0f} ms",
            f"{total / figures['baseline_cpu_ms']:.2f}x",
        )


def report_spawner(table: Table, figures: dict) -> None:
    plain = figures["plain"]
    for key, name in (
        ("spawner_none", "no sandbox"),
        ("spawner_bwrap", "bubblewrap"),
        ("spawner_phase", "an exec in a phase's sandbox"),
    ):
        if key in figures:
            extra = figures[key] - plain
            table.add(
                f"spawner, one command ({name})",
                f"{figures[key]:.1f} ms",
                f"{plain:.2f} ms",
                f"+{extra:.1f} ms",
                "<= +5 ms",
                ok(extra <= 5),
            )
    if "sweep" in figures:
        table.add(
            f"kill sweep, nothing left ({figures['processes']} processes on the host)",
            f"{figures['sweep']:.1f} ms",
            "0 (none)",
            "",
            "",
            "6 per evaluation without the sandbox, none with it",
        )
    if "bwrap_bare" in figures:
        table.add(
            "  of which bwrap itself (same argv, no spawner)",
            f"{figures['bwrap_bare']:.1f} ms",
            f"{plain:.2f} ms",
            f"+{figures['bwrap_bare'] - plain:.1f} ms",
        )


def report_http(table: Table, figures: dict, hello: dict) -> None:
    for key, name, target_rate, base in (
        ("get", "GET /evaluate/{id}", 1000, "get"),
        ("post_accepted", "POST /evaluate, admitted (202)", 400, "post"),
        ("post_refused", "POST /evaluate, refused (503)", 400, "post"),
    ):
        result, baseline = figures[key], hello[base]
        p99 = result.p(0.99)
        table.add(
            f"{name}, 32 clients",
            f"{result.rate:.0f} req/s, p50 {ms(result.p(0.5))}, p99 {ms(p99)}",
            f"{baseline.rate:.0f} req/s, p50 {ms(baseline.p(0.5))}, p99 {ms(baseline.p(0.99))}",
            f"{result.rate / baseline.rate * 100:.0f} %",
            f">= {target_rate} req/s, p99 < 50 ms",
            ok(result.rate >= target_rate and p99 < 0.05),
        )
        table.add(
            "  server CPU per request",
            f"{result.server_cpu_secs / result.requests * 1000:.2f} ms",
            f"{baseline.server_cpu_secs / baseline.requests * 1000:.2f} ms",
        )


def report_memory(table: Table, figures: dict, dev: dict) -> None:
    for kind in ("rss", "pss"):
        peak, idle = figures[f"peak_{kind}"], figures[f"idle_{kind}"]
        table.add(
            f"service peak {kind.upper()}, agent writing 1 GB",
            f"{peak / MB:.0f} MB",
            f"{idle / MB:.0f} MB idle",
            f"{peak / idle:.2f}x",
            "< 150 MB",
            ok(peak < 150 * MB),
        )
    table.add(
        "the same PSS from this .venv (test tools installed)",
        f"{dev['peak_pss'] / MB:.0f} MB",
        f"{dev['idle_pss'] / MB:.0f} MB idle",
        f"{dev['peak_pss'] / dev['idle_pss']:.2f}x",
    )
    for label, run in (("requirements.txt alone", figures), ("this .venv", dev)):
        print(f"service from {label}:", file=sys.stderr)
        print(memory.breakdown_table(run["idle_breakdown"], run["peak_breakdown"]), file=sys.stderr, flush=True)
    for key, name in (("monitor_cpu_sleeper", "agent sleeping"), ("monitor_cpu_flood", "agent writing 1 GB")):
        table.add(
            f"monitor CPU per evaluation-second ({name})",
            f"{figures[key] * 1000:.1f} ms/s",
            "0 (no monitor)",
            f"{figures[key] * 100:.1f} % of a core",
        )


def run_sandboxes(root, arguments: list[str]) -> dict:
    """``python -m bench.sandboxes`` in a process of its own (its own service, registry and podman
    store); its figures from its --json, its own tables on stderr."""
    out = root / "sandboxes.json"
    subprocess.run(
        [sys.executable, "-m", "bench.sandboxes", *arguments, "--json", str(out)],
        cwd=PROJECT,
        stdout=sys.stderr,
        check=True,
    )
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and shorter loads (about a minute)")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS + OPTIONAL)}"
    )
    parser.add_argument("--json", help="also write every raw figure to this file")
    parser.add_argument("--wait-idle", action="store_true", help="before each section, wait until the CPUs are idle")
    args = parser.parse_args()
    sections = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(sections) - set(SECTIONS + OPTIONAL)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    plan = QUICK if args.quick else FULL
    info = machine()
    print(
        f"machine: {info['nproc']} CPUs, {info['ram']} RAM, Linux {info['kernel']}, Python {info['python']}; "
        f"commit {info['commit']}",
        flush=True,
    )
    table, raw, loads = Table(), {"machine": info, "plan": plan}, []
    started = time.monotonic()
    with bench_folder() as root, trivial_task(root) as task:
        for section in sections:
            if args.wait_idle:
                wait_idle()
            loads.append(f"{section} {load_average()}")
            print(
                f"[{time.monotonic() - started:5.0f} s] {section} (load {load_average()})", file=sys.stderr, flush=True
            )
            if section == "latency":
                raw[section] = e2e.latency(root, task, plan["latency_runs"])
                report_latency(table, raw[section])
            elif section == "throughput":
                raw[section] = []
                for concurrency in (2, 4):
                    figures = e2e.throughput(root, task, plan["throughput_count"], concurrency)
                    raw[section].append(figures)
                    report_throughput(table, figures)
            elif section == "spawner":
                done = subprocess.run(
                    [sys.executable, "-m", "bench.spawner", str(plan["spawner_runs"])],
                    cwd=PROJECT,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                raw[section] = json.loads(done.stdout)
                report_spawner(table, raw[section])
            elif section == "http":
                hello = http.hello_load(root, plan["http_secs"])
                figures = http.http_load(root, task, plan["http_secs"])
                raw[section] = {name: vars(r) | {"latencies": None} for name, r in {**figures}.items()}
                raw["http_baseline"] = {name: vars(r) | {"latencies": None} for name, r in hello.items()}
                report_http(table, figures, hello)
            elif section == "memory":
                raw[section] = memory.memory_and_monitor(root, task, service_python())
                raw["memory_dev_venv"] = memory.memory_and_monitor(
                    root, task, sys.executable, "memory-dev", monitor=False
                )
                report_memory(table, raw[section], raw["memory_dev_venv"])
            elif section == "sandboxes":
                raw[section] = run_sandboxes(root, plan["sandboxes"])
                for row in sandboxes.rows(raw[section]):
                    table.add(*row)
    print(table.render())
    if "latency" in raw:
        steps = ", ".join(f"{name} {value} ms" for name, value in raw["latency"]["steps_ms"].items())
        print(f"\nexecutor step medians (from the stored transitions): {steps}")
    print(f"\nload average (1, 5, 15 min) as each section started: {'; '.join(loads)}; at the end {load_average()}")
    print(f"bench took {time.monotonic() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(raw | {"loads": loads, "table": table.rows}, out, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
