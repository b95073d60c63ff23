"""A live sandbox with docker-compose services (SPEC §23-24): each service besides main in a sandbox
of its own, sharing main's loopback (its name at 127.0.0.1), reached by exec and files with
``service``, listed by GET, stopped with the sandbox."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from evaluations.runtime import killer
from tests.helpers.archives import Exec, write_archive
from tests.helpers.polling import wait_for
from tests.sandboxes.test_environments import create_multipart, tar_of
from tests.sandboxes.test_lifecycle import leftovers

FETCH = "import urllib.request as u, sys; sys.stdout.write(u.urlopen(sys.argv[1]).read().decode())"


def web_service(image_ref: str, marker: str, port: int = 8080) -> dict:
    """A sidecar serving /srv on ``port`` (the marker its shell's $0, to find its processes on the host)."""
    return {
        "image": image_ref,
        "command": [
            "sh",
            "-c",
            f"echo served by $$HOSTNAME > /srv/hello.txt; python3 -m http.server {port} --bind 127.0.0.1 "
            "--directory /srv; :",
            marker,
        ],
        "environment": {"GREETING": "hi from web"},
        "healthcheck": {
            "test": ["CMD", "python3", "-c", FETCH, f"http://127.0.0.1:{port}/hello.txt"],
            "interval": "0.5s",
            "retries": 60,
        },
    }


def with_marker(marker: str) -> list[int]:
    """Host pids of the processes whose command line holds ``marker``."""
    found = []
    for proc in killer.processes():
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read():
                    found.append(proc.pid)
        except OSError:
            pass
    return found


def task_url(web, image_ref: str, compose: dict | str) -> str:
    name = f"compose-{uuid.uuid4().hex[:8]}.tar.gz"
    write_archive(
        Path(web.www) / name,
        {
            "task.toml": f'[environment]\ndocker_image = "{image_ref}"\n',
            "instruction.md": "Do it.\n",
            "environment/docker-compose.yaml": compose if isinstance(compose, str) else json.dumps(compose),
            "tests/test.sh": Exec("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"),
        },
        "tar.gz",
        top="task",
    )
    return web.url(f"/{name}")


def test_a_tasks_compose_service_runs_beside_main(api, sandbox_service, image_ref, web):
    marker = f"te-web-{uuid.uuid4().hex[:8]}"
    compose = {
        "services": {
            "main": {"depends_on": {"web": {"condition": "service_healthy"}}},
            "web": web_service(image_ref, marker),
        }
    }
    body = api.create({"environment": {"task_url": task_url(web, image_ref, compose)}})
    sandbox_id = body["sandbox_id"]
    try:
        (service,) = body["environment"]["services"]
        assert service["name"] == "web" and service["state"] == "running" and service["digest"], body
        # main reaches it by name, straight (not through the egress proxy)
        result = api.exec(sandbox_id, ["python3", "-c", FETCH, "http://web:8080/hello.txt"])
        assert result["stdout"] == "served by web\n", result
        assert api.exec(sandbox_id, "getent hosts web")["stdout"].split() == ["127.0.0.1", "web"]
        # an exec in the service: its root, its variables, its working directory
        result = api.exec(sandbox_id, 'echo "$GREETING"; cat /srv/hello.txt; id -u', service="web")
        assert result["stdout"] == "hi from web\nserved by web\n0\n", result
        # and it reaches main's loopback too: main's own server, by main's name
        api.exec(sandbox_id, "nohup python3 -m http.server 9090 --bind 127.0.0.1 --directory /etc >/dev/null 2>&1 &")
        result = api.exec(
            sandbox_id,
            ["sh", "-c", 'for i in $(seq 100); do python3 -c "$0" "$1" && exit; sleep 0.2; done', FETCH,
             "http://main:9090/hosts"],
            service="web",
        )  # fmt: skip
        assert result["exit_code"] == 0, result
        # files in the service: written there, read back there, never in main's root
        response = api.call("PUT", f"/sandboxes/{sandbox_id}/files?path=/srv/put.txt&service=web", raw=b"put\n")
        assert response.status == 204, response.body
        response = api.call("GET", f"/sandboxes/{sandbox_id}/files?path=/srv/put.txt&service=web")
        assert response.status == 200 and response.body == b"put\n", response.body
        response = api.call("GET", f"/sandboxes/{sandbox_id}/files?path=/srv&service=web")
        assert response.status == 200 and response.headers["Content-Type"] == "application/x-tar"
        assert api.exec(sandbox_id, "test -e /srv/put.txt")["exit_code"] == 1
        response = api.call("GET", f"/sandboxes/{sandbox_id}/files?path=/srv/put.txt&service=main")
        assert response.status == 404
        # an unknown service is refused, naming the sandbox's
        status, answer = api.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": "true", "service": "db"})
        assert status == 404 and "no service 'db'" in answer["detail"] and "main, web" in answer["detail"], answer
        response = api.call("GET", f"/sandboxes/{sandbox_id}/files?path=/srv&service=db")
        assert response.status == 404 and b"no service 'db'" in response.body
        assert with_marker(marker), "the service's process runs on the host"
    finally:
        assert api.call("DELETE", f"/sandboxes/{sandbox_id}").status == 204
    assert not with_marker(marker), "the service's processes end with the sandbox"
    assert wait_for(lambda: not leftovers(sandbox_service, sandbox_id), what="nothing left")
    status, body = api.json("GET", f"/sandboxes/{sandbox_id}")
    assert body["status"] == "stopped" and body["environment"]["services"][0]["state"] == "stopped", body


def test_a_context_with_a_compose_file_builds_its_services(api, image_ref):
    """The Harbor backend's way: the task's environment/ as the build context, main's Dockerfile and
    the compose file in it; main started by its compose ``entrypoint`` (Harbor's ``sleep infinity``
    its arguments); a service built from a folder of it, one whose process ends."""
    compose = {
        "services": {
            "main": {"entrypoint": ["sh", "-c", 'echo "started with $*" > /which.started; exec "$@"', "entry"]},
            "side": {"build": {"context": "side"}, "command": ["sh", "-c", "echo side up; exit 3"]},
        }
    }
    context = tar_of(
        {
            "Dockerfile": f"FROM {image_ref}\nRUN echo main > /which.txt\n".encode(),
            "docker-compose.yaml": json.dumps(compose).encode(),
            "side/Dockerfile": f"FROM {image_ref}\nCOPY note.txt /which.txt\n".encode(),
            "side/note.txt": b"side\n",
        }
    )
    spec = {"environment": {"dockerfile": "Dockerfile", "compose": "docker-compose.yaml"}}
    status, body = create_multipart(api, spec, context)
    assert status in (201, 202), body
    sandbox_id = body["sandbox_id"]
    try:
        if status == 202:
            body = wait_for(lambda: api.settled(sandbox_id), timeout=600, what="the builds")
        assert body["status"] == "ready", body
        assert api.exec(sandbox_id, "cat /which.txt")["stdout"] == "main\n"
        assert api.exec(sandbox_id, "cat /which.txt", service="side")["stdout"] == "side\n"
        started = wait_for(
            lambda: api.exec(sandbox_id, "cat /which.started")["stdout"], timeout=60, what="main's entrypoint"
        )
        assert started == "started with sh -c sleep infinity\n", started

        def exited():
            services = api.json("GET", f"/sandboxes/{sandbox_id}")[1]["environment"]["services"]
            return services[0] if services[0]["state"] == "exited" else None

        side = wait_for(exited, timeout=60, what="the service's process to end")
        assert side["exit_code"] == 3 and side["kind"] == "dockerfile", side
        # its process ended, its sandbox still answers (as a stopped container's files would not,
        # but Harbor's hooks read it after the agent)
        assert api.exec(sandbox_id, "cat /which.txt", service="side")["stdout"] == "side\n"
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox_id}")


@pytest.mark.parametrize(
    ("environment", "context", "said"),
    [
        ({"image": "x", "compose": "docker-compose.yaml"}, False, "needs a build context"),
        ({"task_url": "http://127.0.0.1/t.tar.gz", "compose": "docker-compose.yaml"}, False, "goes with image"),
        ({"dockerfile": "Dockerfile", "compose": "compose.yaml"}, True, "expected docker-compose.yaml"),
        ({"dockerfile": "Dockerfile", "compose": "sub/docker-compose.yaml"}, True, "at the top of the build"),
    ],
)
def test_a_bad_compose_field_is_a_bad_request(api, environment, context, said):
    if context:
        status, body = create_multipart(api, {"environment": environment}, tar_of({"Dockerfile": b"FROM x\n"}))
    else:
        status, body = api.json("POST", "/sandboxes", {"environment": environment})
    assert status == 400 and body["error"] == "bad_request" and said in body["detail"], body


@pytest.mark.parametrize(
    ("compose", "said"),
    [
        ("services: [main]\n", "'services' must be a mapping"),
        ("services:\n  db: {command: [sleep, '1']}\n", "service 'db' has neither 'image' nor 'build'"),
        ("services:\n  db: {image: 'IMAGE', depends_on: [cache]}\n", "cache"),
        (
            "services:\n  main: {}\n  db: {image: 'IMAGE', volumes: ['data:/data']}\nvolumes:\n  data: {driver: nfs}\n",
            "volume 'data': driver 'nfs' is not supported here",
        ),
        ("services:\n  db: {image: 'IMAGE', volumes: ['/etc:/host-etc']}\n", "binds a host path"),
        ("}{", "docker-compose.yaml"),
    ],
)
def test_a_broken_compose_file_is_task_invalid(api, image_ref, web, compose, said):
    compose = compose.replace("IMAGE", image_ref)
    status, body = api.json("POST", "/sandboxes", {"environment": {"task_url": task_url(web, image_ref, compose)}})
    assert status == 400 and body["error"] == "task_invalid", body
    assert said in body["detail"], body
    spec = {"environment": {"image": image_ref, "compose": "docker-compose.yaml"}}
    status, body = create_multipart(api, spec, tar_of({"docker-compose.yaml": compose.encode()}))
    assert status == 400 and body["error"] == "task_invalid" and "environment.compose" in body["detail"], body
    assert said in body["detail"], body


def test_a_service_that_never_becomes_healthy_fails_the_sandbox(api, image_ref, web):
    compose = {
        "services": {
            "sick": {
                "image": image_ref,
                "command": ["sleep", "infinity"],
                "healthcheck": {"test": ["CMD-SHELL", "echo not yet; exit 1"], "interval": "0.1s", "retries": 2},
            }
        }
    }
    status, body = api.json("POST", "/sandboxes", {"environment": {"task_url": task_url(web, image_ref, compose)}})
    assert status == 400 and body["error"] == "task_invalid", body
    assert "service 'sick' never became healthy" in body["detail"] and "not yet" in body["detail"], body
