"""DRF's content negotiation, with its answer for the usual Accept headers kept per renderer list.

Every API request is negotiated, and DRF parses the Accept header and each renderer's
media type into objects each time, as much CPU as a SELECT (bench/RESULTS.md). Clients send
no Accept, ``*/*`` or ``application/json``, so for those exact headers (and no format
override) the answer DRF gave the first time is given again: the same renderer class,
the same media type. Anything else, and every refusal (406), goes through DRF.
"""

from __future__ import annotations

from rest_framework.negotiation import DefaultContentNegotiation

USUAL_ACCEPT = frozenset({None, "*/*", "application/json"})  # None: no Accept header


class ContentNegotiation(DefaultContentNegotiation):
    _answers: dict[tuple, tuple[int, str]] = {}  # (renderer classes, Accept) -> (renderer's index, media type)

    def select_renderer(self, request, renderers, format_suffix=None):
        accept = request.META.get("HTTP_ACCEPT")
        if accept not in USUAL_ACCEPT or format_suffix or self._format_param(request):
            return super().select_renderer(request, renderers, format_suffix)
        key = (tuple(type(renderer) for renderer in renderers), accept)
        answer = self._answers.get(key)
        if answer is None:
            renderer, media_type = super().select_renderer(request, renderers, format_suffix)
            answer = self._answers[key] = (renderers.index(renderer), media_type)
        index, media_type = answer
        return renderers[index], media_type

    def _format_param(self, request):
        """The ?format= value DRF would read; without a query string there is none (and no QueryDict to build)."""
        if not request.META.get("QUERY_STRING"):
            return None
        return request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)
