"""django-prometheus' middleware with its series kept (executor_project/prometheus.py) records the same figures.

The same requests go through django-prometheus' own PrometheusAfterMiddleware and through
ours; the request metrics each run adds must be the same series with the same increments
(latencies aside: their sums and buckets depend on the clock, their counts do not).
"""

import json

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from executor_project.settings import MIDDLEWARE

pytestmark = pytest.mark.django_db

THEIRS = [name.replace("executor_project.prometheus.", "django_prometheus.middleware.") for name in MIDDLEWARE]
GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}


def request_samples() -> dict:
    figures = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("django_http_"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created") or ("latency" in sample.name and not sample.name.endswith("_count")):
                continue  # when a series was made, how long requests took: the clock's, not the middleware's
            figures[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return figures


def added_by(middleware_list, eval_id) -> dict:
    before = request_samples()
    with override_settings(MIDDLEWARE=middleware_list):
        client = APIClient()
        for _ in range(3):
            client.get("/health")
            client.get(f"/evaluate/{eval_id}")
            client.get(f"/evaluate/{eval_id}", HTTP_ACCEPT="text/html")
            client.get("/evaluate/not-a-uuid")
            client.post("/evaluate", json.dumps(GOOD), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
            client.post("/evaluate", "{bad", content_type="application/json")
            client.put("/evaluate", "{}", content_type="application/json")
            client.get("/evaluations")
            client.get("/nope")
            client.get("/admin/login/")
            client.generic("BREW", "/evaluate")
    after = request_samples()
    return {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}


def test_the_same_series_move_by_the_same_amounts():
    eval_id = APIClient().post("/evaluate", GOOD, format="json", HTTP_IDEMPOTENCY_KEY="k").json()["eval_id"]
    theirs = added_by(THEIRS, eval_id)
    ours = added_by(MIDDLEWARE, eval_id)
    assert ours == theirs
    views = {dict(labels).get("view") for _name, labels in ours}
    assert {"health", "evaluation-detail", "evaluate", "evaluation-list", "admin:login"} <= views
