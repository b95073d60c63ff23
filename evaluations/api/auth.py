"""Bearer-token auth: several comma-separated tokens (rotation), compared in constant time."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from rest_framework import authentication, exceptions, permissions


class TokenUser:
    """The caller behind a valid token; `scope` keys its Idempotency-Keys."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, token: str):
        self.scope = hashlib.sha256(token.encode()).hexdigest()[:32]


class AnonymousCaller:
    """Auth disabled: every caller shares one scope."""

    is_authenticated = True
    is_anonymous = True
    scope = "anonymous"


def token_matches(candidate: str, tokens: tuple[str, ...]) -> bool:
    # Compare with every token, without stopping early, so timing says nothing.
    found = False
    for token in tokens:
        found |= hmac.compare_digest(candidate.encode(), token.encode())
    return found


class BearerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        tokens = settings.EXECUTOR.auth_tokens
        if not tokens:
            return (AnonymousCaller(), None)
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, credential = header.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise exceptions.AuthenticationFailed("the Authorization header must be 'Bearer <token>'")
        if not token_matches(credential, tokens):
            raise exceptions.AuthenticationFailed("the bearer token is not valid")
        return (TokenUser(credential), credential)

    def authenticate_header(self, request):
        return 'Bearer realm="term-executor"'


class TokenRequired(permissions.BasePermission):
    def has_permission(self, request, view):
        return request.user is not None and request.user.is_authenticated
