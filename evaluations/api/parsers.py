"""A JSON parser that reads at most the allowed body size, whatever the transfer encoding.

Every body it refuses is 400 ``invalid_json`` with a sentence saying why, never a 500:

1. not UTF-8, or not JSON;
2. nested deeper than ``MAX_DEPTH`` (a body near the interpreter's recursion limit would pass
   the parser and fail the next code that walks it; deeper still, the parser itself raises
   RecursionError);
3. an integer of more than ``MAX_INTEGER_DIGITS`` digits (Python refuses to convert one over
   4300, with a ValueError), a number too large for a float (``1e999``), and ``NaN``,
   ``Infinity``, ``-Infinity`` (Python's json reads them; JSON has no such values);
4. a key given twice in one object (JSON leaves it undefined which one counts: a request
   whose reader and writer might disagree on a field is refused, not guessed);
5. anything but an object (every body of the API is one).
"""

from __future__ import annotations

import json
import math

from django.conf import settings
from rest_framework.parsers import BaseParser

from evaluations.api.errors import ApiError
from evaluations.api.limits import max_body_bytes

MAX_DEPTH = 64
MAX_INTEGER_DIGITS = 100
_SHOWN_CHARS = 40


class BoundedJSONParser(BaseParser):
    """Parse any request body as JSON (curl -d sends form type), refusing a body over the cap."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        limit = max_body_bytes(settings.EXECUTOR)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ApiError(413, "payload_too_large", f"the request body is over {limit} bytes")
        try:
            return parse_body(raw)
        except _Refused as exc:
            raise ApiError(400, "invalid_json", f"the request body {exc}") from None


class _Refused(ValueError):
    """Why a body is refused, as the end of a sentence starting "the request body"."""


def parse_body(raw: bytes) -> dict:
    """The JSON object ``raw`` holds; ``_Refused`` for every body the rules above refuse."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Refused(f"is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_int=_integer,
            parse_float=_float,
            parse_constant=_constant,
        )
    except json.JSONDecodeError as exc:
        raise _Refused(f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise _Refused(f"is nested more than {MAX_DEPTH} levels deep") from None
    if not isinstance(value, dict):
        raise _Refused(f"must be a JSON object, not {_kind(value)}")
    _check_depth(value)
    return value


def _object(pairs: list[tuple[str, object]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"gives the key {_shown(key)} twice in one object")
            seen.add(key)
    return value


def _integer(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _Refused(f"has an integer of more than {MAX_INTEGER_DIGITS} digits")
    return int(digits)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"has a number too large to hold ({_shown(text)})")
    return value


def _constant(name: str):
    raise _Refused(f"has {name}, which is not a JSON value")


def _check_depth(value: dict) -> None:
    """Walk the containers (leaves are not pushed), stopping at the first one past MAX_DEPTH."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _Refused(f"is nested more than {MAX_DEPTH} levels deep")
        children = container.values() if isinstance(container, dict) else container
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")
