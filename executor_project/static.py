"""/static/: the installed apps' files (the admin's, Swagger UI's), served by the service itself.

No collectstatic step, no CDN and no extra package: Django's finders locate
each file in its app, so /api/docs works offline and the admin keeps its look
under gunicorn. They are few and small, and browsers cache them.
"""

from __future__ import annotations

from django.contrib.staticfiles.views import serve
from django.core.exceptions import SuspiciousFileOperation
from django.http import Http404


def static_file(request, path):
    try:
        return serve(request, path, insecure=True)  # "insecure": allowed with DEBUG off
    except SuspiciousFileOperation:  # a path that leaves the apps' static folders
        raise Http404(path) from None
