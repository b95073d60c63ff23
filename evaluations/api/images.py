"""GET /images: what the image store of this host holds (SPEC §16), one row per reference.

SPEC §21: an operator's token (or auth off) sees every row; a tenant's sees only the images its own
evaluations ran in (their ``environment.digest``), and a reference only if one of its evaluations
named it: another tenant's private name for the same content stays unseen. An image it used only
under another's names (or built from a Dockerfile) is one row with ref null.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations.images.errors import ImageError
from evaluations.images.reference import parse
from evaluations.images.store import ImageStore
from evaluations.models import Evaluation


class ImageListView(APIView):
    """Behind the bearer token like /environments; read from IMAGES_DIR on each request, so what
    `manage.py image` or a worker added shows at once. An untagged image's row has ref null."""

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
