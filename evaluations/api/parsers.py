"""A JSON parser that reads at most the allowed body size, whatever the transfer encoding."""

from __future__ import annotations

import json

from django.conf import settings
from rest_framework.parsers import BaseParser

from evaluations.api.errors import ApiError


class BoundedJSONParser(BaseParser):
    """Parse any request body as JSON (curl -d sends form type), refusing a body over the cap."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.EXECUTOR.max_body_bytes
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ApiError(413, "payload_too_large", f"the request body is over {limit} bytes")
        try:
            return json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_json", "the request body is not UTF-8") from None
        except json.JSONDecodeError as exc:
            raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from None
