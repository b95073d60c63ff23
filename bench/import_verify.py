"""``python -m bench.import_verify [--tasks N]``: what `manage.py import_swebench` costs per task (issue 18).

N SWE-bench-style instances (tests/helpers/swebench.py: a bug, a test commit
with three parametrized pytest ids, a fix), each a repository of its own
(so each has a cold install), served on 127.0.0.1. Three figures:

1. the import alone (clone, apply the test_patch, write, pack): wall time
   per task;
2. ``--verify --jobs 1`` and ``--jobs 2``: wall time per task (two
   evaluations each: the gold patch and the no-op agent), each on a fresh
   database and an empty workspace cache;
3. the evaluations' own durations (created to finished) from
   verification.json, median per run kind.

The tasks install pytest from PyPI (``pip install pytest``) through the
egress proxy, as the tests do: that download is most of a cold run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
django.setup()  # tests.helpers.runtimes (REGISTRIES) imports the pipeline

from tests.helpers.cli import EvaluateCli  # noqa: E402
from tests.helpers.httpserver import TestHTTPServer  # noqa: E402
from tests.helpers.runtimes import REGISTRIES  # noqa: E402
from tests.helpers.swebench import BASE_FILES, Instances, write_jsonl  # noqa: E402


def timed_import(work: Path, rows: Path, template: str, *extra: str) -> tuple[float, dict]:
    cli = EvaluateCli(work / "cli", EGRESS_ALLOW=",".join(REGISTRIES))
    try:
        if "--verify" in extra:
            cli.migrate()
        out = work / "out"
        started = time.monotonic()
        done = cli.manage("import_swebench", str(rows), "--out", str(out), "--repo-url", template,
                          "--install", "pip install pytest", *extra, timeout=3600)  # fmt: skip
        took = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"import_swebench {' '.join(extra)} failed:\n{done.stdout}\n{done.stderr}")
        verification = out / "verification.json"
        return took, json.loads(verification.read_text()) if verification.exists() else {}
    finally:
        cli.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-import-") as folder:
        root = Path(folder)
        (root / "www").mkdir()
        with TestHTTPServer(root / "www") as server:
            instances = Instances(root / "www", root / "work")
            rows = [
                instances.make(f"bench__calc-{n}", repo=f"bench/calc-{n}", base={**BASE_FILES, "NOTE": f"{n}\n"})
                for n in range(args.tasks)
            ]
            path = write_jsonl(root / "rows.jsonl", rows)
            template = server.url("/{repo}.git")
            figures = {}
            took, _ = timed_import(root / "plain", path, template)
            figures["import only"] = (took, None)
            for jobs in (1, 2):
                took, verification = timed_import(root / f"jobs{jobs}", path, template, "--verify", "--jobs", str(jobs))
                figures[f"import + verify, --jobs {jobs}"] = (took, verification)
    print(f"{args.tasks} tasks, each a repository of its own (cold install: pip install pytest from PyPI)")
    print(f"{'':32} {'total':>9} {'per task':>9}   evaluation medians")
    for name, (took, verification) in figures.items():
        medians = ""
        if verification:
            for run in ("gold", "noop"):
                ms = [task[run]["duration_ms"] for task in verification["tasks"]]
                medians += f"{run} {statistics.median(ms) / 1000:.2f} s  "
        print(f"{name:32} {took:8.2f}s {took / args.tasks:8.2f}s   {medians}")


if __name__ == "__main__":
    main()
