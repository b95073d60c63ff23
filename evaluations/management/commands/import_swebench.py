"""`manage.py import_swebench FILE`: SWE-bench / SWE-Forge rows -> task folders and archives (SPEC §15).

The work is evaluations/importers/ (rows.py reads, build.py writes, verify.py
runs). Exit status: 0 when every row was imported (and, with --verify,
verified); 1 when a row was skipped or a task failed verification (the rest
is written all the same); 2 when nothing could be done (FILE unreadable, bad
options, with --verify a database that is not migrated).
"""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evaluations.environments import BadEnvironment, check_name
from evaluations.importers import build, recipes, verify
from evaluations.importers.swebench import import_file
from evaluations.worker import localrun


class Command(BaseCommand):
    help = (
        "Turn SWE-bench / SWE-Forge instances (JSON lines or a JSON list) into task folders and archives in "
        "DIR, listed in DIR/index.json; --verify runs each through the pipeline with the gold patch and "
        "with a no-op agent. Exits 1 if a row was skipped or a task failed verification."
    )
    requires_system_checks = []  # the service's checks (AUTH_TOKEN...) say nothing about an import

    def add_arguments(self, parser):
        parser.add_argument("file", metavar="FILE", help="instances: JSON lines or a JSON list")
        parser.add_argument("--out", metavar="DIR", default="tasks", help="where the tasks go (default ./tasks)")
        parser.add_argument(
            "--repo-url",
            metavar="TEMPLATE",
            default=build.DEFAULT_REPO_URL,
            help="clone URL of a row's repo, {repo} replaced (default %(default)s)",
        )
        parser.add_argument(
            "--install",
            metavar="CMD",
            action="append",
            default=[],
            help="install command for every row (repeatable; default: the row's install, else its recipe's, "
            "else 'pip install -e .')",
        )
        parser.add_argument(
            "--test-cmd",
            metavar="CMD",
            help="test command for every row (default: the row's test_cmd, else its recipe's, "
            f"else '{build.DEFAULT_TEST_CMD}')",
        )
        parser.add_argument(
            "--specs",
            metavar="FILE",
            help="install recipes per repository and version (JSON, SWE-bench's shape), over SWE-bench's own",
        )
        parser.add_argument("--only", metavar="ID", action="append", default=[], help="import only ID (repeatable)")
        parser.add_argument(
            "--environment",
            metavar="NAME",
            help="environment of every task; with --environment-for, of the rows whose Python version is not known",
        )
        parser.add_argument(
            "--environment-for",
            metavar="PYVER=NAME_OR_IMAGE",
            action="append",
            default=[],
            help="environment (a name, or an image reference) of the rows whose recipe's Python is PYVER "
            "(repeatable); a row whose version has none is skipped",
        )
        parser.add_argument(
            "--image-template",
            metavar="TEMPLATE",
            help="each row's environment is this image, {id} the instance id as SWE-bench names its images "
            "(e.g. swebench/sweb.eval.x86_64.{id}:latest); the task runs in its /testbed",
        )
        parser.add_argument("--verify", action="store_true", help="run each task with the gold patch and a no-op agent")
        parser.add_argument("--jobs", metavar="N", type=int, default=1, help="verification runs at once (default 1)")

    def handle(self, *args, **options):
        verify.command_start(options)  # quiet logs below -v 2, --jobs checked
        if "{repo}" not in options["repo_url"]:
            raise CommandError("--repo-url must contain {repo}", returncode=2)
        if options["environment"]:
            try:
                check_name(options["environment"])
            except BadEnvironment as exc:
                raise CommandError(f"--environment: {exc}", returncode=2) from exc
        try:
            specs = recipes.load_specs(Path(options["specs"])) if options["specs"] else {}
        except recipes.SpecsError as exc:
            raise CommandError(f"--specs {exc}", returncode=2) from exc
        try:
            environment_for = recipes.parse_environment_for(options["environment_for"])
            if options["image_template"] is not None:
                recipes.check_image_template(options["image_template"])
        except recipes.OptionError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if options["image_template"] is not None and (options["environment"] or environment_for):
            raise CommandError(
                "--image-template gives every row its environment: it does not go with --environment "
                "or --environment-for",
                returncode=2,
            )
        if options["verify"]:
            try:
                localrun.check_database("--verify")
            except localrun.LocalRunError as exc:
                raise CommandError(str(exc), returncode=2) from exc
        report = self.stdout._out

        def say(line: str) -> None:
            report.write(line + "\n")
            report.flush()

        def complain(line: str) -> None:
            self.stderr._out.write(line + "\n")
            self.stderr._out.flush()

        try:
            result = import_file(
                Path(options["file"]),
                Path(options["out"]),
                build.Options(
                    repo_url=options["repo_url"],
                    install=tuple(options["install"]),
                    test_cmd=options["test_cmd"],
                    environment=options["environment"],
                    specs=specs,
                    environment_for=environment_for,
                    image_template=options["image_template"],
                ),
                only=set(options["only"]) or None,
                verify_jobs=options["jobs"] if options["verify"] else None,
                report=say,
                report_bad=complain,
            )
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"FILE {options['file']}: {exc}", returncode=2) from exc
        if result.verifications:
            say("\n" + verify.table(result.verifications, verify.SWEBENCH).rstrip("\n"))
            if why := verify.details(result.verifications, verify.SWEBENCH):
                say("\n" + why.rstrip("\n"))
        summary = f"imported {len(result.built)} task(s) into {options['out']}, skipped {len(result.skipped)}"
        if result.no_environment:
            summary += f" ({len(result.no_environment)} with no environment for their python)"
        if options["verify"]:
            summary += f", {len(result.verifications) - len(result.unverified)} verified"
            summary += f", {len(result.unverified)} failed verification"
        say(summary)
        if result.skipped or result.unverified:
            sys.exit(1)
