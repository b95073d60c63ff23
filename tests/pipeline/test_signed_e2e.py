"""A real evaluation (the pipeline in this process, real archive on 127.0.0.1, real git, the sandbox)
ends signed (SPEC §18): task_sha256 is the served archive's, and the signature verifies. Its object
is what the schema's Evaluation component describes (tests/helpers/schema.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from evaluations import VERSION, lifecycle, signing
from evaluations.models import Evaluation, Status
from evaluations.representation import evaluation_json
from tests.helpers.runtimes import run_evaluation
from tests.helpers.schema import conforms
from tests.helpers.tasks import SOLVER

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_real_evaluation_ends_signed_with_its_archive_sha256(tasks, www, e2e_config, sandbox, settings):
    settings.EXECUTOR = e2e_config
    url = tasks.task()
    served = www / url.rsplit("/", 1)[1]
    evaluation = Evaluation.objects.create(task_url=url, agent_code=SOLVER)
    assert lifecycle.record(evaluation.id, status=Status.RUNNING, expect=[Status.PENDING])
    run_evaluation(str(evaluation.id), e2e_config, sandbox, None)
    evaluation = Evaluation.objects.prefetch_related("transitions", "test_results").get(id=evaluation.id)
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    assert evaluation.task_sha256 == hashlib.sha256(served.read_bytes()).hexdigest()
    document = json.loads(json.dumps(evaluation_json(evaluation)))  # as a platform saves it
    assert document["signature"] == evaluation.signature and document["executor_version"] == VERSION
    assert document["agent_patch_sha256"] == hashlib.sha256(evaluation.agent_patch.encode()).hexdigest()
    conforms(document, "Evaluation")
    public = signing.keyring(e2e_config).find(document["signature"]["key_id"]).verifier()
    assert signing.verify(document, public).valid
    document["test_results"][0]["passed"] = False
    assert not signing.verify(document, public).valid
