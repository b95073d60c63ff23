"""Where one evaluation's time goes: the pipeline of the bench task under a wall-clock profiler.

    .venv/bin/python -m bench.profile_pipeline [--runs 5] [--html out.html]

Needs pyinstrument (``.venv/bin/pip install pyinstrument``; an investigation
tool, not a requirement). It runs the real pipeline (the worker's sandbox
choice and, as root, its cgroups; a fresh SQLite database) in this process, as
an evaluation process does, and prints the profile of the last run (the
earlier ones warm caches).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from bench.common import bench_folder, trivial_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--html", help="write the last run's profile as HTML here")
    args = parser.parse_args()
    from pyinstrument import Profiler

    with bench_folder() as root:
        sessions = root / "sessions"
        sessions.mkdir(mode=0o711)
        os.environ.update(
            {
                "DATA_DIR": str(root / "data"),
                "DATABASE_URL": f"sqlite:///{root / 'profile.sqlite3'}",
                "WORKSPACE_BASE": str(sessions),
                "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
                "DJANGO_SETTINGS_MODULE": "executor_project.settings",
            }
        )
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.utils import timezone

        from evaluations.models import Evaluation, Status, Step
        from evaluations.pipeline.cancel import CancelState
        from evaluations.pipeline.run import run_pipeline
        from evaluations.runtime import cgroups, sandbox_uid, select_runtime

        call_command("migrate", verbosity=0)
        config = settings.EXECUTOR
        runtime = select_runtime(config.sandbox, uid=sandbox_uid(), workdir=sessions)
        if os.geteuid() == 0:  # as the worker's (worker/startup.py): each command joins the evaluation's cgroup
            runtime.cgroups = cgroups.detect(config.cgroup_parent)
        sandbox = runtime.name
        with trivial_task(root) as task:
            for run in range(args.runs):
                evaluation = Evaluation.objects.create(
                    task_url=task.url,
                    agent_code=task.agent_code,
                    language="python",
                    status=Status.RUNNING,
                    step=Step.QUEUED,
                    worker_id="profile",
                    started_at=timezone.now(),
                )
                profiler = Profiler(interval=0.0005) if run == args.runs - 1 else None
                started = time.perf_counter()
                before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
                if profiler:
                    profiler.start()
                run_pipeline(str(evaluation.id), config, runtime=runtime, cancel=CancelState())
                if profiler:
                    profiler.stop()
                evaluation.refresh_from_db()
                after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = [
                    (a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime) * 1000
                    for a, b in zip(after, before, strict=True)
                ]
                print(
                    f"run {run + 1}: {evaluation.status} in {(time.perf_counter() - started) * 1000:.0f} ms "
                    f"(sandbox {sandbox}); CPU: this process {cpu[0]:.0f} ms, its commands {cpu[1]:.0f} ms",
                    file=sys.stderr,
                )
        print(profiler.output_text(unicode=True, color=False, show_all=False))
        if args.html:
            with open(args.html, "w") as out:
                out.write(profiler.output_html())


if __name__ == "__main__":
    main()
