"""The one exception the client raises for an answer it cannot use."""

from __future__ import annotations

import json


class TermExecutorError(RuntimeError):
    """The service refused a request, or a sandbox failed.

    ``status`` is the HTTP status (``None`` when no answer says it: a sandbox that failed while
    starting, or a wait that ran out); ``error`` the envelope's code (``not_found``, ``gone``,
    ``at_capacity``, ``task_invalid``, ...); ``detail`` its sentence; ``fields`` the envelope's
    per-field messages of an ``invalid_request`` (``{"cpus": ["..."]}``), else empty.
    """

    def __init__(self, status: int | None, error: str, detail: str = "", fields: dict | None = None):
        self.status = status
        self.error = error
        self.detail = detail
        self.fields = fields or {}
        where = f"HTTP {status} " if status is not None else ""
        super().__init__(f"{where}{error}: {detail}" if detail else f"{where}{error}")

    @classmethod
    def from_response(cls, status: int, body: bytes) -> TermExecutorError:
        """Read the service's envelope ``{"error": code, "detail": sentence}``; anything else (a proxy's
        HTML page, an empty body) keeps its first 500 characters as the detail."""
        try:
            envelope = json.loads(body)
        except ValueError:
            envelope = None
        if isinstance(envelope, dict) and isinstance(envelope.get("error"), str):
            detail = envelope.get("detail", "")
            fields = envelope.get("fields")
            return cls(
                status,
                envelope["error"],
                detail if isinstance(detail, str) else json.dumps(detail),
                fields if isinstance(fields, dict) else None,
            )
        return cls(status, f"http_{status}", body[:500].decode("utf-8", "replace").strip())
