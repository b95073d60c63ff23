"""The pipeline's run (evaluations/pipeline/run.py) as an evaluation process runs it."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evaluations.models import Evaluation, Status
from evaluations.pipeline.cancel import CancelState
from evaluations.pipeline.run import run_pipeline
from evaluations.pipeline.session import RETIRED_PREFIX, remove_retired
from evaluations.worker.claim import claim
from tests.helpers.runtimes import run_evaluation, runtime_named

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failure_while_preparing_fails_the_evaluation_with_its_cause(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="te-not-ours-", dir="/tmp"))
    try:
        if os.geteuid() == 0:
            os.chown(base, 65534, 65534)  # WORKSPACE_BASE made by another user: no session is made in it
        else:
            os.chmod(base, 0o500)
        config = dataclasses.replace(settings.EXECUTOR, workspace_base=base)
        row = Evaluation.objects.create(task_url="https://example.com/t.tar.gz", agent_code="x")
        claim("test-worker", 1)
        run_evaluation(str(row.id), config, "none")
        row.refresh_from_db()
        assert row.status == Status.FAILED
        assert row.error.startswith("queued: could not prepare the session: PermissionError: "), row.error
        assert "executor process died" not in row.error
        assert not list(base.iterdir())
    finally:
        shutil.rmtree(base, ignore_errors=True)


def evaluate(task_url: str, agent_code: str, config, **fields) -> Evaluation:
    row = Evaluation.objects.create(task_url=task_url, agent_code=agent_code, **fields)
    claimed = claim("test-worker", 1)
    assert list(claimed) == [row.id]
    run_evaluation(str(row.id), config, "none", claimed=claimed[row.id])
    row.refresh_from_db()
    return row


def test_what_a_failing_step_staged_is_stored_with_its_failure(www, http_server, e2e_config):
    """downloading_task stages the archive's sha256 (SPEC §18), then cannot extract it: the failure
    carries the hash (SPEC §25: a step's results go with the next transition, or with the end)."""
    served = os.urandom(4096)
    (www / "noise.tar.gz").write_bytes(served)
    row = evaluate(http_server.url("/noise.tar.gz"), "x", e2e_config)
    assert (row.status, row.step) == (Status.FAILED, "done")
    assert row.error.startswith("downloading_task: "), row.error
    assert row.task_sha256 == hashlib.sha256(served).hexdigest()
    assert row.log and row.resources is not None  # staged at cleanup, written by finish


@pytest.mark.parametrize("handed_over", [True, False])
def test_the_first_step_closes_the_claims_transition_and_reads_none_when_it_is_handed_over(
    www, http_server, e2e_config, handed_over
):
    """The worker hands the claim's transition to the evaluation's process (worker/pool.py): the
    first step's change then reads no transition, and closes the claim's as the lookup does."""
    (www / "noise.tar.gz").write_bytes(os.urandom(64))
    row = Evaluation.objects.create(task_url=http_server.url("/noise.tar.gz"), agent_code="x")
    claimed = claim("test-worker", 1)
    with CaptureQueriesContext(connection) as queries:
        run_evaluation(str(row.id), e2e_config, "none", claimed=claimed[row.id] if handed_over else None)
    reads = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT") and "transition" in q["sql"]]
    assert bool(reads) is not handed_over, reads
    steps = list(row.transitions.values_list("step", "status", "duration_ms"))
    # A row made here, not by the API: no transition of its admission.
    assert [(step, status) for step, status, _ in steps] == [
        ("queued", "running"), ("downloading_task", "running"), ("cleanup", "running"), ("done", "failed")
    ]  # fmt: skip
    assert steps[0][2] is not None and steps[-1][2] is None  # the claim's closed; the end's open
    assert row.transitions.get(step="queued", status="running").id == claimed[row.id].id


def test_a_cancel_after_the_agent_staged_its_output_keeps_it(tasks, e2e_config):
    """An agent past its timeout: running_agent stages what it printed, then the evaluation is cancelled."""
    agent = "import time\nprint('halfway there', flush=True)\ntime.sleep(60)\n"
    row = evaluate(tasks.task(), agent, e2e_config, timeout_secs=1)
    assert (row.status, row.error_kind) == (Status.CANCELLED, "agent_timeout"), row.error
    assert "halfway there" in row.agent_output
    steps = list(row.transitions.values_list("step", flat=True))
    assert steps[-3:] == ["running_agent", "cleanup", "done"]


def test_the_retired_session_goes_to_remove_later_once_the_row_is_written(www, http_server, e2e_config):
    """A kept evaluation process removes its session folder off the path to the next claim
    (child.tidy): run_pipeline hands it over, closed, once the row has ended; without
    ``remove_later`` it is gone when run_pipeline returns."""
    (www / "noise.tar.gz").write_bytes(os.urandom(64))
    handed = []
    ids = []

    def remove_later(folder: Path) -> None:
        st = os.stat(folder)
        handed.append((folder, Evaluation.objects.get(id=ids[-1]).status, st.st_mode & 0o777, st.st_uid))

    for later in (remove_later, None):
        row = Evaluation.objects.create(task_url=http_server.url("/noise.tar.gz"), agent_code="x")
        ids.append(row.id)
        claimed = claim("test-worker", 1)
        runtime = runtime_named("none")
        run_pipeline(str(row.id), e2e_config, runtime=runtime, cancel=CancelState(), claimed=claimed[row.id],
                     remove_later=later)  # fmt: skip
        assert not (e2e_config.workspace_base / str(row.id)).exists()
    [(folder, status, mode, owner)] = handed
    assert folder == e2e_config.workspace_base / f"{RETIRED_PREFIX}{ids[0]}"
    assert status == Status.FAILED and mode == 0o700 and owner == os.geteuid()  # ended first; ours alone
    remove_retired(folder)
    assert sorted(e2e_config.workspace_base.iterdir()) == []  # the second one removed its own
