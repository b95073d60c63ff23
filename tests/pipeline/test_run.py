"""The pipeline's run (evaluations/pipeline/run.py) as an evaluation process runs it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from evaluations.models import Evaluation, Status
from evaluations.worker.claim import claim
from tests.helpers.runtimes import run_evaluation

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
