"""The service's memory while an agent writes 1 GB of output, and what the psutil monitor costs.

The service is every process ``bin/serve`` starts, its commands left out:
``manage.py serve`` itself (started here exactly so), the gunicorn master and
its workers, the worker, its forkserver (and multiprocessing's resource tracker,
were one to start: the pool runs without), and the evaluation processes the
forkserver forks (the spare among them: evaluations/worker/pool.py). They are sampled every
50 ms from /proc/PID/smaps_rollup; the figure is the peak of their sum, as RSS
(pages shared between forked processes counted once per process) and as PSS
(each shared page split among its sharers: the memory the service really
holds). The table printed on stderr gives each process's RSS, PSS and private
memory (USS) idle and at the sample of the peak PSS.

The monitor is the thread the spawner runs beside every command. An
evaluation process has two other threads, its main one, which waits on the
command's output, and a watcher of its row; so the CPU time of the process
minus theirs is the monitors'. It is read while an agent sleeps for a few
seconds (the steady cost per evaluation-second) and during the flood.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.common import Task, live_service, submit
from bench.e2e import wait_terminal
from tests.helpers.tasks import SOLVER

FLOOD_BYTES = 1 << 30
FLOOD_AGENT = SOLVER + (
    "import sys\n"
    "chunk = b'x' * (1 << 20)\n"
    f"for _ in range({FLOOD_BYTES} >> 20):\n"
    "    sys.stdout.buffer.write(chunk)\n"
    "sys.stdout.buffer.flush()\n"
)
SLEEP_SECS = 5
SLEEPER_AGENT = SOLVER + f"import time\ntime.sleep({SLEEP_SECS})\n"
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(stat_path: str) -> int:
    with open(stat_path) as stat:
        fields = stat.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _monitor_ticks(pid: int) -> int:
    """CPU ticks of the evaluation process's monitor threads, the dead ones included.

    The process total counts every thread it ever had; minus the main thread and
    the row watcher (child.py; started first, so the lowest thread id after the
    main one), what is left is the monitors', one per command.
    """
    threads = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    others = [tid for tid in threads if tid != pid][:1]
    total = _cpu_ticks(f"/proc/{pid}/stat")
    return total - sum(_cpu_ticks(f"/proc/{pid}/task/{tid}/stat") for tid in [pid, *others])


def _rollup(pid: int) -> dict[str, int]:
    """RSS, PSS and private memory (USS) of a process, in bytes, from /proc/PID/smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0]) * 1024
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "uss": fields["Private_Clean"] + fields["Private_Dirty"],
    }


def _role(proc: psutil.Process, parent_role: str | None) -> str:
    """What a process of the service is, from its parent's role, its name and its command line."""
    if parent_role == "forkserver":  # the spare waits for an id: no evaluation's life yet (monitor CPU)
        return "spare" if proc.name() == "te-spare" else "evaluation"
    if parent_role == "gunicorn master":
        return "web worker"
    comm = proc.name()
    named = {
        "te-serve": "serve",
        "te-gunicorn": "gunicorn master",
        "te-worker": "worker",
        "te-forkserver": "forkserver",
    }
    if comm in named:
        return named[comm]
    cmdline = " ".join(proc.cmdline())
    for needle, role in (
        # serve after its exec, before it names itself (its argv names its children: first)
        ("executor_project import supervisor", "serve"),
        ("resource_tracker", "resource tracker"),
        ("forkserver", "forkserver"),
        ("gunicorn", "gunicorn master"),
        ("run_worker", "worker"),
        ("manage.py serve", "serve"),
    ):
        if needle in cmdline:
            return role
    return comm


def service_processes(roots: list[int]) -> list[tuple[str, psutil.Process]]:
    """(role, process) for every process of the service below and including ``roots``; commands left out."""
    found: list[tuple[str, psutil.Process]] = []
    todo: list[tuple[psutil.Process, str | None]] = [(psutil.Process(pid), None) for pid in roots]
    while todo:
        proc, parent_role = todo.pop(0)
        role = _role(proc, parent_role)
        found.append((role, proc))
        if role != "evaluation":  # an evaluation process's children are its commands: not the service
            todo.extend((child, role) for child in proc.children())
    return found


@dataclass
class Sampler:
    """Samples the service's processes every 50 ms in a thread."""

    roots: list[int]
    peak_rss: int = 0
    peak_pss: int = 0
    first_rss: int = 0
    first_pss: int = 0
    # [(role, pid, rss, pss, uss)] at the first sample and at the sample of the peak PSS
    first_breakdown: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    peak_breakdown: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    # evaluation pid -> (first seen, last seen, monitor CPU seconds at the last sample)
    evaluations: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        try:
            service = service_processes(self.roots)
        except psutil.NoSuchProcess:
            return
        rss = pss = 0
        breakdown = []
        for role, proc in service:
            try:
                memory = _rollup(proc.pid)
            except (OSError, KeyError):
                continue
            rss += memory["rss"]
            pss += memory["pss"]
            breakdown.append((role, proc.pid, memory["rss"], memory["pss"], memory["uss"]))
        if not self.first_rss:
            self.first_rss, self.first_pss, self.first_breakdown = rss, pss, breakdown
        self.peak_rss = max(self.peak_rss, rss)
        if pss > self.peak_pss:
            self.peak_pss, self.peak_breakdown = pss, breakdown
        now = time.perf_counter()
        for role, proc in service:
            if role != "evaluation":
                continue
            try:
                monitor = _monitor_ticks(proc.pid)
            except OSError:
                continue
            first = self.evaluations.get(proc.pid, (now, now, 0.0))[0]
            self.evaluations[proc.pid] = (first, now, monitor / _TICKS)

    def run(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def __enter__(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def monitor_cpu_per_second(self) -> float:
        """Monitor CPU seconds per second of evaluation process life, over every evaluation seen."""
        cpu = sum(value for _first, _last, value in self.evaluations.values())
        seconds = sum(last - first for first, last, _value in self.evaluations.values())
        return cpu / seconds if seconds else float("nan")


def _evaluate(port: int, task: Task, agent_code: str) -> dict:
    started = time.perf_counter()
    eval_id = submit(port, Task(url=task.url, agent_code=agent_code, agent_file=task.agent_file))
    body = wait_terminal(port, eval_id, started, timeout=300)
    if body["status"] != "completed":
        raise RuntimeError(f"bench evaluation ended {body['status']}: {body['error']}")
    return body


def memory_and_monitor(root: Path, task: Task, python: str, name: str = "memory", monitor: bool = True) -> dict:
    """The service as bin/serve starts it (``manage.py serve`` and everything below it, its commands
    left out), run by ``python`` (``common.service_python``: bin/serve's packages alone).
    ``monitor``: the sleeping agent's run too, for the monitor's steady CPU (a second venv's run has
    no use for it: the monitor is the same code)."""
    with live_service(root, name, worker=True, serve=True, python=python, MAX_CONCURRENT_EVALS=2) as service:
        _evaluate(service.port, task, task.agent_code)  # warm: the forkserver is up, a first evaluation ran
        time.sleep(0.5)
        roots = [service.serve.pid]
        with Sampler(roots) as flood:
            body = _evaluate(service.port, task, FLOOD_AGENT)
        if "bytes truncated" not in body["agent_output"]:
            raise RuntimeError("the flood agent's output was not truncated as expected")
        if monitor:
            with Sampler(roots) as sleeper:
                _evaluate(service.port, task, SLEEPER_AGENT)
    return {
        "idle_rss": flood.first_rss,
        "idle_pss": flood.first_pss,
        "peak_rss": flood.peak_rss,
        "peak_pss": flood.peak_pss,
        "idle_breakdown": flood.first_breakdown,
        "peak_breakdown": flood.peak_breakdown,
        "monitor_cpu_sleeper": sleeper.monitor_cpu_per_second() if monitor else None,
        "monitor_cpu_flood": flood.monitor_cpu_per_second(),
    }


def breakdown_table(idle: list, peak: list) -> str:
    """Per process: RSS, PSS and private memory (USS) idle and at the peak, in MB."""
    mb = 1024 * 1024
    lines = [
        f"{'process':<18} {'pid':>7} | {'idle RSS':>8} {'PSS':>6} {'USS':>6} | {'peak RSS':>8} {'PSS':>6} {'USS':>6}"
    ]
    idle_by_pid = {pid: (rss, pss, uss) for _role, pid, rss, pss, uss in idle}
    pids = [pid for _role, pid, *_ in peak] + [pid for _role, pid, *_ in idle if pid not in {p[1] for p in peak}]
    roles = {pid: role for role, pid, *_ in idle + peak}
    peak_by_pid = {pid: (rss, pss, uss) for _role, pid, rss, pss, uss in peak}

    def cells(values):
        return (
            f"{values[0] / mb:8.1f} {values[1] / mb:6.1f} {values[2] / mb:6.1f}"
            if values
            else f"{'-':>8} {'-':>6} {'-':>6}"
        )

    for pid in pids:
        lines.append(f"{roles[pid]:<18} {pid:>7} | {cells(idle_by_pid.get(pid))} | {cells(peak_by_pid.get(pid))}")
    total_idle = [sum(row[i] for row in idle) for i in (2, 3, 4)]
    total_peak = [sum(row[i] for row in peak) for i in (2, 3, 4)]
    lines.append(f"{'sum':<18} {'':>7} | {cells(total_idle)} | {cells(total_peak)}")
    return "\n".join(lines)
