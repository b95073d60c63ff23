"""The admin's middleware is passed by for the token API (executor_project/middleware.py), changing no reply.

Each request below is sent through Django's own middleware list (sessions, CSRF, auth,
messages for every request) and through the project's; the replies must be the same:
status, headers, cookies set and body, for successes and every kind of refusal, with
auth on and off, with and without cookies.
"""

import json
import re
import uuid

import pytest
from django.test import override_settings
from django.urls import get_resolver
from rest_framework.test import APIClient
from rest_framework.views import APIView

from evaluations.api import urls as api_urls
from evaluations.models import Evaluation, Status, Step, Transition
from executor_project import middleware
from executor_project.settings import MIDDLEWARE

pytestmark = pytest.mark.django_db

DJANGO_MIDDLEWARE = [
    {
        "executor_project.middleware.AdminSessionMiddleware": "django.contrib.sessions.middleware.SessionMiddleware",
        "executor_project.middleware.AdminCsrfViewMiddleware": "django.middleware.csrf.CsrfViewMiddleware",
        "executor_project.middleware.AdminAuthenticationMiddleware": (
            "django.contrib.auth.middleware.AuthenticationMiddleware"
        ),
        "executor_project.middleware.AdminMessageMiddleware": "django.contrib.messages.middleware.MessageMiddleware",
    }.get(name, name)
    for name in MIDDLEWARE
]
GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}


def reply(response) -> tuple:
    body = response.content
    if response.get("Content-Type") == "application/json" and body.startswith(b"{"):
        parsed = json.loads(body)
        parsed.pop("uptime_secs", None)  # /status: the clock moves between the two runs
        body = parsed
    cookies = sorted((name, morsel["path"], morsel["max-age"]) for name, morsel in response.cookies.items())
    return response.status_code, sorted(response.items()), cookies, body


def requests(eval_id: str, token: str | None) -> list[tuple]:
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    post = {"content_type": "application/json", **auth}
    stale_cookies = {"HTTP_COOKIE": "csrftoken=bad; sessionid=gone"}
    return [
        ("get", "/health", {}),
        ("get", "/status", {}),
        ("get", f"/evaluate/{eval_id}", auth),
        ("get", f"/evaluate/{eval_id}", {}),
        ("get", f"/evaluate/{eval_id}", {**auth, "HTTP_AUTHORIZATION": "Bearer wrong"}),
        ("get", f"/evaluate/{eval_id}", {**auth, "HTTP_ACCEPT": "text/html"}),
        ("get", f"/evaluate/{eval_id}", {**auth, "HTTP_ACCEPT": "application/json; indent=2"}),
        ("head", f"/evaluate/{eval_id}", auth),
        ("options", f"/evaluate/{eval_id}", auth),
        ("get", "/evaluate/not-a-uuid", auth),
        ("get", f"/evaluate/{uuid.UUID(int=7)}", auth),
        ("get", f"/evaluate/{eval_id}/logs", auth),
        ("delete", f"/evaluate/{eval_id}", auth),
        ("get", "/evaluate", auth),
        ("put", "/evaluate", {**post, "data": "{}"}),
        ("post", "/evaluate", {**post, "data": json.dumps(GOOD), "HTTP_IDEMPOTENCY_KEY": "same-key"}),
        ("post", "/evaluate", {**post, "data": json.dumps({**GOOD, "env": {"PATH": "/x"}})}),
        ("post", "/evaluate", {**post, "data": "{not json"}),
        ("get", "/evaluations", auth),
        ("get", "/evaluations?limit=0", auth),
        ("get", "/assets", auth),
        ("get", "/environments", auth),
        # With cookies the middleware runs: a stale session cookie is deleted, a malformed CSRF one replaced.
        ("get", "/health", stale_cookies),
        ("get", f"/evaluate/{eval_id}", {**auth, **stale_cookies}),
        ("post", "/evaluate", {**post, **stale_cookies, "data": json.dumps(GOOD), "HTTP_IDEMPOTENCY_KEY": "same-key"}),
        # Other paths always run it.
        ("get", "/metrics", {}),
        ("post", "/metrics", {}),
        ("get", "/nope", {}),
        ("get", "/evaluate/", auth),
    ]


def send_all(middleware_list, eval_id, token) -> list[tuple]:
    with override_settings(MIDDLEWARE=middleware_list):
        client = APIClient(enforce_csrf_checks=True)  # as a real client: CSRF is not waived; loads the middleware
        replies = []
        for method, path, extra in requests(eval_id, token):
            client.cookies.clear()  # only the cookies a request names: none, or the stale ones
            extra = dict(extra)
            data = extra.pop("data", None)
            if data is not None:
                response = getattr(client, method)(path, data=data, **extra)
            else:
                response = getattr(client, method)(path, **extra)
            status, headers, cookies, body = reply(response)
            if path == "/metrics":  # the request counters move between the two runs
                body, headers = None, [(name, value) for name, value in headers if name != "Content-Length"]
            replies.append((method, path, (status, headers, cookies, body)))
        return replies


@pytest.mark.parametrize("token", [None, "the-token"])
def test_the_token_api_replies_as_with_djangos_middleware(executor_config, token):
    executor_config(auth_tokens=(token,) if token else ())
    evaluation = Evaluation.objects.create(task_url="https://e/t.tgz", agent_code="x", status=Status.COMPLETED)
    Transition.objects.create(evaluation=evaluation, step=Step.QUEUED, status=Status.PENDING)
    # Both runs replay this admission (same key, same body), so both see the same rows.
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    admitted = APIClient().post("/evaluate", GOOD, format="json", HTTP_IDEMPOTENCY_KEY="same-key", **headers)
    assert admitted.status_code == 202
    django_replies = send_all(DJANGO_MIDDLEWARE, str(evaluation.id), token)
    ours = send_all(MIDDLEWARE, str(evaluation.id), token)
    for theirs, mine in zip(django_replies, ours, strict=True):
        assert mine == theirs
    # The cookie-bearing requests did meet the middleware, in both runs.
    health_with_cookies = next(r for m, p, r in ours if p == "/health" and r[2])
    assert {name for name, _, _ in health_with_cookies[2]} == {"csrftoken", "sessionid"}


def sample_path(pattern) -> str:
    return "/" + re.sub(r"<\w+:\w+>", str(uuid.UUID(int=1)), str(pattern.pattern))


@pytest.mark.parametrize("pattern", api_urls.urlpatterns, ids=lambda p: p.name)
def test_exactly_the_csrf_exempt_drf_routes_outside_the_docs_pass_by(rf, pattern):
    path = sample_path(pattern)
    view = get_resolver().resolve(path).func
    drf = getattr(view, "cls", None) is not None and issubclass(view.cls, APIView)
    expected = drf and getattr(view, "csrf_exempt", False) and not path.startswith("/api/")
    assert middleware.passes_by(rf.get(path)) is expected
    assert middleware.passes_by(rf.get(path, HTTP_COOKIE="a=b")) is False


@pytest.mark.parametrize("path", ["/admin/", "/admin/login/", "/static/admin/css/base.css", "/evaluate/", "/x/health"])
def test_other_paths_meet_the_middleware(rf, path):
    assert middleware.passes_by(rf.get(path)) is False


def test_the_admin_login_page_still_sets_its_csrf_cookie(client):
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies
