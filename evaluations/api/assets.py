"""GET /assets: the executor's own static assets, as loaded from STATIC_ASSETS_CONFIG at start."""

from __future__ import annotations

from django.conf import settings
from rest_framework.response import Response
from rest_framework.views import APIView

from assets import tree_bytes


def asset_json(asset) -> dict:
    try:
        size = tree_bytes(asset.source)
    except OSError:  # gone since start; the evaluation will say so
        size = None
    return {"name": asset.name, "save_path": asset.save_path, "kind": asset.kind, "size_bytes": size}


class AssetListView(APIView):
    """Behind the bearer token like /evaluations; sizes are measured now (apparent bytes of regular files)."""

    def get(self, request):
        return Response([asset_json(asset) for asset in settings.EXECUTOR.static_assets])
