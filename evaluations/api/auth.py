"""Bearer-token auth: operators' tokens (AUTH_TOKEN, several for rotation) and tenants' named tokens
(AUTH_TOKENS, and the admin's Token rows, kept as their SHA-256 only).

The configured tokens are compared in constant time. A token that is none of them is looked up by
its SHA-256 among the Token rows: an index lookup of a digest, which tells a guesser nothing about
how close a guess came.

Auth is on when AUTH_TOKEN or AUTH_TOKENS is set, or when any Token row exists (SPEC §21: a token
made in the admin must not leave the API open to everyone else). ``enabled`` decides it, for every
request and every page that says so:

1. The configured tokens are the config's, read once; the rows are the database's, and any web
   process (or the admin on another host) may add one at any moment. So whether rows exist is
   never cached: a cached "no rows" would leave a process open after the first token was made,
   for as long as the cache lives, with no way to reach every gunicorn worker to invalidate it.
2. It costs one ``SELECT ... LIMIT 1`` of a small table per request, and only when the config
   holds no token: about 55 us on SQLite and 120 us on PostgreSQL (on a GET /evaluate/{id} of
   some 400-700 us in process, measured on the 2-core CI host). With a configured token it never runs.
3. With rows and no configured token there is no operator's token: every token is a tenant's,
   and only the admin sees every evaluation. Set AUTH_TOKEN to have one.

The caller is a ``Caller``: an operator's (``owner`` None) sees every evaluation and batch; a
tenant's sees only those it created (``visible``). Rows record their creator in ``owner``, and
every route reads through ``visible`` or ``may_see``: another tenant's row is 404 ``not_found``,
as an id that does not exist, so ids do not leak.
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from rest_framework import authentication, exceptions, permissions

from evaluations.models import Token


class Caller:
    """Who sent the request. ``scope`` keys its Idempotency-Keys; ``owner`` is what its rows record."""

    is_authenticated = True

    def __init__(self, *, owner: str | None, scope: str, is_anonymous: bool = False):
        self.owner = owner
        self.scope = scope
        self.is_anonymous = is_anonymous

    def visible(self, queryset):
        """The rows of ``queryset`` (evaluations or batches) this caller may see."""
        return queryset if self.owner is None else queryset.filter(owner=self.owner)

    def may_see(self, owner: str | None) -> bool:
        """Whether a row whose ``owner`` column holds this is the caller's to see."""
        return self.owner is None or owner == self.owner


def operator(token: str) -> Caller:
    """An AUTH_TOKEN: keys scoped per token, as before tenants (rotated tokens keep apart)."""
    return Caller(owner=None, scope=hashlib.sha256(token.encode()).hexdigest()[:32])


def tenant(name: str) -> Caller:
    """A named token: keys scoped per tenant. The "tenant:" prefix keeps the scope apart from every
    operator's (32 hex digits), whatever a token holds."""
    return Caller(owner=name, scope="tenant:" + hashlib.sha256(name.encode()).hexdigest()[:32])


ANONYMOUS = Caller(owner=None, scope="anonymous", is_anonymous=True)  # auth disabled: one shared scope


def identify(candidate: str, operator_tokens: tuple[str, ...], tenant_tokens: tuple[tuple[str, str], ...]):
    """The Caller whose token ``candidate`` is, or None. Every token is compared, without stopping
    early, so the time taken says nothing about how much of a token matched, or which."""
    given = candidate.encode()
    is_operator = False
    for token in operator_tokens:
        is_operator |= hmac.compare_digest(given, token.encode())
    named = None
    for name, token in tenant_tokens:
        if hmac.compare_digest(given, token.encode()):
            named = name
    if is_operator:
        return operator(candidate)
    return tenant(named) if named is not None else None


def token_sha256(token: str) -> str:
    """What a Token row keeps of its token."""
    return hashlib.sha256(token.encode()).hexdigest()


def stored(candidate: str) -> Caller | None:
    """The tenant of the admin's Token row for ``candidate``, or None."""
    name = Token.objects.filter(sha256=token_sha256(candidate)).values_list("name", flat=True).first()
    return tenant(name) if name is not None else None


def enabled(config) -> bool:
    """Whether requests need a token: a configured one, or any Token row (read now, never cached)."""
    return config.auth_enabled or Token.objects.exists()


class BearerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        config = settings.EXECUTOR
        if not enabled(config):
            return (ANONYMOUS, None)
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, credential = header.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise exceptions.AuthenticationFailed("the Authorization header must be 'Bearer <token>'")
        caller = identify(credential, config.auth_tokens, config.tenant_tokens) or stored(credential)
        if caller is None:
            raise exceptions.AuthenticationFailed("the bearer token is not valid")
        return (caller, credential)

    def authenticate_header(self, request):
        return 'Bearer realm="term-executor"'


class TokenRequired(permissions.BasePermission):
    def has_permission(self, request, view):
        return request.user is not None and request.user.is_authenticated
