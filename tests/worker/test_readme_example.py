"""The README's curl example, as written: build the calc example, serve it, POST its request body."""

import json
import subprocess
import sys

import pytest

from tests.helpers.http import request
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import wait_for, wait_terminal
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow


def test_the_calc_example_passes_end_to_end(worker_service, tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    with TestHTTPServer(build) as server:
        base_url = server.url("").rstrip("/")
        subprocess.run([sys.executable, "examples/build.py", base_url, str(build)], cwd=PROJECT, check=True)
        service = worker_service()
        body = json.loads((build / "calc-request.json").read_text())
        reply = request("POST", service.url("/evaluate"), data=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert reply.status == 202
        result = wait_terminal(service, reply.json()["eval_id"])
    assert (result["status"], result["passed"]) == ("completed", True), (result["agent_output"], result["test_output"])
    names = [(r["name"], r["kind"], r["passed"]) for r in result["test_results"]]
    assert names == [
        ("fail_to_pass_add", "fail_to_pass", True),
        ("pass_to_pass_sub", "pass_to_pass", True),
        ("check_1", "check", True),
    ]
    assert "+    return a + b" in result["agent_patch"]


def test_the_readme_batch_example_earns_half(worker_service, tmp_path):
    """The README's batch body, made by its own one-liner: calc's solver on calc (passes) and textkit (fails)."""
    import re

    readme = (PROJECT / "README.md").read_text()
    snippet = re.search(
        r"\.venv/bin/python -c '(import json; r = .*?)' > examples/build/batch-request\.json", readme, re.S
    )
    snippet = snippet.group(1)
    build = tmp_path / "examples" / "build"
    build.mkdir(parents=True)
    with TestHTTPServer(build) as server:
        base_url = server.url("").rstrip("/")
        subprocess.run([sys.executable, "examples/build.py", base_url, str(build)], cwd=PROJECT, check=True)
        made = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, check=True)
        service = worker_service()
        reply = request("POST", service.url("/batches"), data=made.stdout.encode(),
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert reply.status == 202, reply.body
        batch_id = reply.json()["batch_id"]
        shown = wait_for(
            lambda: (body := request("GET", service.url(f"/batches/{batch_id}")).json())["finished_at"] and body,
            180,
            what="the batch to end",
        )
    assert (shown["status"], shown["total"], shown["passed"], shown["reward"]) == ("completed", 2, 1, 0.5)
    assert [e["passed"] for e in shown["evaluations"]] == [True, False]
    assert [e["reward"] for e in shown["evaluations"]] == [1.0, 0.0]  # the exit_code grader's (SPEC §17)
    assert (shown["attempts"], shown["mean_reward"], shown["pass_at_k"]) == (1, 0.5, 0.5)
    assert [(t["passes"], t["pass_at_k"], t["mean_reward"]) for t in shown["tasks"]] == [(1, 1.0, 1.0), (0, 0.0, 0.0)]
    assert shown["evaluations"][1]["task_url"].endswith("/textkit-task.tar.gz")


def test_the_readme_harbor_example_earns_its_reward(worker_service, hub_mirror, seeded_images, tmp_path):
    """The README's Harbor example, as written: import_tasks packs examples/harbor, the README's one-liner
    makes the request body, the service builds the task's Dockerfile (FROM debian:bookworm through the
    Docker Hub mirror on 127.0.0.1) and grades the reward.txt its verifier writes."""
    import re

    readme = (PROJECT / "README.md").read_text()
    imported = re.search(r"^\.venv/bin/python manage\.py (import_tasks --from harbor [^#\n]*?)\s+#", readme, re.M)
    snippet = re.search(r"\.venv/bin/python -c '(.*?)' \\\n  > examples/build/harbor-request\.json", readme, re.S)
    build = tmp_path / "examples" / "build"
    build.mkdir(parents=True)
    args = imported.group(1).replace("examples/build/", f"{build}/").split()
    subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, check=True, capture_output=True)
    assert (build / "harbor" / "fix-greeting.tar.gz").is_file()
    with TestHTTPServer(build) as server:
        code = snippet.group(1).replace("http://127.0.0.1:8000", server.url("").rstrip("/"))
        made = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True)
        service = worker_service(
            IMAGE_REGISTRY_MIRRORS=f"docker.io={hub_mirror.host}",
            IMAGE_INSECURE_REGISTRIES=hub_mirror.host,
            IMAGES_DIR=str(seeded_images),
        )
        reply = request("POST", service.url("/evaluate"), data=made.stdout.encode(),
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert reply.status == 202, reply.body
        result = wait_terminal(service, reply.json()["eval_id"], timeout=300)
    assert (result["status"], result["passed"], result["reward"]) == ("completed", True, 1.0), (
        result["error"], result["test_output"])  # fmt: skip
    assert (result["task_format"], result["rewards"], result["environment"]["kind"]) == (
        "harbor", {"reward": 1.0}, "dockerfile")  # fmt: skip
    assert result["limits_applied"]["network"] == "no-network"
    assert [r["name"] for r in result["test_results"]] == ["test.sh"]
