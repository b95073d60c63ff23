"""The API's content negotiation (evaluations/api/negotiation.py) decides exactly as DRF's own."""

import itertools

import pytest
from django.test import RequestFactory
from rest_framework import renderers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request

from evaluations.api import urls as api_urls
from evaluations.api.negotiation import ContentNegotiation

ACCEPT = [
    None, "*/*", "application/json", "", " ", "text/html", "application/json; indent=4", "application/json;q=0.5",
    "*/*;q=0.8", "application/*", "text/plain, */*", "application/openapi+json", "*/*, application/json",
    "APPLICATION/JSON", "application/json ", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
]  # fmt: skip
FORMAT = [None, "", "json", "api", "openapi", "html"]


def view_renderer_lists():
    lists = {(renderers.JSONRenderer,), (renderers.TemplateHTMLRenderer, renderers.JSONRenderer)}
    lists.add((renderers.JSONRenderer, renderers.BrowsableAPIRenderer))
    for pattern in api_urls.urlpatterns:
        cls = getattr(pattern.callback, "cls", None)
        if cls is not None:
            lists.add(tuple(cls.renderer_classes))
    return sorted(lists, key=repr)


def decide(negotiation, renderer_classes, accept, format_param, suffix):
    query = {"format": format_param} if format_param is not None else {}
    extra = {"HTTP_ACCEPT": accept} if accept is not None else {}
    request = Request(RequestFactory().get("/evaluate", query, **extra))
    try:
        renderer, media_type = negotiation.select_renderer(request, [cls() for cls in renderer_classes], suffix)
    except Exception as exc:  # noqa: BLE001  (the refusal itself is what is compared)
        return type(exc)
    return type(renderer), media_type


@pytest.mark.parametrize("renderer_classes", view_renderer_lists(), ids=lambda r: "+".join(c.__name__ for c in r))
def test_every_accept_header_and_format_decides_as_drf(renderer_classes):
    for _round in range(2):  # the second round meets the remembered answers
        for accept, format_param, suffix in itertools.product(ACCEPT, FORMAT, [None, "json"]):
            ours = decide(ContentNegotiation(), renderer_classes, accept, format_param, suffix)
            drfs = decide(DefaultContentNegotiation(), renderer_classes, accept, format_param, suffix)
            assert ours == drfs, (accept, format_param, suffix)


@pytest.mark.django_db
def test_the_api_uses_it(api):
    from rest_framework.settings import api_settings

    assert api_settings.DEFAULT_CONTENT_NEGOTIATION_CLASS is ContentNegotiation
    assert api.get("/health", HTTP_ACCEPT="text/html").status_code == 406
    assert api.get("/health", HTTP_ACCEPT="application/json").status_code == 200
