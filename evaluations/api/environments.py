"""GET /environments: the root filesystems under ENVIRONMENTS_ROOT a task may name, with their runtimes."""

from __future__ import annotations

from django.conf import settings
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations.environments import list_environments


class EnvironmentListView(APIView):
    """Behind the bearer token like /evaluations; read from the folder now, so a new one shows without a restart."""

    def get(self, request):
        found = list_environments(settings.EXECUTOR.environments_root)
        return Response([{"name": env.name, "python": env.python, "node": env.node} for env in found])
