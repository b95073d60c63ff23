"""Rewards and signatures (SPEC §21; issue 34, item 7).

The holes: a verifier could write a reward of 1e308 (or -2e9), a valid float that then outweighs
every other in a batch's mean; and the signature of an ended evaluation left ``rewards``'
neighbours out, so ``system_changes``, ``limits_applied``, ``artifacts`` and ``owner`` could be
edited in the database (or in a saved document) and the result still verified. Now a reward
outside [-1e9, 1e9] fails the tests, naming the file, and the signature covers those fields.
"""

from __future__ import annotations

import pytest

from evaluations import lifecycle, signing
from evaluations.models import Evaluation, Status
from tests.helpers.archives import Exec
from tests.helpers.tasks import SOLVER
from tests.pipeline.test_e2e import evaluate
from tests.pipeline.test_graded_workspace import task_with_grader

NEW_SIGNED = ("rewards", "system_changes", "limits_applied", "artifacts", "owner")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "name, body, shown",
    [
        ("reward.txt", "1e308", '/logs/verifier/reward.txt holds "1e308", outside'),
        (
            "reward.json",
            '{"reward": -2e9}',
            '/logs/verifier/reward.json: the value of "reward" is -2000000000.0, outside',
        ),
        ("reward.json", '{"reward": 1, "bonus": 1e308}', '/logs/verifier/reward.json: the value of "bonus" is 1e+308'),
    ],
)
def test_a_reward_outside_the_range_fails_the_tests_naming_the_file(tasks, e2e_config, name, body, shown):
    writes = Exec(f"#!/bin/bash\necho '{body}' > /logs/verifier/{name}\nexit 0\n")
    url = task_with_grader(tasks, "reward_file", {"test_reward.sh": writes})
    evaluation = evaluate(url, SOLVER, config=e2e_config, sandbox="bwrap")
    assert (evaluation.status, evaluation.error_kind, evaluation.passed) == ("failed", "tests_failed", False)
    assert (evaluation.reward, evaluation.rewards) == (None, None)
    assert shown in evaluation.error and "[-1e9, 1e9]" in evaluation.error, evaluation.error


@pytest.mark.django_db(transaction=True)
def test_the_edges_of_the_range_are_rewards(tasks, e2e_config):
    writes = Exec('#!/bin/bash\necho \'{"reward": 1e9, "floor": -1e9}\' > /logs/verifier/reward.json\n')
    evaluation = evaluate(task_with_grader(tasks, "reward_file", {"test_reward.sh": writes}), SOLVER,
                          config=e2e_config, sandbox="bwrap")  # fmt: skip
    assert (evaluation.status, evaluation.reward, evaluation.rewards) == (
        "completed",
        1e9,
        {"reward": 1e9, "floor": -1e9},
    ), evaluation.error


# -- the signature covers what the evaluation says about itself ---------------------------------


EDITS = {
    "rewards": {"reward": 1.0},
    "system_changes": {"count": 0, "paths": [], "suspicious": []},
    "limits_applied": {"agent_timeout_secs": 99999, "network": "public"},
    "artifacts": [],
    "owner": "mallory",
}


def _ended() -> Evaluation:
    evaluation = Evaluation.objects.create(
        task_url="https://example.com/t.tar.gz",
        agent_code="print('hi')",
        agent_sha256="ab" * 32,
        status=Status.RUNNING,
        owner="alice",
        rewards={"reward": 0.25},
        reward=0.25,
        system_changes={"count": 1, "paths": ["/usr/bin/python3"], "suspicious": ["/usr/bin/python3"]},
        limits_applied={"agent_timeout_secs": 60, "network": "no-network"},
        artifacts=[{"path": "trace.txt", "size_bytes": 3, "sha256": "cd" * 32}],
    )
    assert lifecycle.finish(evaluation.id, Status.FAILED, error="running_tests: reward 0.25 < 1", kind="tests_failed")
    return evaluation


@pytest.mark.django_db
def test_the_signature_lists_the_new_fields():
    assert set(NEW_SIGNED) <= set(signing.EVALUATION_FIELDS)


@pytest.mark.django_db
@pytest.mark.parametrize("field", sorted(EDITS))
def test_a_stored_signature_fails_once_the_field_is_edited_in_the_database(api, executor_config, tmp_path, field):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    executor_config(data_dir=folder)
    evaluation = _ended()
    public = signing.load_public_key(api.get("/public-key").json()["keys"][0]["public_key_pem"].encode())
    before = api.get(f"/evaluate/{evaluation.id}").json()
    assert signing.verify(before, public).valid and field in before["signature"]["fields"]
    Evaluation.objects.filter(id=evaluation.id).update(**{field: EDITS[field]})
    after = api.get(f"/evaluate/{evaluation.id}").json()
    assert after[field] == EDITS[field] and after["signature"] == before["signature"]
    assert not signing.verify(after, public).valid
