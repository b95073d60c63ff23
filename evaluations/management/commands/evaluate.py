"""`manage.py evaluate TASK [TASK ...] AGENT`: run evaluations here, as the worker would, and show them.

For task authors: check that the reference agent passes and an empty one
fails before publishing a task. No server is needed; the configured database
is (run `manage.py migrate` once), and the evaluation is stored there like
any other.

1. TASK is a task folder, an archive or a URL (evaluations/worker/localrun.py turns
   it into a task_url; file:// URLs are allowed for this run only). AGENT is
   one source file (agent_code), or a project folder or archive (agent_archive,
   SPEC §14; a folder is packed here).
2. The request is checked by the API's own serializer, the sandbox chosen as
   run_worker chooses it, and the pipeline is the worker's.
3. Each step is shown as it ends with its duration (on a terminal, a live
   line shows the current one), then a table of the tests.
4. Exit status: 0 only if the evaluation passed; 1 if it did not; 2 if it
   could not start. --json prints the evaluation object on stdout instead.
5. Several TASKs are a batch (SPEC §14), checked as POST /batches checks one:
   each task runs in turn as above, then the batch table (task, status,
   passed, error_kind) and the reward. Exit 0 only if every task passed;
   --json prints the batch object (GET /batches/{id}).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evaluations import representation
from evaluations.api.serializers import BatchRequestSerializer, EvaluateRequestSerializer, submission_fields
from evaluations.models import Step
from evaluations.representation import evaluation_json
from evaluations.worker import localrun
from evaluations.worker.startup import StartupError, prepare_to_run

HIDDEN_STEPS = (Step.QUEUED, Step.DONE)
SPINNER = "|/-\\"


class Progress:
    """One line per finished step; on a terminal, also a live line for the current one."""

    def __init__(self, out, tty: bool):
        self.out = out
        self.tty = tty
        self.shown = 0  # transitions already printed
        self.started = time.monotonic()
        self.step_started: tuple[str, float] | None = None
        self.spinner = itertools.cycle(SPINNER)

    def update(self, times: list[localrun.StepTime], final: bool = False) -> None:
        finished = times if final else times[:-1]
        lines = []
        for entry in finished[self.shown :]:
            if entry.step not in HIDDEN_STEPS:
                lines.append(f"  {entry.step:<18} {_seconds(entry.duration_ms):>9}")
        self.shown = max(self.shown, len(finished))
        if lines:
            self._clear()
            self.out.write("\n".join(lines) + "\n")
        if self.tty and not final and times and times[-1].step not in HIDDEN_STEPS:
            current = times[-1].step
            if self.step_started is None or self.step_started[0] != current:
                self.step_started = (current, time.monotonic())
            elapsed = time.monotonic() - self.step_started[1]
            self.out.write(f"\r\033[K  {current:<18} {elapsed:>7.1f} s {next(self.spinner)}")
        self.out.flush()

    def _clear(self) -> None:
        if self.tty:
            self.out.write("\r\033[K")


def _seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def results_table(evaluation) -> str:
    rows = [("test", "kind", "result", "exit", "time")]
    for result in evaluation.test_results.all():
        verdict = "passed" if result.passed else ("timed out" if result.timed_out else "FAILED")
        exit_code = "-" if result.exit_code is None else str(result.exit_code)
        rows.append((result.name, result.kind, verdict, exit_code, _seconds(result.duration_ms)))
    if len(rows) == 1:
        return "  (no test ran)\n"
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def verdict_line(evaluation) -> str:
    results = list(evaluation.test_results.all())
    passed = sum(r.passed for r in results)
    took = _seconds(evaluation.duration_ms)
    if evaluation.passed:
        return f"PASSED: {passed} of {len(results)} tests passed in {took} (evaluation {evaluation.id})\n"
    return f"{evaluation.status.upper()}: {evaluation.error} (evaluation {evaluation.id})\n"


def batch_table(document: dict, labels: list[str]) -> str:
    """One row per task of a batch object (representation.batch_document), then its reward."""
    rows = [("task", "status", "passed", "error_kind")]
    for label, row in zip(labels, document["evaluations"], strict=True):
        passed = "-" if row["passed"] is None else ("yes" if row["passed"] else "no")
        rows.append((label, row["status"], passed, row["error_kind"] or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "".join(
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )
    reward = document["reward"]
    shown = "-" if reward is None else f"{reward:.3f}"
    return (
        f"{table}reward: {shown} ({document['passed']} of {document['total']} tasks passed; "
        f"batch {document['batch_id']} {document['status']})\n"
    )


class Interruption:
    """SIGINT (Ctrl-C) and SIGTERM while evaluations exist: noted here, acted on by the loop that watches them.

    Installed before the first row is written, whatever this process inherited: a background job of a
    non-interactive shell (``bin/test > log &``, a CI step) starts with SIGINT ignored, and Python then
    turns no SIGINT into KeyboardInterrupt, so the run went on (issue 23). The handler raises
    nothing: an exception could land anywhere in the main thread, in a database call or between the
    loop's checks, and leave the evaluation running with nobody watching it.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signal: str | None = None  # the first one received

    def __enter__(self) -> Interruption:
        self.previous = {signum: signal.signal(signum, self._note) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _note(self, signum, frame) -> None:
        self.signal = self.signal or signal.Signals(signum).name


class Command(BaseCommand):
    help = (
        "Run evaluations on this machine through the worker's pipeline and show them: each TASK is a task "
        "folder, an archive or a URL; several TASKs are a batch. Exits 0 only if every evaluation passed. "
        "Uses the configured database (run `manage.py migrate` first)."
    )
    requires_system_checks = []  # the service's checks (AUTH_TOKEN...) say nothing about a local run

    def add_arguments(self, parser):
        parser.add_argument(
            "task",
            metavar="TASK",
            nargs="+",
            help="task folder, task archive, or http(s)/file URL of one; several: a batch",
        )
        parser.add_argument(
            "agent_file",
            metavar="AGENT",
            help="the agent: one source file, a project folder, or a project archive (.tar.gz, .tgz, .zip)",
        )
        parser.add_argument(
            "--language",
            help="python, bash or node (default: from the file's extension, or the folder's entry point)",
        )
        parser.add_argument(
            "--entrypoint", metavar="PATH", help="a project's entry point (default: agent.py/main.py, agent.sh, ...)"
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="print the evaluation object (JSON; a batch: the batch object) on stdout",
        )
        parser.add_argument("--timeout", type=int, metavar="SECS", help="agent timeout (default AGENT_TIMEOUT_SECS)")
        parser.add_argument(
            "--env", action="append", default=[], metavar="NAME=VALUE", help="agent environment (repeatable)"
        )
        parser.add_argument(
            "--keep", action="store_true", help="keep the session folder (WORKSPACE_BASE/<eval_id>) to look at"
        )

    def handle(self, *args, **options):
        report = self.stderr._out if options["json"] else self.stdout._out
        if options["verbosity"] < 2:
            for name in ("term_executor", "evaluations"):  # their INFO lines would break the progress line
                logging.getLogger(name).setLevel(logging.WARNING)
        try:
            localrun.check_database()
        except localrun.LocalRunError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        config = dataclasses.replace(
            settings.EXECUTOR,
            allow_file_urls=True,
            keep_workspaces=options["keep"] or settings.EXECUTOR.keep_workspaces,
        )
        scratch = Path(tempfile.mkdtemp(prefix="te-evaluate-"))
        try:
            fields, task_urls = self.request_fields(options, scratch, config)
            try:
                runtime = prepare_to_run(config)
            except StartupError as exc:
                raise CommandError(str(exc), returncode=2) from exc
            owner = localrun.worker_id()
            with Interruption() as self.interruption, localrun.Heartbeat(owner, runtime):
                if len(task_urls) > 1:
                    return self.run_batch(fields, task_urls, options, config, runtime, owner, report)
                evaluation = localrun.create_claimed({**fields, "task_url": task_urls[0]}, owner)
                evaluation = self.run_one(evaluation, config, runtime, owner, report)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self.show(evaluation, options, config, report)
        if options["json"]:
            self.stdout.write(json.dumps(evaluation_json(evaluation), indent=2))
        if not evaluation.passed:
            sys.exit(1)

    def run_one(self, evaluation, config, runtime, owner, report):
        report.write(
            f"evaluation {evaluation.id}: {evaluation.task_url} ({evaluation.language}, sandbox {runtime.name})\n"
        )
        run = localrun.LocalRun(str(evaluation.id), config, runtime, owner)
        return self.run(run, Progress(report, report.isatty()))

    def run_batch(self, fields, task_urls, options, config, runtime, owner, report):
        """Each task in turn, as one task runs; Ctrl-C stops the current one and cancels the rest."""
        batch, evaluations = localrun.create_claimed_batch(fields, task_urls, owner)
        report.write(f"batch {batch.id}: {len(evaluations)} tasks\n")
        for n, evaluation in enumerate(evaluations):
            if self.interruption.signal:
                localrun.cancel_unstarted(batch, evaluations[n:], "interrupted on the command line")
                break
            report.write(f"\n[{n + 1}/{len(evaluations)}] ")
            self.show(self.run_one(evaluation, config, runtime, owner, report), options, config, report)
        document = representation.batch_json(batch.id)
        report.write("\n" + batch_table(document, options["task"]))
        report.flush()
        if options["json"]:
            self.stdout.write(json.dumps(document, indent=2))
        if document["passed"] != document["total"]:
            sys.exit(1)

    def show(self, evaluation, options, config, report) -> None:
        if options["keep"]:
            report.write(f"session folder kept: {config.workspace_base / str(evaluation.id)}\n")
        if options["verbosity"] >= 2:
            report.write(f"--- agent output (exit {evaluation.agent_exit_code}) ---\n{evaluation.agent_output}\n")
            report.write(f"--- test output ---\n{evaluation.test_output}\n")
        report.write("\n" + results_table(evaluation))
        report.write(verdict_line(evaluation))
        report.flush()

    def request_fields(self, options, scratch: Path, config) -> tuple[dict, list[str]]:
        """The request's fields (as a row's) and its task URLs, checked by the API's own serializer."""
        agent_file = Path(options["agent_file"])
        try:
            agent = localrun.agent_request(agent_file, options["language"], options["entrypoint"], scratch)
            task_urls = [localrun.task_url_for(task, scratch) for task in options["task"]]
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"AGENT {agent_file}: {exc}", returncode=2) from exc
        except localrun.LocalRunError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        env = {}
        for item in options["env"]:
            name, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"--env {item}: expected NAME=VALUE", returncode=2)
            env[name] = value
        body = {**agent, "env": env}
        if options["timeout"] is not None:
            body["timeout_secs"] = options["timeout"]
        if len(task_urls) == 1:
            body["task_url"] = task_urls[0]
            serializer = EvaluateRequestSerializer(data=body, context={"config": config})  # file:// URLs allowed
        else:
            body["task_urls"] = task_urls
            serializer = BatchRequestSerializer(data=body, context={"config": config})
        if not serializer.is_valid():
            problems = "; ".join(f"{name}: {' '.join(map(str, errors))}" for name, errors in serializer.errors.items())
            raise CommandError(f"the request is invalid: {problems}", returncode=2)
        data = serializer.validated_data
        return {
            **submission_fields(data),  # an archive is stored like a POST's
            "metadata": {
                "submitted_with": "manage.py evaluate",
                **({"task": options["task"][0]} if len(task_urls) == 1 else {"tasks": options["task"]}),
                "agent_file": str(agent_file),
            },
        }, task_urls

    def run(self, run: localrun.LocalRun, progress: Progress):
        """Start the pipeline, show its steps until it ends; Ctrl-C or SIGTERM (``Interruption``)
        cancels it cleanly, through its row as every cancel."""
        interval = 0.1 if progress.tty else 0.25  # a signal is seen within one interval
        run.start()
        cancelling = False
        while run.alive:
            if self.interruption.signal and not cancelling:
                cancelling = True
                progress.out.write("\ninterrupted: cancelling (the evaluation's processes are being killed)\n")
                run.request_cancel("interrupted on the command line")
            run.beat(time.monotonic())
            progress.update(localrun.step_times(run.eval_id))
            run.wait(interval)
        evaluation = run.finish()
        progress.update(localrun.step_times(run.eval_id), final=True)
        return evaluation
