"""evaluations/db/text.py: large text columns as UTF-8 in the database, on the configured database."""

import hashlib

import pytest

from evaluations.db.text import Utf8Sha256
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
