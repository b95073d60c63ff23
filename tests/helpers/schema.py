"""A served object checked against the OpenAPI component that describes it (GET /api/schema).

drf-spectacular writes OpenAPI 3.0: ``nullable: true`` beside a type, ``$ref`` into
``components``. ``conforms`` turns the components into JSON Schema (draft 7) and makes every
described object closed (no key the component does not list), so an object fails on a key
missing (``required``), a key extra, or a value of another type.
"""

from __future__ import annotations

import copy

from jsonschema import Draft7Validator
from rest_framework.test import APIClient


def document() -> dict:
    """The OpenAPI document as the service serves it."""
    reply = APIClient().get("/api/schema")
    assert reply.status_code == 200, reply.content
    return reply.json()


def conforms(value, component: str, served: dict | None = None) -> None:
    """Assert ``value`` is what ``component`` (e.g. ``Evaluation``) of the served document describes."""
    components = _json_schema(copy.deepcopy((served or document())["components"]))
    schema = {"$ref": f"#/components/schemas/{component}", "components": components}
    validator = Draft7Validator(schema, format_checker=Draft7Validator.FORMAT_CHECKER)
    problems = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    assert not problems, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in problems)


def _json_schema(node):
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _json_schema(value) for key, value in node.items()}
    if "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if node.pop("nullable", False):
        node = {"anyOf": [{"type": "null"}, node]}
    return node
