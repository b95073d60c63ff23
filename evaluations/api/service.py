"""GET /health, /status and /public-key: the service's own routes, public (no token).

Each carries its OpenAPI description (``extend_schema``); a body built here is a ``Shape``
declared beside its view, so what is served and what is described are one declaration.
"""

from __future__ import annotations

import os
import time

from django.conf import settings
from django.db import connection
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations import VERSION, checks, environments, languages, signing
from evaluations.api import auth
from evaluations.api.errors import envelope
from evaluations.api.openapi import TAG_SERVICE, ErrorSerializer
from evaluations.db import stats
from evaluations.representation import Shape, given

STARTED_AT = time.time()


class PublicView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    if connection.vendor == "sqlite":
        # An open connection keeps answering after its file is deleted or replaced.
        name = str(connection.settings_dict["NAME"])
        in_memory = name == ":memory:" or "mode=memory" in name
        if not in_memory and not os.path.isfile(name):
            raise OSError(f"SQLite file {name} is missing")


class HealthSerializer(Shape):
    status = given(serializers.ChoiceField(choices=["ok"]))


# The error envelope (errors.envelope) with the checks that failed.
class UnhealthySerializer(ErrorSerializer):
    status = serializers.ChoiceField(choices=["unhealthy"])
    checks = serializers.DictField(child=serializers.CharField())


class HealthView(PublicView):
    @extend_schema(
        tags=[TAG_SERVICE],
        summary="Liveness and database check",
        responses={200: HealthSerializer, 503: OpenApiResponse(UnhealthySerializer, "Database unreachable")},
    )
    def get(self, request):
        try:
            _check_database()
        except Exception as exc:  # any driver error means the database is unreachable
            body = {"status": "unhealthy", "checks": {"database": f"error: {exc.__class__.__name__}"}}
            body.update(envelope("unhealthy", f"database unreachable: {exc}".strip()))
            return Response(body, status=http.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(HealthSerializer.build(status="ok"))


# What signing.PublicKey.as_json gives.
class PublicKeySerializer(serializers.Serializer):
    key_id = serializers.CharField(help_text="The first 16 hex digits of the sha256 of the raw 32-byte key.")
    alg = serializers.ChoiceField(choices=["ed25519"])
    public_key_pem = serializers.CharField(help_text="SubjectPublicKeyInfo PEM.")
    created_at = serializers.DateTimeField()


class PublicKeysSerializer(Shape):
    keys = given(
        PublicKeySerializer(
            many=True, help_text="The current key first, then every earlier one, so results they signed still verify."
        )
    )


class PublicKeyView(PublicView):
    """SPEC §18: the keys results are signed with, the current first; public, as a platform
    verifying a saved result may hold no token of this service."""

    @extend_schema(
        tags=[TAG_SERVICE],
        summary="The public keys results are signed with (the current first)",
        responses=PublicKeysSerializer,
    )
    def get(self, request):
        keys = signing.keyring(settings.EXECUTOR).public_keys()
        return Response(PublicKeysSerializer.build(keys=[key.as_json() for key in keys]))


# What environments.runtimes gives.
class RuntimesSerializer(serializers.Serializer):
    python = serializers.CharField(allow_null=True, help_text="python3's version, e.g. `3.11.2`; null if absent.")
    node = serializers.CharField(allow_null=True, help_text="node's version, e.g. `20.20.2`; null if absent.")


class SandboxLimitsSerializer(serializers.Serializer):
    memory = serializers.CharField(help_text="How memory is held: `cgroup v2`, `cgroup v1` or `monitor`.")
    processes = serializers.CharField(help_text="How processes are held, as memory.")


class StatusSerializer(Shape):
    version = given(serializers.CharField())
    uptime_secs = given(serializers.IntegerField(min_value=0))
    active_evals = given(serializers.IntegerField(min_value=0))
    queued_evals = given(serializers.IntegerField(min_value=0))
    total_evals = given(serializers.IntegerField(min_value=0))
    passed = given(serializers.IntegerField(min_value=0))
    failed = given(serializers.IntegerField(min_value=0))
    cancelled = given(serializers.IntegerField(min_value=0))
    capacity = given(serializers.IntegerField(min_value=0))
    available_slots = given(serializers.IntegerField(min_value=0))
    workers = given(serializers.IntegerField(min_value=0))
    sandbox = given(serializers.ChoiceField(choices=["bwrap", "none"]))
    sandbox_state = given(
        serializers.CharField(help_text="The sandbox and its limits in words, with the uids commands run as.")
    )
    limits = given(SandboxLimitsSerializer(help_text="How the live workers (or one started here) hold limits."))
    warnings = given(
        serializers.ListField(
            child=serializers.CharField(), help_text="What commands are not kept from here (no sandbox, not root)."
        )
    )
    auth = given(serializers.ChoiceField(choices=["enabled", "disabled"]))
    languages = given(serializers.ListField(child=serializers.CharField()))
    static_assets = given(
        serializers.IntegerField(min_value=0, help_text="How many executor-level assets GET /assets lists.")
    )
    environments = given(
        serializers.IntegerField(min_value=0, help_text="How many environments GET /environments lists.")
    )
    runtimes = given(RuntimesSerializer(help_text="What the host itself offers to tasks that name no environment."))


class StatusView(PublicView):
    @extend_schema(tags=[TAG_SERVICE], summary="Counts, capacity, sandbox and auth mode", responses=StatusSerializer)
    def get(self, request):
        config = settings.EXECUTOR
        counts = stats.evaluation_counts()
        workers = stats.live_workers(config.worker_stale_secs)
        capacity = sum(w.capacity for w in workers) if workers else config.max_concurrent_evals
        state = checks.sandbox_state(workers)
        return Response(
            StatusSerializer.build(
                version=VERSION,
                uptime_secs=int(time.time() - STARTED_AT),
                active_evals=counts["running"],
                queued_evals=counts["pending"],
                total_evals=counts["total"],
                passed=counts["passed"],
                failed=counts["failed"],
                cancelled=counts["cancelled"],
                capacity=capacity,
                available_slots=max(0, capacity - counts["running"]),
                workers=len(workers),
                sandbox=state.mode,
                sandbox_state=state.words,
                limits={"memory": state.limits, "processes": state.limits},
                warnings=checks.sandbox_warnings(state.mode, state.limits),
                auth="enabled" if auth.enabled(config) else "disabled",
                languages=list(languages.available()),
                static_assets=len(config.static_assets),
                environments=len(environments.list_environments(config.environments_root)),
                runtimes=environments.runtimes(),
            )
        )
