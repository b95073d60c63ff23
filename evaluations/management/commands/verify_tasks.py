"""`manage.py verify_tasks ARCHIVE|DIR... [--jobs N] [--out DIR]`: oracle checks of tasks (SPEC §17).

The work is evaluations/importers/ (collect.py reads the arguments, verify.py
runs the checks). Each task runs through the executor's own pipeline twice,
with its reference solution as the agent and with a no-op agent; it is
verified when the solution's reward is 1 and the no-op's is not. A progress
line per run, then a table, then ``verification.json`` in --out.

Exit status: 0 when every task was verified; 1 when one was not (the rest is
checked and written all the same); 2 when nothing could be done (a path that
is no task, a bad option, a database that is not migrated).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluations.importers import collect, verify
from evaluations.worker import localrun

RESULT_FILE = "verification.json"


class Command(BaseCommand):
    help = (
        "Run each task (a task folder, a task archive, or a folder of them) through the pipeline with its "
        "reference solution as the agent and with a no-op agent; a task is verified when the solution's "
        "reward is 1 and the no-op's is not. Writes verification.json in --out. Exits 1 if a task is not verified."
    )
    requires_system_checks = []  # the service's checks (AUTH_TOKEN...) say nothing about a local run

    def add_arguments(self, parser):
        parser.add_argument(
            "paths", metavar="ARCHIVE|DIR", nargs="+", help="a task archive, a task folder, or a folder of them"
        )
        parser.add_argument("--jobs", metavar="N", type=int, default=1, help="runs at once (default 1)")
        parser.add_argument(
            "--out", metavar="DIR", default=".", help="where verification.json goes (default: the current folder)"
        )

    def handle(self, *args, **options):
        verify.command_start(options)  # quiet logs below -v 2, --jobs checked
        out = Path(options["out"])
        if out.exists() and not out.is_dir():
            raise CommandError(f"--out {out}: not a folder", returncode=2)
        report = self.stdout._out

        def say(line: str) -> None:
            report.write(line + "\n")
            report.flush()

        scratch = Path(tempfile.mkdtemp(prefix="te-verify-"))
        try:
            try:
                given = collect.find(options["paths"])
                checks = [
                    collect.prepare(task, scratch / str(number), settings.EXECUTOR) for number, task in enumerate(given)
                ]
                localrun.check_database()
            except (collect.NotATask, localrun.LocalRunError) as exc:
                raise CommandError(str(exc), returncode=2) from exc
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CommandError(f"--out {out}: {exc}", returncode=2) from exc
            say(f"verifying {len(checks)} task(s), {options['jobs']} run(s) at once")
            for check in checks:
                if check.problem is not None:
                    say(f"{check.name}: not run: {check.problem}")
            results = verify.verify(checks, scratch, options["jobs"], say)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        written = verify.write_json(out / RESULT_FILE, results)
        say("\n" + verify.table(results).rstrip("\n"))
        if why := verify.details(results):
            say("\n" + why.rstrip("\n"))
        failed = [r for r in results if not r.verified]
        say(f"{len(results) - len(failed)} verified, {len(failed)} not verified; results in {written}")
        if failed:
            sys.exit(1)
