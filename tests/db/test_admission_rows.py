"""db/admission.Row prepares an INSERT's values exactly as the ORM's get_db_prep_save does, on this database.

Text columns skip the ORM's calls for a str or None (db/admission.keeps_str): the values must
still be the very ones the ORM would send, for every field, value type and database.
"""

import datetime
import uuid

import pytest
from django.db import connections
from django.db.models import CharField, TextField

from evaluations.db import admission
from evaluations.models import Evaluation, Status, Step, Transition

pytestmark = pytest.mark.django_db

SAMPLES = [
    None, "", "text", "é ✓ \u2028", "x" * 3000, Status.PENDING, Step.QUEUED, 0, 7, True, False, 1.5,
    {"A": "1"}, {"nested": [1, None, {"b": True}]}, [], [1, "a"],
    uuid.UUID(int=5), datetime.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
]  # fmt: skip


def plain(prepared):
    """A prepared value as comparable data: psycopg's Jsonb wrappers compare by identity."""
    return type(prepared), getattr(prepared, "obj", prepared)


def orm_value(field, value, db):
    try:
        return "ok", plain(field.get_db_prep_save(value, db))
    except Exception as exc:  # noqa: BLE001  (the ORM's refusal is what is compared)
        return "refused", type(exc)


def row_value(row, name, value, db):
    try:
        return "ok", plain(row.values({name: value}, db)[row.position[name]])
    except Exception as exc:  # noqa: BLE001
        return "refused", type(exc)


@pytest.mark.parametrize("model", [Evaluation, Transition], ids=lambda m: m.__name__)
def test_every_field_and_value_is_prepared_as_the_orm_prepares_it(model):
    db = connections["default"]
    row = admission.Row(model, skip={"id"} if model is Transition else ())
    for field in row.fields:
        for value in SAMPLES:
            ours, theirs = row_value(row, field.attname, value, db), orm_value(field, value, db)
            assert ours == theirs, (field.attname, value)


def test_only_djangos_text_fields_skip_the_calls():
    row = admission.Row(Evaluation)
    for field, text in zip(row.fields, row.text, strict=True):
        assert text is (type(field) in (CharField, TextField)), field.attname
    assert row.text[row.position["agent_code"]] and row.text[row.position["status"]]
    assert not row.text[row.position["env"]] and not row.text[row.position["created_at"]]

    class Shouting(CharField):
        def get_prep_value(self, value):
            return super().get_prep_value(value).upper()

    assert not admission.keeps_str(Shouting(max_length=5))
