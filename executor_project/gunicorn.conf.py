"""gunicorn settings: sync workers whose event streams are written by threads (streamworker.py), graceful stop,
multi-process Prometheus metrics.

The master imports Django and the app once (``preload_app``) and freezes that heap
before forking (``gc.freeze``), so the workers share those pages instead of each
importing its own copy (bench/RESULTS.md has the saving). Under
``manage.py serve`` the master is itself a fork of serve, which imported the app
already: the preload finds it imported and shares serve's pages.
"""

import gc
import os
import shutil
import sys

from executor_project import config as config_module
from executor_project import settings_loader
from executor_project.logs import logging_config

try:
    _config = settings_loader.load()
except config_module.ConfigError as exc:
    sys.stderr.write(f"term-executor: configuration error: {exc}\n")
    sys.exit(2)

bind = _config.bind
workers = _config.web_workers
# The API one request at a time per process; an event stream's body is handed to a thread of its own
# (SPEC §18), so a stream holds a sync worker only for its checks and this timeout never sees one.
worker_class = "executor_project.streamworker.StreamingSyncWorker"
timeout = 60
graceful_timeout = 30
keepalive = 5
accesslog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
# gunicorn's own lines (start, stop, access) in the service's format: LOG_FORMAT=json covers them too.
logconfig_dict = logging_config(_config)
wsgi_app = "executor_project.wsgi:application"
preload_app = True
# gunicorn's control socket (gunicornc) is a thread with an asyncio loop in the master, and one
# path ($HOME/.gunicorn/gunicorn.ctl) for every gunicorn of the user: not used here.
control_socket_disable = True

# Request metrics are per process; prometheus_client merges them through this folder.
# It must exist before the app (preloaded by the master) imports prometheus_client, hence here.
_metrics_dir = _config.data_dir / "prometheus" / str(os.getpid())
shutil.rmtree(_metrics_dir, ignore_errors=True)
_metrics_dir.mkdir(parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_metrics_dir)


def when_ready(server):
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
    django.setup()
    from django.urls import get_resolver

    from evaluations.checks import log_startup_warnings

    log_startup_warnings()
    # The URLconf (every view, serializer and their imports) loads at the first request:
    # load it here, once, for all the workers to share.
    get_resolver().resolve("/health")


def pre_fork(server, worker):
    from django.db import connections

    connections.close_all()  # a worker must never share the master's database connection
    # Objects the master made stay out of the workers' garbage collections: a collection
    # writes to every object it visits, which would copy each shared page into the worker.
    gc.freeze()


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    shutil.rmtree(_metrics_dir, ignore_errors=True)


def post_worker_init(worker):
    import signal

    from evaluations.events.hub import stop_streams
    from executor_project.memory import release_after_large_responses
    from executor_project.streamworker import hand_off_streams

    # A large response (an evaluation with 1 MiB outputs) is freed once sent, not several requests later;
    # an event stream's is written by a thread of its own once its checks passed.
    worker.wsgi = hand_off_streams(release_after_large_responses(worker.wsgi))
    # SIGTERM: the streams end at once (their clients resume with Last-Event-ID on the restarted service).
    graceful_exit = signal.getsignal(signal.SIGTERM)

    def stop(signum, frame):
        stop_streams()
        graceful_exit(signum, frame)

    signal.signal(signal.SIGTERM, stop)
