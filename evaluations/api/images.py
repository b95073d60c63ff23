"""GET /images: what the image store of this host holds (SPEC §16), one row per reference."""

from __future__ import annotations

from django.conf import settings
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations.images.store import ImageStore


class ImageListView(APIView):
    """Behind the bearer token like /environments; read from IMAGES_DIR on each request, so what
    `manage.py image` or a worker added shows at once. An untagged image's row has ref null."""

    def get(self, request):
        root = settings.EXECUTOR.images_root
        return Response(ImageStore(root).listing() if root.is_dir() else [])
