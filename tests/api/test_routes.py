"""The root URLconf lists the API's routes first and unnested (executor_project/urls.py): same names, same views."""

import re

import pytest
from django.urls import resolve, reverse

from evaluations.api import urls as api_urls

EVAL_ID = "539daf26-ccf3-4b91-833f-5036f0017394"


@pytest.mark.parametrize("pattern", api_urls.urlpatterns, ids=lambda p: p.name)
def test_each_api_route_resolves_to_its_view_under_its_name(pattern):
    names = re.findall(r"<\w+:(\w+)>", str(pattern.pattern))  # eval_id, batch_id, an artifact's path
    path = reverse(pattern.name, kwargs={name: EVAL_ID for name in names} or None)
    match = resolve(path)
    assert path == "/" + re.sub(r"<\w+:\w+>", EVAL_ID, str(pattern.pattern))
    assert match.func is pattern.callback
    assert match.view_name == pattern.name  # the label django-prometheus counts requests by
    assert match.route == str(pattern.pattern)


def test_the_admin_and_static_files_still_resolve():
    assert resolve("/admin/").view_name == "admin:index"
    assert resolve("/static/admin/css/base.css").view_name == "static"
