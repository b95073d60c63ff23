"""Run `manage.py evaluate` as a task author does: a subprocess on a migrated database of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.database_marks import NO_DATABASE_URL
from tests.helpers.service import PROJECT, FreshDatabase, service_sandbox


class EvaluateCli:
    """A data folder, a fresh database (SQLite, or PostgreSQL when the run uses it) and a workspace.

    ``database=False``: for the commands that need none (``manage.py image``), DATABASE_URL names a
    server that is not there (NO_DATABASE_URL), so one that reached a database would fail.
    """

    def __init__(self, folder: Path, *, database: bool = True, **env: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.database = FreshDatabase(folder) if database else None
        # Session folders where the sandbox uid can reach them (pytest's tmp_path is 0700).
        self.workspace_base = Path(tempfile.mkdtemp(prefix="te-cli-sessions-", dir="/tmp"))
        os.chmod(self.workspace_base, 0o711)
        self.env = {
            key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST_", "PROMETHEUS_"))
        }
        self.env.update(
            {
                "DATA_DIR": str(folder / "data"),
                "DATABASE_URL": self.database.url if self.database else NO_DATABASE_URL,
                "WORKSPACE_BASE": str(self.workspace_base),
                "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
                "DJANGO_SETTINGS_MODULE": "executor_project.settings",
                "SANDBOX": service_sandbox(),
            }
        )
        self.env.update(env)

    def manage(self, *args: str, timeout: float = 180, **popen) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            **popen,
        )

    def migrate(self) -> EvaluateCli:
        done = self.manage("migrate", "--noinput")
        assert done.returncode == 0, done.stderr
        return self

    def evaluate(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return self.manage("evaluate", *args, timeout=timeout)

    def close(self) -> None:
        if self.database:
            self.database.drop()
        shutil.rmtree(self.workspace_base, ignore_errors=True)
