"""evaluations/db/text.py: large text columns as UTF-8 in the database, on the configured database."""

import hashlib

import pytest

from evaluations import lifecycle
from evaluations.db.text import Utf8Sha256, Utf8Text
from evaluations.models import Evaluation, Status, Step

pytestmark = pytest.mark.django_db

TEXTS = ["a", "\u00e9\u241e\U0001f600\u2028\ufffd", "x" * 300_000 + "\u00e9", "line\n" * 1000]


def running(**fields) -> Evaluation:
    return Evaluation.objects.create(task_url="https://example.com/t.tgz", agent_code="x", status=Status.RUNNING,
                                     step=Step.RUNNING_AGENT, **fields)  # fmt: skip


@pytest.mark.parametrize("text", ["", *TEXTS])
def test_the_digest_is_the_texts_utf8_sha256_and_null_when_empty(text):
    evaluation = running(agent_patch=text)
    digest = Evaluation.objects.filter(id=evaluation.id).values_list(Utf8Sha256("agent_patch"), flat=True).get()
    assert digest == (hashlib.sha256(text.encode()).hexdigest() if text else None)


@pytest.mark.parametrize("text", ["", *TEXTS])
def test_bytes_are_stored_as_the_text_they_encode(text):
    evaluation = running()
    assert Evaluation.objects.filter(id=evaluation.id).update(log=Utf8Text(text.encode())) == 1
    evaluation.refresh_from_db()
    assert evaluation.log == text
    assert Evaluation.objects.filter(id=evaluation.id, log=text).exists()  # text, not a blob: it compares as text


def test_only_bytes_are_taken():
    with pytest.raises(TypeError, match=r"UTF-8 \(bytes\), not str"):
        Utf8Text("a str")


def test_a_staged_text_column_given_as_bytes_is_written_as_text():
    """The kept log reaches lifecycle as its UTF-8 (pipeline/run.py): stored as the same text a str gives."""
    text = "\u241e === running_agent ===\n\u00e9\n"
    evaluation = running()
    progress = lifecycle.Progress(evaluation.id)
    progress.stage(log=text.encode(), agent_output="out")
    assert progress.finish(Status.FAILED, error="running_agent: boom")
    evaluation.refresh_from_db()
    assert (evaluation.log, evaluation.agent_output, evaluation.status) == (text, "out", Status.FAILED)
    assert evaluation.signature is not None
