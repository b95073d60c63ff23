"""gunicorn settings: sync workers, graceful stop, multi-process Prometheus metrics."""

import os
import shutil
import sys

from executor_project import config as config_module

try:
    _config = config_module.load()
except config_module.ConfigError as exc:
    sys.stderr.write(f"term-executor: configuration error: {exc}\n")
    sys.exit(2)

bind = os.environ.get("GUNICORN_BIND", f"0.0.0.0:{_config.port}")
workers = _config.web_workers
worker_class = "sync"
timeout = 60
graceful_timeout = 30
keepalive = 5
accesslog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
wsgi_app = "executor_project.wsgi:application"

# Request metrics are per process; prometheus_client merges them through this folder.
# It must be set before any worker imports prometheus_client, hence here.
_metrics_dir = _config.data_dir / "prometheus" / str(os.getpid())
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_metrics_dir)


def on_starting(server):
    shutil.rmtree(_metrics_dir, ignore_errors=True)
    _metrics_dir.mkdir(parents=True, exist_ok=True)


def when_ready(server):
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
    django.setup()
    from evaluations.checks import log_startup_warnings

    log_startup_warnings()


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    shutil.rmtree(_metrics_dir, ignore_errors=True)
