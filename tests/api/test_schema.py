"""GET /api/schema describes every route, field, error code and the auth scheme; /api/docs works offline."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from evaluations.api import openapi
from evaluations.api import urls as api_urls
from evaluations.api.serializers import BatchRequestSerializer, EvaluateRequestSerializer
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.django_db


@pytest.fixture
def document(api):
    reply = api.get("/api/schema")
    assert reply.status_code == 200 and reply["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return reply.json()


def api_routes() -> set[str]:
    """Every route of evaluations/api/urls.py in OpenAPI form, less the schema and docs pages."""
    routes = {"/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(p.pattern)) for p in api_urls.urlpatterns}
    return {route for route in routes if not route.startswith("/api/")}


def test_every_route_is_described(document):
    assert document["openapi"].startswith("3.")
    assert set(document["paths"]) == api_routes()
    logs = document["paths"]["/evaluate/{eval_id}/logs"]["get"]
    assert set(logs["responses"]["200"]["content"]) == {"text/plain"}
    assert set(logs["responses"]["200"]["headers"]) == {"X-Log-Offset", "X-Log-Complete"}
    for stream in ("/evaluate/{eval_id}/events", "/batches/{batch_id}/events"):
        responses = document["paths"][stream]["get"]["responses"]
        assert set(responses["200"]["content"]) == {"text/event-stream"}
        assert {"204", "400", "401", "404", "503"} <= set(responses)
    post = document["paths"]["/evaluate"]["post"]
    assert set(post["responses"]) == {"202", "400", "401", "409", "413", "503"}
    assert "Retry-After" in post["responses"]["503"]["headers"] and "Location" in post["responses"]["202"]["headers"]
    assert set(post["responses"]["202"]["links"]) == {"GetEvaluation", "CancelEvaluation", "TailLog"}
    retry = document["paths"]["/evaluate/{eval_id}/retry"]["post"]
    assert set(retry["responses"]) == {"202", "401", "404", "409", "503"}
    assert "Retry-After" in retry["responses"]["503"]["headers"] and "Location" in retry["responses"]["202"]["headers"]
    accepted = retry["responses"]["202"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(document["components"]["schemas"][accepted]["properties"]) == {"eval_id", "status", "retry_of"}


def test_the_bearer_scheme_guards_exactly_the_private_routes(document):
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        **document["components"]["securitySchemes"]["bearerAuth"],
        "type": "http",
        "scheme": "bearer",
    }
    for route, operations in document["paths"].items():
        for method, operation in operations.items():
            guarded = {"bearerAuth": []} in operation.get("security", [])
            public = route in ("/health", "/status", "/metrics", "/public-key")
            assert guarded != public, f"{method.upper()} {route}"
            if guarded:
                assert "401" in operation["responses"]


def test_the_documented_fields_are_the_api_fields(document):
    schemas = document["components"]["schemas"]
    assert set(schemas["EvaluateRequest"]["properties"]) == set(EvaluateRequestSerializer().fields)
    assert schemas["EvaluateRequest"]["additionalProperties"] is False
    assert set(schemas["Evaluation"]["properties"]) == {
        "eval_id", "status", "step", "passed", "error", "duration_ms", "task_url", "language", "agent_sha256", "metadata",
        "created_at", "started_at", "finished_at", "test_results", "agent_output", "agent_exit_code",
        "agent_patch", "test_output", "transitions", "results_sha256", "egress", "resources", "cache",
        "error_kind", "retry_of", "owner", "environment", "reward", "rewards", "task_format", "limits_applied",
        "task_metadata", "system_changes", "artifacts", "batch_id", "attempt", "test_counts",
        "task_sha256", "agent_patch_sha256", "executor_version", "signature", "steps",
    }  # fmt: skip
    assert set(schemas["EvaluationEnvironment"]["properties"]) == {
        "kind", "ref", "digest", "cached", "rewritten_from", "rewrites", "verifier", "verifiers",
    }  # fmt: skip
    assert set(schemas["ErrorKindEnum"]["enum"]) == {
        "tests_failed", "agent_timeout", "limit_exceeded", "agent_invalid", "task_invalid", "infrastructure",
        "cancelled",
    }  # fmt: skip
    assert set(schemas["Resources"]["properties"]) == {
        "peak_memory_bytes", "cpu_seconds", "peak_processes", "peak_disk_bytes", "peak_files"
    }  # fmt: skip
    assert set(schemas["TestResult"]["properties"]) == {
        "name", "kind", "passed", "exit_code", "timed_out", "duration_ms", "output"
    }  # fmt: skip


def test_the_batch_routes_are_described(document):
    schemas = document["components"]["schemas"]
    assert set(schemas["BatchRequest"]["properties"]) == set(BatchRequestSerializer().fields)
    assert schemas["BatchRequest"]["additionalProperties"] is False
    assert set(schemas["Batch"]["properties"]) == {
        "batch_id", "status", "total", "finished", "passed", "failed", "cancelled", "reward", "created_at",
        "finished_at", "evaluations", "owner", "attempts", "mean_reward", "pass_at_k", "tasks",
        "agent_sha256", "executor_version", "signature",
    }  # fmt: skip
    assert set(schemas["BatchSummary"]["properties"]) == set(schemas["Batch"]["properties"]) - {
        "tasks", "evaluations", "signature"
    }  # fmt: skip
    assert set(schemas["BatchEvaluation"]["properties"]) == {
        "eval_id", "task_url", "attempt", "status", "passed", "reward", "error_kind"
    }  # fmt: skip
    assert set(schemas["BatchTask"]["properties"]) == {"task_url", "attempts", "passes", "pass_at_k", "mean_reward"}
    attempts = schemas["BatchRequest"]["properties"]["attempts"]
    assert (attempts["type"], attempts["minimum"], attempts["default"]) == ("integer", 1, 1)
    post = document["paths"]["/batches"]["post"]
    assert set(post["responses"]) == {"202", "400", "401", "409", "413", "503"}
    assert "Retry-After" in post["responses"]["503"]["headers"]
    assert {"get", "post"} == set(document["paths"]["/batches"])
    assert {"get", "delete"} == set(document["paths"]["/batches/{batch_id}"])
    assert "Link" in document["paths"]["/batches"]["get"]["responses"]["200"]["headers"]


def raised_error_codes() -> set[str]:
    """Every stable code the source can put in the envelope."""
    codes = set()
    for path in (PROJECT / "evaluations").rglob("*.py"):
        text = path.read_text()
        codes.update(re.findall(r'ApiError\(\s*\d{3},\s*"([a-z_]+)"', text))
        codes.update(re.findall(r'(?:json_error|envelope)\(\s*(?:\d{3},\s*)?"([a-z_]+)"', text))
        codes.update(re.findall(r'exceptions\.\w+, "([a-z_]+)"', text))
    return codes


def test_every_error_code_is_documented(document):
    codes = raised_error_codes()
    assert {"invalid_request", "not_found", "at_capacity", "already_finished"} <= codes
    assert codes <= set(openapi.ERROR_CODES), codes - set(openapi.ERROR_CODES)
    assert "#/components/schemas/ErrorEnum" in str(document["components"]["schemas"]["Error"]["properties"]["error"])
    assert set(document["components"]["schemas"]["ErrorEnum"]["enum"]) == set(openapi.ERROR_CODES)


def test_each_error_response_shows_its_own_code(document):
    post = document["paths"]["/evaluate"]["post"]["responses"]
    expected = {"400": "invalid_request", "401": "unauthorized", "409": "idempotency_conflict",
                "413": "payload_too_large", "503": "at_capacity"}  # fmt: skip
    for status, code in expected.items():
        examples = post[status]["content"]["application/json"]["examples"]
        assert code in {example["value"]["error"] for example in examples.values()}, status
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for _status, response in operation.get("responses", {}).items():
                for name, example in (
                    response.get("content", {}).get("application/json", {}).get("examples", {}).items()
                ):
                    code = example["value"]["error"]
                    assert example["summary"] == code and f"`{code}`" in response["description"], (path, method, name)


def test_the_document_is_public_even_with_auth_on(api, executor_config):
    executor_config(auth_tokens=("s3cret",))
    assert api.get("/api/schema").status_code == 200
    assert api.get("/api/schema", HTTP_AUTHORIZATION="Bearer wrong").status_code == 200
    assert api.get("/api/docs").status_code == 200


class Assets(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def test_the_docs_page_needs_no_network(client):
    page = client.get("/api/docs")
    assert page.status_code == 200
    html = page.content.decode()
    parser = Assets()
    parser.feed(html)
    assert parser.urls, "no assets found: the page changed shape"
    for url in parser.urls:
        assert url.startswith("/static/"), f"{url} is not served by the executor"
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert b"".join(asset.streaming_content)
    assert not re.search(r"https?://(?!127\.0\.0\.1|localhost)", html), "the page names another host"
    assert '"validatorUrl": null' in html  # Swagger UI would call validator.swagger.io


def test_static_files_are_served_but_nothing_outside_them(client):
    assert client.get("/static/admin/css/base.css").status_code == 200  # the admin's look, under gunicorn too
    assert client.get("/static/../executor_project/settings.py").status_code == 404
    assert client.get("/static/admin/../../settings.py").status_code == 404
