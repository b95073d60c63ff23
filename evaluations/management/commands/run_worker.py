"""`manage.py run_worker`: claim pending evaluations and run each in its own process.

The loop is evaluations/worker/loop.py (``Worker``); this command prepares the host
(worker/startup.py), starts a worker and turns SIGTERM and SIGINT into its stop request.
"""

from __future__ import annotations

import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from evaluations.worker.loop import Worker
from evaluations.worker.startup import StartupError, prepare_to_run


class Command(BaseCommand):
    help = "Run evaluations: claim pending ones and execute each in its own process."
    requires_system_checks = []  # its start-up warnings are logged (one line each, LOG_FORMAT applies)

    def handle(self, *args, **options):
        config = settings.EXECUTOR
        try:
            runtime = prepare_to_run(config)
        except StartupError as exc:
            exc.exit()
        worker = Worker.start(config, runtime)
        signal.signal(signal.SIGTERM, worker.request_stop)
        signal.signal(signal.SIGINT, worker.request_stop)
        worker.run()
