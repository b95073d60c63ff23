"""What the API serves is what its schema describes: each body is a ``Shape`` (representation.py,
or beside its view) and the OpenAPI component of the same class. Here real bodies, every field
filled, are checked against the served components as closed objects: a key the component lacks,
or one it requires that the body lacks, fails (tests/helpers/schema.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from evaluations import lifecycle
from evaluations.api import assets, batches, environments, images, service, views  # noqa: F401  (their shapes)
from evaluations.models import ErrorKind, Evaluation, Status, Step, TestResult, Transition
from evaluations.network.egress.proxy import EgressRecord
from evaluations.representation import BatchTaskSerializer, EvaluationSerializer, Shape, evaluation_json
from tests.helpers.schema import conforms, document

pytestmark = pytest.mark.django_db

AT = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


@pytest.fixture(scope="module")
def served(django_db_blocker):
    with django_db_blocker.unblock():
        return document()


def every_shape() -> list[type[Shape]]:
    found, pending = [], [Shape]
    while pending:
        for shape in pending.pop().__subclasses__():
            found.append(shape)
            pending.append(shape)
    return found


def full_evaluation() -> Evaluation:
    """An ended evaluation with every column the object shows filled, as the pipeline writes them."""
    evaluation = Evaluation.objects.create(
        task_url="https://example.com/task.tgz",
        agent_code="print(1)",
        status=Status.RUNNING,
        step=Step.RUNNING_TESTS,
        passed=False,
        reward=0.0,
        rewards={"reward": 0.0, "style": 0.5},
        error="running_tests: 1 of 2 tests failed",
        error_kind=ErrorKind.TESTS_FAILED,
        task_sha256="ab" * 32,
        task_format="harbor",
        agent_sha256="cd" * 32,
        metadata={"run": 7},
        started_at=AT,
        agent_output="done\n",
        agent_exit_code=0,
        agent_patch="diff --git a/x b/x\n",
        test_output="1 failed\n",
        results_sha256="ef" * 32,
        egress=[
            EgressRecord("installing_deps", "pypi.org", 443, True, "allowed", 10, 20, 1).as_dict(),
            EgressRecord("running_agent", "10.0.0.1", 80, False, "private address").as_dict(),
        ],
        resources={
            "peak_memory_bytes": 1 << 20,
            "cpu_seconds": 0.25,
            "peak_processes": 3,
            "peak_disk_bytes": 4096,
            "peak_files": 12,
        },  # fmt: skip
        cache="miss",
        environment={
            "kind": "image",
            "ref": "docker.io/library/python:3.12",
            "digest": "sha256:" + "0" * 64,
            "cached": False,
            "rewritten_from": "python:3.12",
        },  # fmt: skip
        limits_applied={"agent_timeout_secs": 600, "network": False},
        task_metadata={"difficulty": "easy"},
        system_changes={"count": 1, "paths": ["/etc/hosts"], "suspicious": False},
        test_counts={"fail_to_pass": {"total": 1, "passed": 0, "failed": 1, "missing": 0}},
        artifacts=[{"path": "trajectory.json", "size_bytes": 2, "sha256": "12" * 32}],
        owner="team-a",
    )
    evaluation.retry_of_id = evaluation.id
    evaluation.save(update_fields=["retry_of_id"])
    Transition.objects.create(evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING, at=AT, duration_ms=3)
    for position, passed in enumerate((True, False)):
        TestResult.objects.create(
            evaluation=evaluation, position=position, name=f"t{position}", kind="fail_to_pass", passed=passed,
            exit_code=None if passed else 1, timed_out=False, duration_ms=5, output="",
        )  # fmt: skip
    assert lifecycle.finish(evaluation.id, Status.FAILED, error=evaluation.error, kind=ErrorKind.TESTS_FAILED)
    return Evaluation.objects.get(id=evaluation.id)


def test_a_full_evaluation_is_its_component(api, served):
    evaluation = full_evaluation()
    body = api.get(f"/evaluate/{evaluation.id}").json()
    assert body == evaluation_json(evaluation)
    assert all(body[key] not in (None, [], {}) for key in ("signature", "egress", "environment", "retry_of"))
    conforms(body, "Evaluation", served)
    conforms(api.get("/evaluations").json()[0], "EvaluationSummary", served)


def test_a_new_evaluation_is_its_component(api, served):
    accepted = api.post("/evaluate", {"agent_code": "x", "task_url": "https://example.com/t.tgz"}, format="json")
    conforms(accepted.json(), "Accepted", served)
    conforms(api.get(f"/evaluate/{accepted.json()['eval_id']}").json(), "Evaluation", served)
    conforms(api.delete(f"/evaluate/{accepted.json()['eval_id']}").json(), "Accepted", served)
    conforms(api.post(f"/evaluate/{accepted.json()['eval_id']}/retry").json(), "RetryAccepted", served)


def test_an_ended_batch_is_its_component(api, served):
    task_urls = ["https://example.com/a.tgz", "https://example.com/b.tgz"]
    accepted = api.post("/batches", {"agent_code": "x", "task_urls": task_urls, "attempts": 2}, format="json")
    conforms(accepted.json(), "BatchAccepted", served)
    batch_id = accepted.json()["batch_id"]
    conforms(api.get(f"/batches/{batch_id}").json(), "Batch", served)
    for n, eval_id in enumerate(accepted.json()["eval_ids"]):
        Evaluation.objects.filter(id=eval_id).update(reward=float(n % 2), passed=bool(n % 2))
        assert lifecycle.finish(eval_id, Status.COMPLETED if n % 2 else Status.FAILED, kind=ErrorKind.TESTS_FAILED)
    assert lifecycle.settle(batch_id)  # what finish leaves to its commit
    body = api.get(f"/batches/{batch_id}").json()
    assert body["status"] == Status.COMPLETED and body["signature"] is not None and body["pass_at_k"] == 0.5
    conforms(body, "Batch", served)
    conforms(api.get("/batches").json()[0], "BatchSummary", served)


def test_a_cancelled_batch_is_its_component(api, served):
    accepted = api.post("/batches", {"agent_code": "x", "task_urls": ["https://example.com/a.tgz"]}, format="json")
    conforms(api.delete(f"/batches/{accepted.json()['batch_id']}").json(), "BatchCancelled", served)


def test_the_service_routes_are_their_components(api, served):
    conforms(api.get("/health").json(), "Health", served)
    conforms(api.get("/status").json(), "Status", served)
    conforms(api.get("/public-key").json(), "PublicKeys", served)


def test_every_shape_is_a_component_with_its_fields(served):
    """A Shape's class is its component: the same name, the same keys, in the order build writes them."""
    schemas = served["components"]["schemas"]
    shapes = every_shape()
    assert {"Evaluation", "Batch", "Status", "Asset", "Environment"} <= {
        s.__name__.removesuffix("Serializer") for s in shapes
    }
    for shape in shapes:
        component = schemas[shape.__name__.removesuffix("Serializer")]
        assert list(component["properties"]) == list(shape._declared_fields), shape


def test_build_takes_exactly_the_given_fields():
    with pytest.raises(TypeError, match="mean_reward"):
        BatchTaskSerializer.build(task_url="u", attempts=1, passes=0, pass_at_k=None)
    with pytest.raises(TypeError, match="extra"):
        BatchTaskSerializer.build(task_url="u", attempts=1, passes=0, pass_at_k=None, mean_reward=None, extra=1)
    assert list(BatchTaskSerializer.build(mean_reward=None, pass_at_k=None, passes=0, attempts=1, task_url="u")) == [
        "task_url", "attempts", "passes", "pass_at_k", "mean_reward",
    ]  # fmt: skip


def test_build_only_reads_the_keys_asked_and_takes_exactly_those_given():
    """What the seal builds (lifecycle._seal_evaluation): a source holding only what those keys read."""
    source = SimpleNamespace(id=uuid.UUID(int=1), task_url="u", agent_patch="never read")
    keys = ("task_url", "eval_id", "agent_patch_sha256", "test_results")
    built = EvaluationSerializer.build_only(keys, source, test_results=[], agent_patch_sha256=None)
    assert built == {"task_url": "u", "eval_id": str(uuid.UUID(int=1)), "agent_patch_sha256": None, "test_results": []}
    with pytest.raises(TypeError, match="test_results"):  # given, never read: it must be passed
        EvaluationSerializer.build_only(keys, source, agent_patch_sha256=None)
    with pytest.raises(TypeError, match="transitions"):  # a value no key asked for
        EvaluationSerializer.build_only(keys, source, test_results=[], agent_patch_sha256=None, transitions=[])
    with pytest.raises(AttributeError):  # a key whose column the source lacks: loud, not read later
        EvaluationSerializer.build_only(("status",), source)
