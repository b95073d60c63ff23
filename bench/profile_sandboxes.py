"""``python -m bench.profile_sandboxes [--runs N] [--json FILE]``: where a live sandbox's create, exec and delete go.

The same setup as ``bench.sandboxes`` (a registry on 127.0.0.1 serving the Debian image, the
service and its worker on SQLite with SANDBOX=bwrap), with a timing probe in every process of the
service (bench/sandbox_probe/sitecustomize.py, loaded through PYTHONPATH: the product's code is
not changed). Then, one after another and ``--runs`` times each: POST /sandboxes of the warm
image (after one create that pulls it), an exec of ``["true"]`` in that sandbox, its DELETE. For
each request, every probed call that overlaps the client's window is placed on the request's
timeline: offsets from the moment the client sent it (``time.time()``, shared by the processes).
Printed per request kind: each step's p50 start and end offsets and p50 duration, in the order
they start, and the client's own total. The probe adds a few microseconds per probed call
(about 60 calls in a create). ``--memory``: also each sandbox process's private memory as it
goes through its steps, and the modules it imports after its fork.

Traffic goes to 127.0.0.1 only; everything started stops with the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench.common import PROJECT, bench_folder, load_average, machine, percentile
from bench.images import cpu_model
from bench.sandboxes import registry_image, service

PROBE = PROJECT / "bench" / "sandbox_probe"


def read_log(path: Path) -> list[tuple[str, int, float, float]]:
    events = []
    for line in path.read_text().splitlines():
        label, pid, start, end = line.split("\t")
        events.append((label, int(pid), float(start), float(end)))
    return events


def timelines(events, windows: list[tuple[str, float, float]]) -> dict[str, dict]:
    """Per request kind: {label: {starts, ends, durations, count}} over its windows, offsets from
    each window's start; a label's first call in a window only (``count``: how many there were)."""
    kinds: dict[str, dict] = {}
    for kind, t0, t1 in windows:
        steps = kinds.setdefault(kind, {"client": [], "steps": defaultdict(lambda: defaultdict(list))})
        steps["client"].append(t1 - t0)
        seen: dict[str, int] = defaultdict(int)
        for label, _pid, start, end in sorted(events, key=lambda event: event[2]):
            if end < t0 or start > t1 or (start < t0 and end > t1):
                continue  # outside the window, or around all of it (the sandbox's life, its serve loop)
            seen[label] += 1
            if seen[label] > 1:
                continue
            step = steps["steps"][label]
            step["start"].append(start - t0)
            step["end"].append(end - t0)
            step["duration"].append(end - start)
        for label, count in seen.items():
            steps["steps"][label]["count"].append(count)
    return kinds


def report(kinds: dict[str, dict]) -> str:
    lines = []
    for kind, data in kinds.items():
        client = data["client"]
        lines.append(f"\n{kind}: client p50 {percentile(client, 0.5) * 1000:.1f} ms (n={len(client)})")
        lines.append(
            f"  {'step':48} {'in':>5} {'start':>9} {'end':>9} {'duration':>9}   (p50, ms from the client's send)"
        )
        rows = []
        for label, step in data["steps"].items():
            if len(step["start"]) < len(client) / 2:
                continue  # not part of this request (a tick, a poll that happened to overlap once)
            rows.append((
                percentile(step["start"], 0.5), label, f"{len(step['start'])}/{len(client)}",
                percentile(step["end"], 0.5), percentile(step["duration"], 0.5),
                max(step["count"]),
            ))  # fmt: skip
        for start, label, seen, end, duration, count in sorted(rows):
            more = f"  (up to {count} calls)" if count > 1 else ""
            lines.append(f"  {label:48} {seen:>5} {start * 1000:9.1f} {end * 1000:9.1f} {duration * 1000:9.1f}{more}")
    return "\n".join(lines)


def memory_report(events) -> str:
    """The sandbox processes' private memory at each checkpoint (p50, MiB), and the modules they
    imported after they were forked (those most of them imported)."""
    at: dict[tuple[str, str], list[int]] = defaultdict(list)
    modules: dict[str, int] = defaultdict(int)
    processes = set()
    for label, pid, _start, _end in events:
        if not label.startswith("mem|"):
            continue
        _, name, when, kib, _count, names = label.split("|", 5)
        at[(name, when)].append(int(kib))
        if name == "owner: serve" and when == "enter":
            processes.add(pid)
            for module in filter(None, names.split(",")):
                modules[module] += 1
    order = sorted(at, key=lambda key: percentile(at[key], 0.5))
    lines = ["\na sandbox's process, private memory (Private_Clean + Private_Dirty), p50:"]
    lines += [f"  {when:6} {name:36} {percentile(at[(name, when)], 0.5) / 1024:7.2f} MiB" for name, when in order]
    common = sorted(name for name, count in modules.items() if count >= len(processes) / 2)
    lines.append(f"modules imported after the fork, by the time it serves ({len(common)}): {', '.join(common)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="creates, execs and deletes (default 10)")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="also note each sandbox process's private memory at its steps (slows those steps: read the timings of a run without)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw timelines here")
    args = parser.parse_args(argv)
    info = machine()
    print(f"machine: {info['nproc']} CPUs ({cpu_model()}), {info['ram']} RAM, Linux {info['kernel']}, "
          f"Python {info['python']}; commit {info['commit']}; load {info['load']}", flush=True)  # fmt: skip
    windows: list[tuple[str, float, float]] = []
    with bench_folder() as root, registry_image() as (registry, ref):
        log = root / "probe.log"
        probe = {"PYTHONPATH": str(PROBE), "SANDBOX_PROBE_LOG": str(log), "SANDBOX_PROBE_MEMORY": str(int(args.memory))}
        with service(root, registry, 8, **probe) as (_live, api):
            api.delete(api.create(ref)["sandbox_id"])  # the pull
            sandbox = api.create(ref)["sandbox_id"]
            api.exec(sandbox, ["true"])
            api.delete(sandbox)
            time.sleep(1)
            for _ in range(args.runs):
                t0 = time.time()
                sandbox = api.create(ref)["sandbox_id"]
                windows.append(("POST /sandboxes (warm image) to 201", t0, time.time()))
                time.sleep(0.3)  # its record threads done, the worker back to waiting
                for _ in range(3):
                    t0 = time.time()
                    api.exec(sandbox, ["true"])
                    windows.append(("POST /sandboxes/{id}/exec of true", t0, time.time()))
                    time.sleep(0.1)
                time.sleep(0.2)
                t0 = time.time()
                api.delete(sandbox)
                windows.append(("DELETE /sandboxes/{id} to 204", t0, time.time()))
                time.sleep(0.3)
        events = read_log(log)
    kinds = timelines([event for event in events if not event[0].startswith("mem|")], windows)
    print(report(kinds))
    if args.memory:
        print(memory_report(events))
    print(f"\nload at the end {load_average()}")
    if args.json:
        args.json.write_text(json.dumps({"windows": windows, "events": events}, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
