"""GET /assets: the executor's own static assets, as loaded from STATIC_ASSETS_CONFIG at start."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from assets import tree_bytes
from evaluations.api.openapi import TAG_SERVICE, UNAUTHORIZED
from evaluations.representation import Shape, shown


def _size(asset) -> int | None:
    try:
        return tree_bytes(asset.source)
    except OSError:  # gone since start; the evaluation will say so
        return None


# An executor-level asset (config.StaticAsset) with its size now.
class AssetSerializer(Shape):
    name = serializers.CharField()
    save_path = serializers.CharField()
    kind = serializers.ChoiceField(choices=["file", "dir"])
    size_bytes = shown(
        serializers.IntegerField(allow_null=True, min_value=0, help_text="null if it vanished since start."), _size
    )


class AssetListView(APIView):
    """Behind the bearer token like /evaluations; sizes are measured now (apparent bytes of regular files)."""

    @extend_schema(
        tags=[TAG_SERVICE],
        summary="The executor-level static assets",
        responses={200: AssetSerializer(many=True), 401: UNAUTHORIZED},
    )
    def get(self, request):
        return Response([AssetSerializer.build(asset) for asset in settings.EXECUTOR.static_assets])
