"""`manage.py serve`: run gunicorn and the worker together; stop both when either stops.

1. One command for operators (bin/serve, the Dockerfile): the API without a
   worker admits evaluations nobody runs, so they start and stop as a pair.
2. SIGTERM/SIGINT is passed to both; each stops gracefully (gunicorn finishes
   its requests, the worker its evaluations within SHUTDOWN_GRACE_SECS).
3. If one child dies, the other is stopped and serve exits non-zero, so a
   supervisor (Docker, systemd) restarts the pair.
4. Neither starts when the worker would refuse to: a folder the sandbox uids
   cannot use, image id ranges another user has ids in, or SANDBOX=auto without a
   working bubblewrap (evaluations/worker/startup.py).
5. One interpreter's worth of memory: serve imports Django, the API (every
   view), the pipeline and what a first query or request would import
   (``first_use``) once, freezes that heap (``gc.freeze``) and forks
   the gunicorn master and the worker from it; gunicorn forks its web workers
   and the worker its forkserver from those, so every process of the service
   shares these pages instead of importing its own copy (bench/RESULTS.md).
   The processes are named (``ps -o comm``): te-serve, te-gunicorn, te-worker,
   te-forkserver.
6. Once both are forked, serve has nothing left to run but the waiting: it execs
   ``executor_project/supervisor.py`` in a bare interpreter (same pid), which holds a
   few MB where this one holds Django's. The signals it waits for are blocked from
   before the forks, so none is lost while it execs.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import traceback

from django.conf import settings
from django.core.management.base import BaseCommand

from evaluations.worker.startup import (
    StartupError,
    check_folders,
    check_image_ids,
    check_privileges,
    check_signing_key,
    choose_runtime,
)
from executor_project import supervisor
from executor_project.config import PROJECT_DIR
from executor_project.process import name_process

# prometheus_client picks its multi-process mode when it is imported (by django.setup(), before
# any command runs), so serve sets the folder and starts itself again (same pid) with it set.
_METRICS_VAR = "PROMETHEUS_MULTIPROC_DIR"


class Command(BaseCommand):
    help = "Run the API (gunicorn) and the evaluation worker together."
    requires_system_checks = []  # its start-up warnings are logged (one line each, LOG_FORMAT applies)

    def handle(self, *args, **options):
        config = settings.EXECUTOR
        try:
            check_folders(config)  # before anything starts: one line, exit 2
            check_image_ids(config)  # SPEC §21: IMAGE_UID_BASE's ranges are ours alone
            check_privileges()  # as root in a container: the capabilities root's work takes
            check_signing_key(config)  # SPEC §18: made at first start, or SIGNING_KEY_FILE's
            choose_runtime(config)  # SANDBOX=auto without a working bubblewrap too (the worker chooses its own)
        except StartupError as exc:
            exc.exit()
        metrics_dir = config.data_dir / "prometheus" / f"serve-{os.getpid()}"
        if os.environ.get(_METRICS_VAR) != str(metrics_dir):
            shutil.rmtree(metrics_dir, ignore_errors=True)
            metrics_dir.mkdir(parents=True, exist_ok=True)
            os.environ[_METRICS_VAR] = str(metrics_dir)
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, str(PROJECT_DIR / "manage.py"), "serve"])
        try:
            self.serve(config, metrics_dir)
        finally:
            shutil.rmtree(metrics_dir, ignore_errors=True)

    def serve(self, config, metrics_dir) -> None:
        name_process("te-serve")
        os.chdir(PROJECT_DIR)
        preload()
        # Blocked until the supervisor takes them (each child unblocks them): none is lost meanwhile.
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, supervisor.SIGNALS)
        children = {
            "gunicorn": fork("te-gunicorn", run_gunicorn, unblocked),
            "worker": fork("te-worker", run_worker, unblocked),
        }
        arguments = supervisor.arguments(children, config.shutdown_grace_secs + 15, str(metrics_dir))
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(sys.executable, supervisor.command(arguments))
        except OSError as exc:  # the interpreter gone (replaced by an upgrade?): supervise from here
            self.stderr.write(f"serve: cannot exec {sys.executable} ({exc}); supervising from this process")
            supervisor.main(arguments)


def preload() -> None:
    """Import what gunicorn and the worker will run, once, here; freeze it for the forks to share."""
    import gunicorn.app.wsgiapp  # noqa: F401
    import gunicorn.arbiter  # noqa: F401
    import gunicorn.workers.sync  # noqa: F401
    from django.db import connections
    from django.urls import get_resolver

    import executor_project.streamworker  # noqa: F401  (gunicorn's worker class)
    import executor_project.wsgi  # noqa: F401  (the app gunicorn preloads: found imported)
    from evaluations.management.commands import run_worker as _run_worker  # noqa: F401
    from evaluations.worker import child  # noqa: F401  (Django's models and the whole pipeline)

    get_resolver().resolve("/health")  # the URLconf: every view, serializer and their imports
    first_use()
    connections.close_all()  # no child may inherit a database connection
    gc.collect()
    # A collection in a child writes to every object it visits, which would copy each shared page.
    gc.freeze()


def first_use() -> None:
    """Import and build here what each process would otherwise import or build, in its own private
    memory, at its first query or request (found by comparing ``sys.modules`` before and after)."""
    import codecs
    import multiprocessing.forkserver  # noqa: F401  (the worker's pool)
    import multiprocessing.popen_forkserver  # noqa: F401
    import multiprocessing.spawn  # noqa: F401
    import runpy  # noqa: F401

    import django.contrib.sessions.serializers  # noqa: F401  (every request's session middleware)
    import gunicorn.glogging  # noqa: F401
    from django.apps import apps
    from django.db import connections
    from django.utils.module_loading import import_string

    import_string(settings.MESSAGE_STORAGE)  # every request's message middleware
    codecs.lookup("utf-8-sig")  # task files are read with it
    for connection in connections.all():
        connection.ops.compiler("SQLCompiler")  # imports the SQL compiler module; connects to nothing
    for model in apps.get_models():  # the models' field caches, filled by a first query
        for field in model._meta.concrete_fields:
            field.cached_col  # noqa: B018


def fork(name: str, target, unblocked: set[signal.Signals]) -> int:
    """Run ``target`` in a child process that shares this one's pages; return its pid.
    The child's signal mask is set back to ``unblocked``."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        name_process(name)
        target()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_gunicorn() -> None:
    """gunicorn as ``python -m gunicorn -c executor_project/gunicorn.conf.py`` would run it."""
    from gunicorn.app.wsgiapp import WSGIApplication

    sys.argv = ["gunicorn", "-c", str(PROJECT_DIR / "executor_project" / "gunicorn.conf.py")]
    WSGIApplication("%(prog)s [OPTIONS] [APP_MODULE]", prog="gunicorn").run()


def run_worker() -> None:
    from django.core.management import call_command

    call_command("run_worker")
