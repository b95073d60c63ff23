"""The one error envelope: {"error": code, "detail": sentence[, "fields": {...}]}."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

logger = logging.getLogger("term_executor.api")


class ApiError(exceptions.APIException):
    """An API failure with a stable code: raise it from a view, the handler renders it."""

    def __init__(self, status_code: int, code: str, detail: str, *, fields=None, headers=None, logged=False):
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.code = code
        self.sentence = detail
        self.fields = fields
        self.headers = headers or {}
        # True: the raiser logs this failure its own way, so django.request, which writes an
        # ERROR line for every 4xx/5xx reply, stays quiet about it.
        self.logged = logged


def envelope(code: str, detail: str, fields: dict | None = None) -> dict:
    body = {"error": code, "detail": detail}
    if fields:
        body["fields"] = fields
    return body


# A message or field name quotes what the client sent (an unknown field's name, a bad value):
# past this many characters it is cut, so a 1 MiB name is not sent back twice.
MAX_ECHO_CHARS = 1000


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + f"... ({len(text)} characters)"


def _flatten(errors) -> dict[str, list[str]]:
    """DRF's nested ValidationError detail -> {"field": ["message", ...]}, each cut to MAX_ECHO_CHARS."""
    if isinstance(errors, list):
        return {"non_field_errors": [_clip(str(e)) for e in errors]}
    flat: dict[str, list[str]] = {}
    for name, messages in errors.items():
        if isinstance(messages, dict):
            # Keep the request's own field names as keys: {"env": ["A: Not a valid string."]}.
            flat[_clip(name)] = [_clip(f"{sub}: {m}") for sub, inner in _flatten(messages).items() for m in inner]
        elif isinstance(messages, list):
            flat[_clip(name)] = [_clip(str(m)) for m in messages]
        else:
            flat[_clip(name)] = [_clip(str(messages))]
    return flat


_BY_CLASS = [
    (exceptions.ParseError, "invalid_json", None),
    (exceptions.NotAuthenticated, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required"),
    (exceptions.AuthenticationFailed, "unauthorized", None),
    (exceptions.PermissionDenied, "forbidden", None),
    (exceptions.NotFound, "not_found", None),
    (exceptions.MethodNotAllowed, "method_not_allowed", None),
    (exceptions.NotAcceptable, "not_acceptable", None),
    (exceptions.UnsupportedMediaType, "unsupported_media_type", None),
    (exceptions.Throttled, "throttled", None),
]


def exception_handler(exc, context):
    """DRF's EXCEPTION_HANDLER: every API failure leaves through here."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    if isinstance(exc, ApiError):
        response = Response(envelope(exc.code, exc.sentence, exc.fields), status=exc.status_code, headers=exc.headers)
        if exc.logged:
            response._has_been_logged = True  # what django.utils.log.log_response checks
        return response
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        names = ", ".join(sorted(fields))
        return Response(
            envelope("invalid_request", f"the request is invalid: {names}", fields),
            status=status.HTTP_400_BAD_REQUEST,
        )
    for cls, code, sentence in _BY_CLASS:
        if isinstance(exc, cls):
            headers = {}
            if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
                headers["WWW-Authenticate"] = 'Bearer realm="term-executor"'
                status_code = status.HTTP_401_UNAUTHORIZED
            else:
                status_code = exc.status_code
            detail = sentence or str(exc.detail)
            return Response(envelope(code, detail), status=status_code, headers=headers)
    if isinstance(exc, exceptions.APIException):
        return Response(envelope(exc.default_code, str(exc.detail)), status=exc.status_code)
    logger.exception("unhandled error in %s", context.get("view").__class__.__name__)
    return Response(
        envelope("internal_error", "the executor failed to handle this request; see its log"),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def json_error(status_code: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse(envelope(code, detail), status=status_code)


# Django-level handlers (urls.py), for paths no DRF view answers.
def handler404(request, exception=None):
    return json_error(404, "not_found", f"no route for {request.path}")


def handler500(request):
    return json_error(500, "internal_error", "the executor failed to handle this request; see its log")


def handler400(request, exception=None):
    return json_error(400, "bad_request", "the request could not be understood")


def handler403(request, exception=None):
    return json_error(403, "forbidden", "this request is not allowed")
