"""The workspace cache in the running service (SPEC §13): gunicorn + run_worker, evaluations at once."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.helpers.archives import Exec
from tests.helpers.http import request
from tests.helpers.polling import submit, wait_terminal
from tests.helpers.tasks import ADD_TEST, BUGGY, SOLVER

if os.geteuid() != 0:
    pytest.skip("the workspace cache needs root (idmapped mounts)", allow_module_level=True)

# Long enough that every evaluation reaches cloning_repo while the first one is still installing.
SLOW_INSTALL = 'echo INSTALL-RAN\nsleep 4\necho built > "$HOME/built"\n'
BUILT = Exec('#!/bin/bash\ntest "$(cat "$HOME/built")" = built && echo built-ok\n')


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_evaluations_of_one_new_key_at_once_build_it_once_and_all_pass(worker_service, tasks):
    service = worker_service(MAX_CONCURRENT_EVALS=3)
    url = tasks.task(
        base_files={"calc.py": BUGGY, "install.sh": SLOW_INSTALL},
        install=["bash install.sh"],
        tests={"fail_to_pass_add.sh": ADD_TEST, "pass_to_pass_built.sh": BUILT},
    )
    ids = [submit(service, url, SOLVER) for _ in range(3)]
    results = [wait_terminal(service, eval_id, timeout=240) for eval_id in ids]
    assert [(r["status"], r["error"]) for r in results] == [("completed", None)] * 3, results
    assert sorted(r["cache"] for r in results) == ["hit", "hit", "miss"]
    logs = [request("GET", service.url(f"/evaluate/{eval_id}/logs")).body.decode() for eval_id in ids]
    assert sum("INSTALL-RAN" in log for log in logs) == 1  # one build, the others waited for it

    metrics = request("GET", service.url("/metrics")).body.decode()
    assert _metric(metrics, "term_executor_cache_hits_total") == 2
    assert _metric(metrics, "term_executor_cache_misses_total") == 1
    assert _metric(metrics, "term_executor_cache_bytes") > 0

    listing = json.loads(service.manage("cache", "list", "--json").stdout)
    (entry,) = listing["entries"]
    assert entry["hits"] == 2 and entry["base_commit"] == tasks.last_shas[0]
    assert service.manage("cache", "clear").returncode == 0
    assert json.loads(service.manage("cache", "list", "--json").stdout)["entries"] == []
