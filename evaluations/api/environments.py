"""GET /environments: the root filesystems under ENVIRONMENTS_ROOT a task may name, with their runtimes."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations.api.openapi import TAG_SERVICE, UNAUTHORIZED
from evaluations.api.service import RuntimesSerializer
from evaluations.environments import list_environments
from evaluations.representation import Shape


class EnvironmentSerializer(RuntimesSerializer, Shape):
    name = serializers.CharField(help_text="What workspace.yaml `environment:` names.")


class EnvironmentListView(APIView):
    """Behind the bearer token like /evaluations; read from the folder now, so a new one shows without a restart."""

    @extend_schema(
        tags=[TAG_SERVICE],
        summary="The environments (root filesystems) a task may name",
        description="The folders of ENVIRONMENTS_ROOT that are valid environments, by name, with the "
        "versions of python3 and node found in their files (null when absent). Empty without ENVIRONMENTS_ROOT.",
        responses={200: EnvironmentSerializer(many=True), 401: UNAUTHORIZED},
    )
    def get(self, request):
        found = list_environments(settings.EXECUTOR.environments_root)
        return Response([EnvironmentSerializer.build(env) for env in found])
