"""GET /images: what the image store of this host holds (SPEC §16), one row per reference.

SPEC §21: an operator's token (or auth off) sees every row; a tenant's sees only the images its own
evaluations ran in (their ``environment.digest``), and a reference only if one of its evaluations
named it: another tenant's private name for the same content stays unseen. An image it used only
under another's names (or built from a Dockerfile) is one row with ref null.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations.api.openapi import TAG_SERVICE, UNAUTHORIZED
from evaluations.images.errors import ImageError
from evaluations.images.reference import parse
from evaluations.images.store import ImageStore
from evaluations.models import Evaluation


# A row of ImageStore.listing, as served.
class ImageSerializer(serializers.Serializer):
    ref = serializers.CharField(
        allow_null=True,
        help_text="A reference to the image in its canonical form (`docker.io/library/python:3.12-slim`); an "
        "image with two tags is two rows; null for an image no reference names (built without a tag, imported "
        "from an untagged archive).",
    )
    digest = serializers.CharField(
        help_text="The image's manifest digest, `sha256:...` (a built image's: of its manifest)."
    )
    size_bytes = serializers.IntegerField(
        min_value=0, help_text="Its unpacked layers' bytes (shared layers counted in each)."
    )
    last_used_at = serializers.DateTimeField(help_text="Last pulled, built, imported or used by an evaluation.")


class ImageListView(APIView):
    """Behind the bearer token like /environments; read from IMAGES_DIR on each request, so what
    `manage.py image` or a worker added shows at once. An untagged image's row has ref null."""

    @extend_schema(
        tags=[TAG_SERVICE],
        summary="The images this host's store holds",
        description="One row per reference, most recently used first (an image with two tags is two rows; "
        "one no reference names has ref null), read from IMAGES_DIR on each request. Pulls, builds and "
        "imports add images; IMAGES_MAX_BYTES evicts the least recently used.",
        responses={200: ImageSerializer(many=True), 401: UNAUTHORIZED},
    )
    def get(self, request):
        config = settings.EXECUTOR
        root = config.images_root
        rows = ImageStore(root).listing() if root.is_dir() else []
        if request.user.owner is None:
            return Response(rows)
        return Response(tenant_rows(rows, used_by(request.user, config)))


def used_by(caller, config) -> dict[str, set[str]]:
    """{digest: the references (canonical, as the store keeps them) ``caller``'s evaluations named it by}."""
    used: dict[str, set[str]] = {}
    mine = caller.visible(Evaluation.objects).filter(environment__kind__in=("image", "dockerfile"))
    for kind, ref, digest in mine.values_list(
        "environment__kind", "environment__ref", "environment__digest"
    ).distinct():
        if not isinstance(digest, str):
            continue  # failed before its image was had
        names = used.setdefault(digest, set())
        if kind == "image" and isinstance(ref, str):
            try:
                names.add(str(parse(ref, config.image_default_registry)))
            except ImageError:
                names.add(ref)
    return used


def tenant_rows(rows: list[dict], used: dict[str, set[str]]) -> list[dict]:
    """The rows of ``rows`` (the store's listing, in its order) a tenant that ``used`` these may see."""
    named = {row["digest"] for row in rows if row["digest"] in used and row["ref"] in used[row["digest"]]}
    shown: list[dict] = []
    nameless: set[str] = set()
    for row in rows:
        digest = row["digest"]
        if digest not in used:
            continue
        if digest in named:
            if row["ref"] in used[digest]:
                shown.append(row)
        elif digest not in nameless:  # used under no name of the tenant's own: once, ref null
            shown.append({**row, "ref": None})
            nameless.add(digest)
    return shown
