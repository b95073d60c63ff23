"""SPEC §23: an evaluation of a Harbor task of [[steps]] shows ``steps`` ([{name, reward, rewards, passed,
duration_ms}]) in GET /evaluate/{id}, as the model holds it, described in the OpenAPI schema and covered
by the signature (SPEC §18); a task of one step shows null."""

from __future__ import annotations

import pytest

from evaluations import lifecycle, signing
from evaluations.models import Evaluation, Status
from tests.api.test_evaluation_read import assert_read_as_the_model
from tests.helpers.signatures import tampered

pytestmark = pytest.mark.django_db

STEPS = [
    {"name": "one", "reward": 1.0, "rewards": {"reward": 1.0}, "passed": True, "duration_ms": 812},
    {"name": "two ✓", "reward": None, "rewards": None, "passed": False, "duration_ms": 40},
]


@pytest.fixture
def public_key(api, tmp_path, executor_config):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    executor_config(data_dir=folder)
    return signing.load_public_key(api.get("/public-key").json()["keys"][0]["public_key_pem"].encode())


def ended(**fields) -> Evaluation:
    evaluation = Evaluation.objects.create(
        task_url="https://example.com/t.tar.gz", agent_code="x", status=Status.RUNNING
    )
    assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: step 'two ✓': no reward",
                            kind="tests_failed", **fields)  # fmt: skip
    return evaluation


def test_the_steps_are_shown_as_stored_and_signed(api, public_key):
    evaluation = ended(steps=STEPS, reward=1.0, rewards={"reward": 1.0})
    body = assert_read_as_the_model(api, evaluation)
    assert body["steps"] == STEPS and body["reward"] == 1.0
    assert "steps" in body["signature"]["fields"] and signing.verify(body, public_key).valid
    assert not signing.verify(tampered(body, "steps"), public_key).valid
    Evaluation.objects.filter(id=evaluation.id).update(steps=STEPS[:1])  # edited at rest: no longer verifies
    assert not signing.verify(api.get(f"/evaluate/{evaluation.id}").json(), public_key).valid


def test_a_task_of_one_step_shows_null(api, public_key):
    body = assert_read_as_the_model(api, ended())
    assert body["steps"] is None and signing.verify(body, public_key).valid


def test_the_schema_describes_a_step(api):
    schemas = api.get("/api/schema").json()["components"]["schemas"]
    steps = schemas["Evaluation"]["properties"]["steps"]
    assert steps["type"] == "array" and steps["nullable"] is True
    step = schemas[steps["items"]["$ref"].rsplit("/", 1)[1]]
    assert set(step["properties"]) == {"name", "reward", "rewards", "passed", "duration_ms"}
    assert step["properties"]["reward"]["nullable"] is True
