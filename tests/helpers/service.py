"""Run the real service (gunicorn, and optionally run_worker) as subprocesses for a test.

Each LiveService gets its own data folder and its own database: a SQLite file,
or a fresh PostgreSQL database when the test run's DATABASE_URL is PostgreSQL.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.helpers.http import request

PROJECT = Path(__file__).resolve().parents[2]


def using_postgres() -> bool:
    return os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))


@functools.cache
def service_sandbox() -> str:
    """SANDBOX for the services and CLIs tests start, unless a test says otherwise: the run's own
    SANDBOX if set; bwrap when REQUIRE_SANDBOX=1 (a run without it must fail, not fall back);
    else auto where bubblewrap works here, and none, said explicitly, where it does not (SANDBOX=auto
    without bubblewrap refuses to start, SPEC §20)."""
    if os.environ.get("SANDBOX"):
        return os.environ["SANDBOX"]
    if os.environ.get("REQUIRE_SANDBOX") == "1":
        return "bwrap"
    from evaluations.runtime.sandbox import probe_bwrap

    return "auto" if probe_bwrap()[0] else "none"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FreshDatabase:
    """A database URL of its own: SQLite in `folder`, or a new PostgreSQL database."""

    def __init__(self, folder: Path):
        self.name = None
        if using_postgres():
            import psycopg

            self.admin_url = os.environ["DATABASE_URL"]
            self.name = f"te_live_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {self.name}")
            base = self.admin_url.rsplit("/", 1)[0]
            self.url = f"{base}/{self.name}"
        else:
            self.url = f"sqlite:///{folder / 'live.sqlite3'}"

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """What ``sql`` (``%s`` placeholders) reads from this database now, as the service wrote it (a
        uuid is 32 hex digits in SQLite, a uuid in PostgreSQL)."""
        if self.name:
            import psycopg

            with psycopg.connect(self.url) as conn:
                return conn.execute(sql, params).fetchall()
        with contextlib.closing(sqlite3.connect(self.url.removeprefix("sqlite:///"))) as conn:
            return conn.execute(sql.replace("%s", "?"), params).fetchall()

    def drop(self) -> None:
        if self.name:
            import psycopg

            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


class LiveService:
    def __init__(
        self,
        folder: Path,
        *,
        env: dict | None = None,
        web_workers: int = 2,
        worker: bool = False,
        python: str = sys.executable,
    ):
        self.folder = folder
        self.python = python  # the interpreter (and so the venv) the service's processes run
        self.folder.mkdir(parents=True, exist_ok=True)
        self.database = FreshDatabase(folder)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST_", "PROMETHEUS_"))
        }
        self.env.update(
            {
                "DATA_DIR": str(folder / "data"),
                "WORKSPACE_BASE": str(folder / "sessions"),
                "DATABASE_URL": self.database.url,
                "GUNICORN_BIND": f"127.0.0.1:{self.port}",
                "WEB_WORKERS": str(web_workers),
                "DJANGO_SETTINGS_MODULE": "executor_project.settings",
                "SANDBOX": service_sandbox(),
            }
        )
        self.env.update(env or {})
        self.with_worker = worker
        self.processes: list[subprocess.Popen] = []

    def manage(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.python, "manage.py", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def start(self) -> LiveService:
        self.manage("migrate", "--noinput")
        log = open(self.folder / "gunicorn.log", "ab")
        self.gunicorn = subprocess.Popen(
            [self.python, "-m", "gunicorn", "-c", "executor_project/gunicorn.conf.py"],
            cwd=PROJECT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(self.gunicorn)
        if self.with_worker:
            self.start_worker()
        self.wait_healthy()
        return self

    def start_worker(self) -> subprocess.Popen:
        log = open(self.folder / "worker.log", "ab")
        worker = subprocess.Popen(
            [self.python, "manage.py", "run_worker"], cwd=PROJECT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes.append(worker)
        self.worker = worker
        return worker

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if request("GET", self.url("/health"), timeout=2).status == 200:
                    return
            except OSError:
                pass
            if self.gunicorn.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"service did not start: {(self.folder / 'gunicorn.log').read_text()[-3000:]}")

    def url(self, path: str) -> str:
        return self.base_url + path

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.database.drop()
        self.remove_cgroup_parent()

    def remove_cgroup_parent(self) -> None:
        """The service's cgroup folder in each hierarchy, with what a killed worker left in it (empty
        cgroups: their processes ended with the service): a production service keeps its folder for
        its next start and its reaper empties it, but a test service's DATA_DIR never starts again
        (left, they pile up by the hundred)."""
        from evaluations.runtime.cgroupfs import read_mounts
        from executor_project.config import ConfigError, load

        try:
            name = load(self.env).cgroup_parent
        except ConfigError:  # a service that could not start made none
            return
        mounts = read_mounts()
        for root in (*mounts.v1.values(), *([mounts.v2_root] if mounts.v2_root else [])):
            for folder, _, _ in os.walk(root / name, topdown=False):
                with contextlib.suppress(OSError):  # still holding a process: not ours to kill here
                    os.rmdir(folder)
