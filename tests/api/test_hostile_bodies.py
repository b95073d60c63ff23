"""Bodies a hostile client sends to POST /evaluate and POST /batches: each is a 400 with a
sentence (the parser's invalid_json, or the serializers' invalid_request), never a 500, and
nothing is admitted."""

from __future__ import annotations

import base64
import io
import json
import tarfile

import pytest

from evaluations.api.errors import MAX_ECHO_CHARS
from evaluations.api.parsers import MAX_DEPTH
from evaluations.models import Batch, Evaluation

pytestmark = pytest.mark.django_db

GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}
GOOD_BATCH = {"agent_code": "print('hi')", "task_urls": ["https://example.com/task.tar.gz"]}
ROUTES = {"/evaluate": GOOD, "/batches": GOOD_BATCH}
MIB = 1024 * 1024


def nested(depth: int) -> bytes:
    """A request whose metadata is ``depth`` levels deep, counting the body itself."""
    inner = "1"
    for _ in range(depth - 1):
        inner = '{"a":' + inner + "}"
    return ('{"agent_code": "x", "task_url": "https://example.com/t.tgz", "metadata": ' + inner + "}").encode()


# Each: the raw body, and the sentence its 400 invalid_json carries.
BAD_JSON = {
    "array nesting past the recursion limit": (b"[" * 100_000 + b"]" * 100_000, "is nested more than 64 levels deep"),
    "object nesting past the recursion limit": (
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        "is nested more than 64 levels deep",
    ),
    "nesting under the recursion limit, past MAX_DEPTH": (nested(900), "is nested more than 64 levels deep"),
    "nesting one past MAX_DEPTH": (nested(MAX_DEPTH + 1), "is nested more than 64 levels deep"),
    "a 5000-digit integer": (
        b'{"agent_code": "x", "timeout_secs": ' + b"9" * 5000 + b"}",
        "has an integer of more than 100 digits",
    ),
    "a 5000-digit negative integer in metadata": (
        b'{"metadata": {"n": -' + b"9" * 5000 + b"}}",
        "has an integer of more than 100 digits",
    ),
    "a number past a float": (b'{"timeout_secs": 1e999}', "has a number too large to hold ('1e999')"),
    "NaN": (b'{"timeout_secs": NaN}', "has NaN, which is not a JSON value"),
    "Infinity": (b'{"metadata": {"x": Infinity}}', "has Infinity, which is not a JSON value"),
    "-Infinity": (b'{"metadata": {"x": -Infinity}}', "has -Infinity, which is not a JSON value"),
    "invalid UTF-8": (b'{"agent_code": "\xff\xfe"}', "is not UTF-8 (byte 16)"),
    "a lone UTF-8 continuation byte": (b'{"agent_code": "caf\x80"}', "is not UTF-8 (byte 19)"),
    "a duplicate key": (
        b'{"agent_code": "x", "task_url": "https://a.example/t.tgz", "task_url": "https://b.example/t.tgz"}',
        "gives the key 'task_url' twice in one object",
    ),
    "a duplicate key in metadata": (
        b'{"agent_code": "x", "metadata": {"k": 1, "k": 2}}',
        "gives the key 'k' twice in one object",
    ),
    "an array": (b"[1, 2]", "must be a JSON object, not an array"),
    "a string": (b'"text"', "must be a JSON object, not a string"),
    "a number": (b"7", "must be a JSON object, not a number"),
    "null": (b"null", "must be a JSON object, not null"),
    "not JSON": (
        b"{not json",
        "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("name", sorted(BAD_JSON))
def test_a_body_the_parser_refuses_is_400_invalid_json_with_a_sentence(api, route, name):
    raw, sentence = BAD_JSON[name]
    response = api.post(route, data=raw, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {"error": "invalid_json", "detail": f"the request body {sentence}"}
    assert Evaluation.objects.count() == 0 and Batch.objects.count() == 0


def test_nesting_at_max_depth_is_parsed_and_left_to_the_rules_of_its_field(api):
    response = api.post("/evaluate", data=nested(MAX_DEPTH), content_type="application/json")
    assert response.status_code == 202, response.content  # metadata's own rule: at most 4096 bytes


def test_a_long_but_finite_number_is_a_number(api):
    body = b'{"agent_code": "x", "task_url": "https://example.com/t.tgz", "metadata": {"f": 0.' + b"1" * 5000 + b"}}"
    assert api.post("/evaluate", data=body, content_type="application/json").status_code == 202


# 1 MiB strings in every field, one at a time: the serializers' 400, naming the field.
BIG = "x" * MIB
EVALUATE_FIELDS = {
    "task_url": "https://example.com/" + BIG,
    "agent_language": BIG,
    "callback_url": "https://example.com/" + BIG,
    "agent_archive": BIG,
    "agent_entrypoint": BIG,
    "timeout_secs": BIG,
    "env": {"BIG": BIG},
    "metadata": {"big": BIG},
    "static_assets": {"a": {"path": BIG}},
    BIG: "an unknown field with a 1 MiB name",
}
BATCH_FIELDS = {**{k: v for k, v in EVALUATE_FIELDS.items() if k not in ("task_url", "static_assets")},
                "task_urls": ["https://example.com/" + BIG]}  # fmt: skip


def agent_project() -> str:
    """A real agent archive (base64 of a .tar.gz holding agent.py)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("agent.py")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"1\n"))
    return base64.b64encode(buffer.getvalue()).decode()


def _field_cases():
    for route, fields in (("/evaluate", EVALUATE_FIELDS), ("/batches", BATCH_FIELDS)):
        for name in fields:
            yield pytest.param(route, name, id=f"{route}-{name[:20]}")


@pytest.mark.parametrize(("route", "field"), list(_field_cases()))
def test_a_1_mib_string_in_any_field_is_a_400_naming_it(api, route, field):
    fields = EVALUATE_FIELDS if route == "/evaluate" else BATCH_FIELDS
    body = {**ROUTES[route], field: fields[field]}
    if field in ("agent_archive", "agent_entrypoint"):
        body.pop("agent_code")
        body.setdefault("agent_archive", agent_project())
    response = api.post(route, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    reply = response.json()
    shown = field if len(field) <= MAX_ECHO_CHARS else field[:MAX_ECHO_CHARS] + f"... ({len(field)} characters)"
    assert reply["error"] == "invalid_request" and shown in reply["fields"], str(reply)[:300]
    assert len(response.content) < 8 * 1024  # what it quotes of the 1 MiB is cut, not sent back
    assert Evaluation.objects.count() == 0 and Batch.objects.count() == 0


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_1_mib_agent_code_is_within_its_cap_and_admitted(api, route):
    response = api.post(route, data=json.dumps({**ROUTES[route], "agent_code": BIG}), content_type="application/json")
    assert response.status_code == 202, response.content[:300]
    assert len(Evaluation.objects.get().agent_code) == MIB
