"""The admin's browser test runs the real service: the worker tests' fixtures, re-exported."""

from tests.worker.conftest import tasks, worker_service  # noqa: F401  (gunicorn + run_worker)
