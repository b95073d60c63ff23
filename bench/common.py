"""What every benchmark shares: the trivial task, the live service, a small HTTP client, statistics.

The task is the smallest real one: a two-commit repository served as a bare
repository over dumb HTTP on 127.0.0.1, a task archive beside it, a Python
agent that fixes a one-line bug, and two test scripts. The same task is what
``bench/baseline.sh`` runs as a plain shell script.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from executor_project.config import Config
from tests.helpers.archives import Exec
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.service import LiveService
from tests.helpers.tasks import ADD_TEST, SOLVER, TaskFactory

PROJECT = Path(__file__).resolve().parent.parent
BASELINE = PROJECT / "bench" / "baseline.sh"
TERMINAL = {"completed", "failed", "cancelled"}
# The second test: the repository's own code still imports (a pass_to_pass test).
IMPORT_TEST = Exec("#!/bin/bash\npython3 -c 'import calc' && echo import-ok\n")
# gunicorn as the README starts it (bin/serve): the configured number of sync workers.
README_WEB_WORKERS = Config().web_workers


@dataclass
class Task:
    url: str
    agent_code: str
    agent_file: Path  # the same agent, on disk, for the baseline script


@contextlib.contextmanager
def bench_folder() -> Iterator[Path]:
    """A scratch folder under /tmp that the sandbox uid can traverse (sessions live below it)."""
    root = Path(tempfile.mkdtemp(prefix="te-bench-", dir="/tmp"))
    os.chmod(root, 0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def trivial_task(root: Path) -> Iterator[Task]:
    """The bench task, served on 127.0.0.1 for as long as the context lasts."""
    www = root / "www"
    www.mkdir()
    agent_file = root / "agent.py"
    agent_file.write_text(SOLVER)
    agent_file.chmod(0o644)
    with TestHTTPServer(www) as server:
        factory = TaskFactory(www, server.url("/"))
        url = factory.task(tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_import.sh": IMPORT_TEST})
        yield Task(url=url, agent_code=SOLVER, agent_file=agent_file)


class ServedService(LiveService):
    """The service as the README starts it: one ``manage.py serve`` (gunicorn and the worker below it)."""

    def start(self) -> ServedService:
        self.manage("migrate", "--noinput")
        log = open(self.folder / "serve.log", "ab")
        self.serve = subprocess.Popen(
            [self.python, "manage.py", "serve"], cwd=PROJECT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes.append(self.serve)
        self.gunicorn = self.worker = self.serve  # wait_healthy polls it; the roles are found below it
        try:
            self.wait_healthy()
        except RuntimeError:
            raise RuntimeError(f"serve did not start: {(self.folder / 'serve.log').read_text()[-3000:]}") from None
        return self


def service_python() -> str:
    """The interpreter of a venv holding requirements.txt alone: the packages bin/serve installs on a
    fresh machine. Made once per requirements file (pip, about a minute), kept in the temporary folder.

    This project's .venv also holds the test tools (requirements-dev.txt), and DRF imports two of them
    wherever they are installed (``rest_framework.compat``: pytest's pygments, schemathesis's
    requests), 4.7 MB of heap in every process of the service that a deployed one does not hold.
    """
    requirements = PROJECT / "requirements.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    venv = Path(tempfile.gettempdir()) / "term-executor-bench" / f"service-venv-{digest}"
    python = venv / "bin" / "python"
    if python.exists():
        return str(python)
    venv.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="building-", dir=venv.parent))
    try:
        subprocess.run(["python3", "-m", "venv", str(building)], check=True)
        pip = [building / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "-r", requirements], check=True)
        building.rename(venv)  # only `python -m` runs from it: its scripts' first lines may name `building`
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone unless it failed before its rename
    return str(python)


@contextlib.contextmanager
def live_service(
    root: Path, name: str, *, worker: bool, serve: bool = False, python: str = sys.executable, **env
) -> Iterator[LiveService]:
    """gunicorn (README_WEB_WORKERS sync workers) and optionally run_worker, on a fresh database.

    ``serve``: start both through ``manage.py serve`` instead, exactly as bin/serve does.
    ``python``: the interpreter the service runs (``service_python``: the packages bin/serve installs)."""
    sessions = root / f"{name}-sessions"
    sessions.mkdir(mode=0o711)
    settings = {"ALLOWED_PRIVATE_HOSTS": "127.0.0.1", "WORKSPACE_BASE": str(sessions)}
    settings.update({key: str(value) for key, value in env.items()})
    kind = ServedService if serve else LiveService
    service = kind(root / name, env=settings, web_workers=README_WEB_WORKERS, worker=worker or serve, python=python)
    try:
        service.start()
        if worker or serve:
            wait_worker(service)
        yield service
    finally:
        service.stop()


def wait_worker(service: LiveService, timeout: float = 30) -> None:
    """Until the worker has beaten its first heartbeat (it has probed the sandbox and can claim)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if get_json(service.port, "/status")[1].get("workers"):
            return
        time.sleep(0.05)
    raise RuntimeError("the worker did not start")


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 30) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get_json(port: int, path: str) -> tuple[int, dict]:
    status, body = request(port, "GET", path)
    return status, json.loads(body)


def submit(port: int, task: Task) -> str:
    status, body = request(port, "POST", "/evaluate", {"task_url": task.url, "agent_code": task.agent_code})
    if status != 202:
        raise RuntimeError(f"POST /evaluate answered {status}: {body[:300]!r}")
    return json.loads(body)["eval_id"]


def run_baseline(task: Task) -> float:
    """Seconds one run of the shell baseline takes; raises if its tests did not pass."""
    started = time.perf_counter()
    done = subprocess.run(["bash", str(BASELINE), task.url, str(task.agent_file)], capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"baseline.sh failed ({done.returncode}): {done.stderr[-500:]}")
    return elapsed


def django_in(folder: Path) -> None:
    """Django set up in this process on a migrated SQLite database of its own under ``folder``
    (benchmarks that call the executor's functions rather than its HTTP API)."""
    os.environ.update(
        DATA_DIR=str(folder / "data"),
        WORKSPACE_BASE=str(folder / "sessions"),
        DATABASE_URL=f"sqlite:///{folder / 'bench.sqlite3'}",
        DJANGO_SETTINGS_MODULE="executor_project.settings",
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (p50 of 30 values is the 15th smallest)."""
    ordered = sorted(values)
    rank = max(1, int(-(-fraction * len(ordered) // 1)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine() -> dict[str, str]:
    memory_kib = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=PROJECT, capture_output=True, text=True)
    return {
        "nproc": str(os.cpu_count()),
        "ram": f"{memory_kib / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "python": platform.python_version(),
        # BENCH_COMMIT: where the code has no git (the bench inside the container: bench/container.py)
        "commit": os.environ.get("BENCH_COMMIT")
        or commit.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else ""),
        "load": load_average(),
    }
