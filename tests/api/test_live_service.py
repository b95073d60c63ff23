"""The real service under gunicorn with several workers, on the run's database."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.http import request
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow

GOOD = {"agent_code": "print('hi')", "task_url": "https://example.com/task.tar.gz"}


def test_twenty_concurrent_posts_admit_exactly_capacity(live_service):
    service = live_service(env={"MAX_CONCURRENT_EVALS": "2", "MAX_QUEUED_EVALS": "0"}, web_workers=4)

    def submit(_):
        return request("POST", service.url("/evaluate"), json_body=GOOD)

    with ThreadPoolExecutor(max_workers=20) as pool:
        replies = list(pool.map(submit, range(20)))
    statuses = sorted(r.status for r in replies)
    assert statuses == [202] * 2 + [503] * 18, [r.body for r in replies if r.status not in (202, 503)]
    for reply in replies:
        if reply.status == 503:
            assert reply.json()["error"] == "at_capacity"
            assert int(reply.headers["Retry-After"]) >= 1
    listed = request("GET", service.url("/evaluations")).json()
    assert len(listed) == 2


def metric(text: str, name: str) -> float:
    """A counter's value; the sum of its series when it has labels (failed and cancelled: by error_kind)."""
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    assert values, f"{name} missing from /metrics"
    return sum(float(value) for value in values)


def test_metrics_agree_whichever_worker_answers(live_service):
    service = live_service(env={"MAX_CONCURRENT_EVALS": "8"}, web_workers=3)
    ids = [request("POST", service.url("/evaluate"), json_body=GOOD).json()["eval_id"] for _ in range(5)]
    for eval_id in ids[:2]:
        assert request("DELETE", service.url(f"/evaluate/{eval_id}")).status == 202
    scrapes = [request("GET", service.url("/metrics")).body.decode() for _ in range(30)]
    figures = {
        (
            metric(text, "term_executor_evaluations_total"),
            metric(text, "term_executor_evaluations_cancelled_total"),
            metric(text, 'term_executor_evaluations_cancelled_total{error_kind="cancelled"}'),
            metric(text, "term_executor_queue_depth"),
            metric(text, "term_executor_evaluations_active"),
            metric(text, "term_executor_capacity"),
        )
        for text in scrapes
    }
    assert figures == {(5.0, 2.0, 2.0, 3.0, 0.0, 8.0)}
    status = request("GET", service.url("/status")).json()
    assert (status["total_evals"], status["cancelled"], status["queued_evals"]) == (5, 2, 3)
    last = scrapes[-1]
    assert "django_http_requests_total_by_method_total" in last
    assert 'term_executor_step_duration_seconds_bucket{le="+Inf",step="queued"}' in last
    # Request counters are merged across the gunicorn workers: at least the 30 scrapes above.
    by_view = re.findall(
        r'^django_http_requests_total_by_view_transport_method_total\{.*view="metrics".*\} ([0-9.]+)$', last, re.M
    )
    assert by_view and float(by_view[0]) >= 29


def test_health_turns_503_when_the_database_is_gone(live_service, tmp_path):
    service = live_service(web_workers=1)
    assert request("GET", service.url("/health")).json() == {"status": "ok"}
    if service.database.name:
        service.database.drop()
    else:
        for suffix in ("", "-wal", "-shm"):
            path = service.folder / f"live.sqlite3{suffix}"
            if path.exists():
                path.unlink()
        (service.folder / "live.sqlite3").mkdir()  # a folder where the file was: unopenable
    reply = request("GET", service.url("/health"))
    assert reply.status == 503
    body = reply.json()
    assert body["status"] == "unhealthy" and "database" in body["checks"]
    assert body["error"] == "unhealthy"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_CONCURRENT_EVALS", "abc"),
        ("MAX_CONCURRENT_EVALS", "-1"),
        ("SANDBOX", "docker"),
        ("AGENT_NETWORK", "maybe"),
        ("PORT", "70000"),
        ("DATABASE_URL", "mysql://x/y"),
        ("STATIC_ASSETS_ROOT", "/does/not/exist"),
    ],  # fmt: skip
)
def test_a_bad_setting_stops_start_up_with_one_line_naming_it(tmp_path, name, value):
    env = {"PATH": "/usr/bin:/bin", "DATA_DIR": str(tmp_path), name: value}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], result.stderr
    gunicorn = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "executor_project/gunicorn.conf.py"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert gunicorn.returncode != 0 and name in gunicorn.stderr


def test_concurrent_retries_with_one_idempotency_key_create_one_evaluation(live_service):
    service = live_service(env={"MAX_CONCURRENT_EVALS": "4", "AUTH_TOKEN": "t1,t2"}, web_workers=3)

    def submit(token):
        headers = {"Idempotency-Key": "retry-me", "Authorization": f"Bearer {token}"}
        return request("POST", service.url("/evaluate"), json_body=GOOD, headers=headers)

    with ThreadPoolExecutor(max_workers=12) as pool:
        replies = list(pool.map(submit, ["t1"] * 10 + ["t2"] * 2))
    assert [r.status for r in replies] == [202] * 12
    first = {r.json()["eval_id"] for r in replies[:10]}
    second = {r.json()["eval_id"] for r in replies[10:]}
    assert len(first) == 1 and len(second) == 1 and first != second  # keys are scoped to the token
    listed = request("GET", service.url("/evaluations"), headers={"Authorization": "Bearer t1"}).json()
    assert len(listed) == 2
    conflict = request("POST", service.url("/evaluate"), json_body={**GOOD, "agent_code": "other"},
                       headers={"Idempotency-Key": "retry-me", "Authorization": "Bearer t1"})  # fmt: skip
    assert (conflict.status, conflict.json()["error"]) == (409, "idempotency_conflict")


def test_hostile_json_bodies_are_400_invalid_json_through_gunicorn(live_service):
    """Through the real server (its body handling, its workers): 400 with a sentence, no 500,
    and the workers still answer (a RecursionError in a worker is no crash, but a 500 was)."""
    service = live_service(web_workers=1)
    bodies = {
        b"[" * 100_000 + b"]" * 100_000: "is nested more than 64 levels deep",
        b'{"agent_code": "x", "timeout_secs": ' + b"9" * 5000 + b"}": "has an integer of more than 100 digits",
        b'{"timeout_secs": NaN}': "has NaN, which is not a JSON value",
        b'{"agent_code": "\xff"}': "is not UTF-8 (byte 16)",
        b'{"task_url": "a", "task_url": "b"}': "gives the key 'task_url' twice in one object",
        b"[]": "must be a JSON object, not an array",
    }
    for route in ("/evaluate", "/batches"):
        for body, sentence in bodies.items():
            reply = request("POST", service.url(route), data=body, headers={"Content-Type": "application/json"})
            assert (reply.status, reply.json()) == (
                400,
                {"error": "invalid_json", "detail": f"the request body {sentence}"},
            )
    assert request("GET", service.url("/health")).json() == {"status": "ok"}
    assert request("POST", service.url("/evaluate"), json_body=GOOD).status == 202
