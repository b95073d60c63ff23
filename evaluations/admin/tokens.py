"""Django admin for tenants' tokens (SPEC §20): made here, shown once, kept as their SHA-256 only.

1. Adding a token asks for its tenant's name; the executor draws the token (256 random bits) and
   answers with a page that shows it once (no redirect, no message: a message would sit in the
   session or a cookie). Only its SHA-256 is saved, so no page, log or backup shows it again.
2. Nothing is edited: to rotate, add a new token, hand it over, delete the old one. Deleting a
   token revokes it at the next request.
3. A token here turns auth on by itself (SPEC §21), as AUTH_TOKEN or AUTH_TOKENS do: the first one
   made closes the API to every request without a token. The list says when auth is off (no
   configured token and no row), for then every caller sees everything.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from evaluations.admin import format as fmt
from evaluations.api import auth
from evaluations.models import Token

AUTH_OFF = (
    "AUTH_TOKEN and AUTH_TOKENS are unset and there is no token here: authentication is off and every caller "
    "sees every evaluation. Adding a token here turns it on: every request then needs a token. Set AUTH_TOKEN "
    "too for an operators' token, which sees every tenant's evaluations."
)


@admin.register(Token)
class TokenAdmin(admin.ModelAdmin):
    list_display = ("name", "fingerprint", "created")
    search_fields = ("name",)
    ordering = ("name", "-created_at")
    fields = ("name",)

    def has_change_permission(self, request, obj=None):
        return False  # read-only: rotate by adding and deleting

    def get_readonly_fields(self, request, obj=None):
        return ("name", "fingerprint", "created") if obj else ()

    def get_fields(self, request, obj=None):
        return ("name", "fingerprint", "created") if obj else ("name",)

    def save_model(self, request, obj, form, change):
        token = secrets.token_urlsafe(32)
        obj.sha256 = auth.token_sha256(token)
        obj.save()
        obj.token = token  # on this instance only, for response_add's page

    def response_add(self, request, obj, post_url_continue=None):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Token for {obj.name}",
            "token": obj.token,
            "object": obj,
        }
        # The admin's never_cache makes it no-store: no copy of the token stays in a cache.
        return TemplateResponse(request, "admin/evaluations/token/created.html", context)

    def changelist_view(self, request, extra_context=None):
        if not auth.enabled(settings.EXECUTOR):
            self.message_user(request, AUTH_OFF, messages.WARNING)
        return super().changelist_view(request, extra_context=extra_context)

    @admin.display(description="sha256")
    def fingerprint(self, obj):
        return obj.sha256[:12]

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return fmt.when(obj.created_at)
