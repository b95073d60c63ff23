"""`manage.py import_tasks --from terminal-bench|harbor DIR... --out DIR` (SPEC §17).

The work is evaluations/importers/tasks.py. Exit status: 0 when every task
was imported; 1 when a task was refused (each with its sentence; the rest is
written all the same); 2 for bad arguments (a DIR that is not a folder).
``--report FILE`` writes every folder read as JSON (SPEC §22).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evaluations.importers.tasks import FORMATS, import_tasks


class Command(BaseCommand):
    help = (
        "Read Harbor or Terminal-Bench 1.x task folders (each DIR a task or a folder of tasks) with the "
        "executor's own reader and write each in Harbor's layout under --out, with a .tar.gz archive per "
        "task and --out/index.json. Exits 1 if a task was refused."
    )
    requires_system_checks = []  # the service's checks (AUTH_TOKEN...) say nothing about an import

    def add_arguments(self, parser):
        parser.add_argument("dirs", metavar="DIR", nargs="+", help="a task folder, or a folder of task folders")
        parser.add_argument(
            "--from", dest="source_format", required=True, choices=sorted(FORMATS), help="the format DIR holds"
        )
        parser.add_argument("--out", metavar="DIR", default="tasks", help="where the tasks go (default ./tasks)")
        parser.add_argument(
            "--report",
            metavar="FILE",
            help="write a JSON list of every folder read: {folder, dataset, imported, reason} (SPEC §22)",
        )

    def handle(self, *args, **options):
        if options["verbosity"] < 2:
            for name in ("term_executor", "evaluations"):
                logging.getLogger(name).setLevel(logging.WARNING)
        dirs = [Path(d) for d in options["dirs"]]
        for folder in dirs:
            if not folder.is_dir():
                raise CommandError(f"DIR {folder}: no such folder", returncode=2)
        out = Path(options["out"])
        if out.exists() and not out.is_dir():
            raise CommandError(f"--out {out}: not a folder", returncode=2)

        def say(line: str) -> None:
            self.stdout._out.write(line + "\n")
            self.stdout._out.flush()

        def complain(line: str) -> None:
            self.stderr._out.write(line + "\n")
            self.stderr._out.flush()

        report = Path(options["report"]) if options["report"] else None
        if report is not None and report.is_dir():
            raise CommandError(f"--report {report}: a folder, not a file", returncode=2)
        result = import_tasks(dirs, out, options["source_format"], report=say, report_bad=complain)
        if report is not None:
            report.write_text(json.dumps(result.report(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        say(f"imported {len(result.imported)} task(s) into {out}, refused {len(result.refused)}")
        if result.refused:
            sys.exit(1)
