"""The service's memory while an agent writes 1 GB of output, and what the psutil monitor costs.

The service is every process of ours that is not a command: the gunicorn
master and its workers, ``run_worker``, its forkserver (and multiprocessing's
resource tracker) and the evaluation processes the forkserver forks. They are
sampled every 50 ms; the figure is the peak of their sum, as RSS (pages
shared between forked processes counted once per process) and as PSS (each
shared page split among its sharers: the memory the service really holds).

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


@dataclass
class Sampler:
    """Samples the service's processes every 50 ms in a thread."""

    roots: list[int]
    peak_rss: int = 0
    peak_pss: int = 0
    first_rss: int = 0
    first_pss: int = 0
    # evaluation pid -> (first seen, last seen, monitor CPU seconds at the last sample)
    evaluations: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def processes(self) -> tuple[list[psutil.Process], list[psutil.Process]]:
        """(service processes, evaluation processes among them)."""
        gunicorn, worker = (psutil.Process(pid) for pid in self.roots)
        service = [gunicorn, *gunicorn.children(), worker]
        evaluations = []
        for helper in worker.children():  # the forkserver and the resource tracker
            service.append(helper)
            for child in helper.children():  # evaluation processes; their children are commands
                service.append(child)
                evaluations.append(child)
        return service, evaluations

    def sample(self) -> None:
        try:
            service, evaluations = self.processes()
        except psutil.NoSuchProcess:
            return
        rss = pss = 0
        for proc in service:
            try:
                memory = proc.memory_full_info()
            except psutil.Error:
                continue
            rss += memory.rss
            pss += memory.pss
        if not self.first_rss:
            self.first_rss, self.first_pss = rss, pss
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        now = time.perf_counter()
        for proc in evaluations:
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


def memory_and_monitor(root: Path, task: Task) -> dict:
    with live_service(root, "memory", worker=True, MAX_CONCURRENT_EVALS=2) as service:
        _evaluate(service.port, task, task.agent_code)  # warm: the forkserver is up, a first evaluation ran
        time.sleep(0.5)
        roots = [service.gunicorn.pid, service.worker.pid]
        with Sampler(roots) as flood:
            body = _evaluate(service.port, task, FLOOD_AGENT)
        if "bytes truncated" not in body["agent_output"]:
            raise RuntimeError("the flood agent's output was not truncated as expected")
        with Sampler(roots) as sleeper:
            _evaluate(service.port, task, SLEEPER_AGENT)
    return {
        "idle_rss": flood.first_rss,
        "idle_pss": flood.first_pss,
        "peak_rss": flood.peak_rss,
        "peak_pss": flood.peak_pss,
        "monitor_cpu_sleeper": sleeper.monitor_cpu_per_second(),
        "monitor_cpu_flood": flood.monitor_cpu_per_second(),
    }
