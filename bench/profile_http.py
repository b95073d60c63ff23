"""Where a request's CPU goes: the API's hot routes called through the WSGI app, in this process.

    .venv/bin/python -m bench.profile_http [--route get|post|refused|all] [-n 3000] [--profile] [--bytecodes] [--auth]

No sockets and no gunicorn: each request is one call of the WSGI application
(every middleware, DRF, the database on a fresh SQLite file, django-prometheus
in multi-process mode as under gunicorn), so CPU per request is deterministic
enough to compare two versions of the code. It prints the CPU time per request
(``time.process_time``) of the quickest of ``--rounds`` rounds (others' work on a
shared machine only ever adds to it) and, with ``--profile``, the top of a cProfile of the
same loop. ``--bytecodes`` counts the Python bytecodes a request executes
(``sys.settrace`` opcode events), by package: slow to take, but the same on every
run whatever else the machine does, so a change's effect shows even when the
CPU figures are buried in others' load. What gunicorn adds per request (accept,
parse, access log) is bench/hello_wsgi.py's figure in ``bench/run``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import dataclasses
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

TOKEN = "profile-token"


def _environ(method: str, path: str, body: bytes = b"", auth: bool = False) -> dict:
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_USER_AGENT": "te-bench",
        "HTTP_ACCEPT": "*/*",
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if body:
        environ["CONTENT_TYPE"] = "application/json"
        environ["CONTENT_LENGTH"] = str(len(body))
    if auth:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    environ["_body"] = body
    return environ


def _call(app, template: dict) -> int:
    environ = dict(template)
    environ["wsgi.input"] = io.BytesIO(environ.pop("_body"))
    status = []
    chunks = app(environ, lambda s, headers, exc_info=None: status.append(s))
    for _ in chunks:
        pass
    if hasattr(chunks, "close"):
        chunks.close()
    return int(status[0].split()[0])


PACKAGES = ("django_prometheus", "prometheus_client", "rest_framework", "django", "asgiref", "evaluations",
            "executor_project")  # fmt: skip


def count_bytecodes(app, template: dict, requests: int = 20) -> tuple[float, collections.Counter]:
    """Bytecodes executed per request, and per package (the first of PACKAGES in the code's path)."""
    by_package: collections.Counter = collections.Counter()

    def package(filename: str) -> str:
        return next((name for name in PACKAGES if f"/{name}/" in filename), "other")

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            by_package[package(frame.f_code.co_filename)] += 1
        return tracer

    sys.settrace(tracer)
    try:
        for _ in range(requests):
            _call(app, template)
    finally:
        sys.settrace(None)
    return sum(by_package.values()) / requests, by_package


def _seed_completed() -> str:
    """An evaluation shaped like the bench's: ended, 2 test results, 9 transitions."""
    from datetime import timedelta

    from django.utils import timezone

    from evaluations.models import Evaluation, Status, Step, TestResult, Transition

    now = timezone.now()
    evaluation = Evaluation.objects.create(
        task_url="http://127.0.0.1:1/task.tar.gz",
        agent_code="print(1)\n" * 10,
        status=Status.COMPLETED,
        step=Step.DONE,
        passed=True,
        started_at=now,
        finished_at=now + timedelta(milliseconds=250),
        duration_ms=250,
        agent_output="fixed\n",
        agent_exit_code=0,
        agent_patch="diff --git a/calc.py b/calc.py\n-    return a - b\n+    return a + b\n",
        test_output="ok\nimport-ok\n",
        results_sha256="0" * 64,
        metadata={"run": 7},
    )
    steps = list(Step)
    for i, step in enumerate(steps):
        Transition.objects.create(
            evaluation=evaluation, step=step, status=Status.RUNNING, at=now + timedelta(milliseconds=i)
        )
    for i, (name, kind) in enumerate(
        [("fail_to_pass_add.sh", "fail_to_pass"), ("pass_to_pass_import.sh", "pass_to_pass")]
    ):
        TestResult.objects.create(
            evaluation=evaluation,
            position=i,
            name=name,
            kind=kind,
            passed=True,
            exit_code=0,
            duration_ms=5,
            output="ok\n",
        )
    return str(evaluation.id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", default="all", choices=["get", "post", "refused", "health", "all"])
    parser.add_argument("-n", type=int, default=3000, help="requests per route (after 200 to warm up)")
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile of each route")
    parser.add_argument("--bytecodes", action="store_true", help="count the bytecodes a request runs, by package")
    parser.add_argument("--auth", action="store_true", help="AUTH_TOKEN set, requests carry it")
    parser.add_argument("--rounds", type=int, default=10, help="the figure is the quickest round's")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--lines", type=int, default=40)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="te-profile-http-"))
    metrics = root / "prometheus"
    metrics.mkdir()
    os.environ.update(
        {
            "DATA_DIR": str(root / "data"),
            "WORKSPACE_BASE": str(root / "sessions"),
            "DATABASE_URL": os.environ.get("DATABASE_URL") or f"sqlite:///{root / 'profile.sqlite3'}",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics),
            "DJANGO_SETTINGS_MODULE": "executor_project.settings",
            "MAX_CONCURRENT_EVALS": "1",
            "MAX_QUEUED_EVALS": str(10**7),
            "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
        }
    )
    os.environ.pop("AUTH_TOKEN", None)
    if args.auth:
        os.environ["AUTH_TOKEN"] = TOKEN
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from executor_project.wsgi import application as app

    eval_id = _seed_completed()
    body = json.dumps({"task_url": "http://127.0.0.1:1/task.tar.gz", "agent_code": "print(1)\n" * 10}).encode()
    routes = {
        "health": (_environ("GET", "/health"), 200),
        "get": (_environ("GET", f"/evaluate/{eval_id}", auth=args.auth), 200),
        "post": (_environ("POST", "/evaluate", body, auth=args.auth), 202),
    }
    chosen = ["health", "get", "post", "refused"] if args.route == "all" else [args.route]
    for name in chosen:
        if name == "refused":
            # One slot, taken for good: every POST from here on is refused.
            settings.EXECUTOR = dataclasses.replace(settings.EXECUTOR, max_queued_evals=0)
            from evaluations.models import Evaluation

            Evaluation.objects.filter(status__in=["pending", "running"]).delete()
            template = routes["post"][0]
            assert _call(app, template) == 202
            expected = 503
        else:
            template, expected = routes[name]
        for _ in range(200):
            assert (code := _call(app, template)) == expected, (name, code)
        profiler = cProfile.Profile() if args.profile else None
        if profiler:
            profiler.enable()
        rounds = []  # CPU ms per request of each round: the machine is shared, the minimum is the figure
        for _ in range(args.rounds):
            started = time.process_time()
            for _ in range(args.n // args.rounds):
                _call(app, template)
            rounds.append((time.process_time() - started) / (args.n // args.rounds) * 1000)
        if profiler:
            profiler.disable()
        rounds.sort()
        print(
            f"{name:8} {rounds[0]:.3f} ms CPU/request (median of {args.rounds} rounds {rounds[len(rounds) // 2]:.3f}), n={args.n}"
        )
        if profiler:
            stats = pstats.Stats(profiler)
            stats.sort_stats(args.sort).print_stats(args.lines)
        if args.bytecodes:
            from evaluations.api import views

            # Retry-After's mean duration is read at most once a second: out of the count, which would
            # otherwise depend on how fast the traced requests run.
            mean_wait, views._mean_wait_secs = views._mean_wait_secs, lambda capacity: 5
            per_request, by_package = count_bytecodes(app, template)
            views._mean_wait_secs = mean_wait
            shares = ", ".join(f"{package} {count / 20:.0f}" for package, count in by_package.most_common())
            print(f"{name:8} {per_request:.0f} bytecodes/request: {shares}")


if __name__ == "__main__":
    main()
