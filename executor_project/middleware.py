"""The admin's middleware (sessions, CSRF, auth, messages), passed by for the token API.

The routes behind the bearer token are DRF views: CSRF-exempt, and none reads a
session, a user from a cookie or a message. Yet these four middleware ran for
each of their requests, building a session store, a lazy user and a message
store that nothing used: a visible share of each request's CPU (bench/RESULTS.md).
A request passes them by only when they could not change its reply: its path is
one of those routes and it carries no cookie. With a cookie they run as always (a
stale session cookie is deleted in the reply, a malformed CSRF cookie replaced),
and so they do for every other path: /admin/, /api/docs, /metrics (a plain Django
view: CSRF refuses its POSTs), a path no route matches.
"""

from __future__ import annotations

import re

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.csrf import CsrfViewMiddleware

# The DRF routes of evaluations/api/urls.py that the bearer token guards, and /health, /status and /public-key.
TOKEN_API_PATH = re.compile(
    r"/(?:evaluate(?:/[^/]+(?:/logs|/events|/retry|/artifacts/[\s\S]+)?)?|evaluations|batches(?:/[^/]+(?:/events)?)?"
    r"|sandboxes(?:/[^/]+(?:/exec|/files|/network|/services/[^/]+/stop)?)?"
    r"|assets|environments"
    r"|images|health|status|public-key)"
)


def passes_by(request) -> bool:
    """True when the admin's middleware has nothing to do for this request."""
    return not request.META.get("HTTP_COOKIE") and TOKEN_API_PATH.fullmatch(request.path_info) is not None


class _AdminOnly:
    """Mixin for a MiddlewareMixin middleware: run it unless the request passes it by."""

    def __call__(self, request):
        if passes_by(request):
            return self.get_response(request)
        return super().__call__(request)


class AdminSessionMiddleware(_AdminOnly, SessionMiddleware):
    pass


class AdminCsrfViewMiddleware(_AdminOnly, CsrfViewMiddleware):
    def process_view(self, request, callback, callback_args, callback_kwargs):
        if passes_by(request):
            return None
        return super().process_view(request, callback, callback_args, callback_kwargs)


class AdminAuthenticationMiddleware(_AdminOnly, AuthenticationMiddleware):
    pass


class AdminMessageMiddleware(_AdminOnly, MessageMiddleware):
    pass
