"""Server time of the admin's pages with 1 MiB outputs: ``.venv/bin/python -m bench.admin [-n 20]``.

Each page is one request through the whole Django stack (every middleware, a logged-in
session, the templates), in this process, on a fresh SQLite file holding ROWS evaluations
whose agent output, test output and stored log are 1 MiB each, and one evaluation with
1 MiB in every output, a 4 MiB stored log (the cap) and TESTS tests of 1 MiB output each.
It prints the median and the slowest wall time of ``-n`` requests per page, and the mean CPU
time (what other work on a shared machine inflates least); the target is 100 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import django_in

MIB = 1024 * 1024
ROWS = 100
TESTS = 10


def populate(folder: Path) -> dict[str, str]:
    from django.contrib.auth.models import User
    from django.utils import timezone

    from evaluations import lifecycle
    from evaluations.models import Evaluation, Status, TestResult, Transition

    User.objects.create_superuser("bench", "bench@example.com", "pw")
    mib = "".join(f"line {i:07d} " + "x" * 80 + "\n" for i in range(MIB // 94))
    for i in range(ROWS):
        evaluation = Evaluation.objects.create(
            task_url=f"http://127.0.0.1/task-{i:08x}.tar.gz", agent_code="print(1)",
            agent_output=mib, test_output=mib, log=mib,
        )  # fmt: skip
        Transition.objects.create(evaluation=evaluation, step="queued", status="pending")
        lifecycle.finish(evaluation.id, Status.FAILED if i % 3 else Status.COMPLETED, error="running_tests: 1 failed")
    heavy = Evaluation.objects.create(
        task_url="http://127.0.0.1/task-heavy.tar.gz", agent_code=mib, agent_output=mib, agent_patch=mib,
        test_output=mib, task_prompt=mib, original_pr=mib, log=mib * 4,
    )  # fmt: skip
    Transition.objects.create(evaluation=heavy, step="queued", status="pending")
    for position in range(TESTS):
        TestResult.objects.create(
            evaluation=heavy, position=position, name=f"t{position}", kind="test", passed=False, output=mib
        )
    lifecycle.finish(heavy.id, Status.FAILED, error="running_tests: 10 of 10 tests failed")
    running = Evaluation.objects.create(task_url="http://127.0.0.1/task-live.tar.gz", agent_code="x")
    Transition.objects.create(evaluation=running, step="queued", status="pending")
    lifecycle.record(running.id, status=Status.RUNNING, expect=[Status.PENDING], started_at=timezone.now())
    session = folder / "sessions" / str(running.id)
    session.mkdir(parents=True)
    (session / "log.txt").write_text(mib * 4)
    changelist = "/admin/evaluations/evaluation/"
    return {
        f"list (50 of {ROWS + 2} rows)": changelist,
        "list, status=failed": f"{changelist}?status__exact=failed",
        f"detail, ended ({TESTS} tests, 4 MiB log)": f"{changelist}{heavy.id}/change/",
        "detail, running (4 MiB live log)": f"{changelist}{running.id}/change/",
        "workers": "/admin/evaluations/workerheartbeat/",
        "index": "/admin/",
    }


def measure(pages: dict[str, str], requests: int) -> list[tuple[str, float, float, float, int]]:
    from django.test import Client

    client = Client()
    assert client.login(username="bench", password="pw")
    rows = []
    for name, url in pages.items():
        client.get(url)  # templates compiled, connections open
        times, size = [], 0
        cpu_started = time.process_time()
        for _ in range(requests):
            started = time.perf_counter()
            reply = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
            assert reply.status_code == 200, (url, reply.status_code)
            size = len(reply.content)
        cpu = (time.process_time() - cpu_started) * 1000 / requests
        rows.append((name, statistics.median(times), max(times), cpu, size))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="requests per page")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="te-bench-admin-") as tmp:
        folder = Path(tmp)
        django_in(folder)
        pages = populate(folder)
        rows = measure(pages, args.n)
    print(f"{'page':44} {'p50 ms':>8} {'max ms':>8} {'CPU ms':>8} {'page KiB':>9}")
    for name, p50, worst, cpu, size in rows:
        print(f"{name:44} {p50:8.1f} {worst:8.1f} {cpu:8.1f} {size / 1024:9.0f}")
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0 if all(p50 < 100 for _, p50, _, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
