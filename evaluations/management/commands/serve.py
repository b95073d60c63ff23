"""`manage.py serve`: run gunicorn and the worker together; stop both when either stops.

1. One command for operators (bin/serve, the Dockerfile): the API without a
   worker admits evaluations nobody runs, so they start and stop as a pair.
2. SIGTERM/SIGINT is passed to both; each stops gracefully (gunicorn finishes
   its requests, the worker its evaluations within SHUTDOWN_GRACE_SECS).
3. If one child dies, the other is stopped and serve exits non-zero, so a
   supervisor (Docker, systemd) restarts the pair.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from executor_project.config import PROJECT_DIR


class Command(BaseCommand):
    help = "Run the API (gunicorn) and the evaluation worker together."
    requires_system_checks = []  # its start-up warnings are logged (one line each, LOG_FORMAT applies)

    def handle(self, *args, **options):
        python = sys.executable
        children = {
            "gunicorn": subprocess.Popen(
                [python, "-m", "gunicorn", "-c", "executor_project/gunicorn.conf.py"], cwd=PROJECT_DIR
            ),
            "worker": subprocess.Popen([python, "manage.py", "run_worker"], cwd=PROJECT_DIR),
        }
        stopping = {"signal": None}

        def forward(signum, frame):
            stopping["signal"] = signum

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        exited = None
        while stopping["signal"] is None and exited is None:
            for name, child in children.items():
                if child.poll() is not None:
                    exited = name
            time.sleep(0.2)
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        grace = settings.EXECUTOR.shutdown_grace_secs + 15
        for child in children.values():
            try:
                child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if exited is not None:
            code = children[exited].returncode
            self.stderr.write(f"serve: {exited} exited with code {code}; stopped the rest")
            sys.exit(1)
