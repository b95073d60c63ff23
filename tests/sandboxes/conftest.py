"""A live service with its worker for the sandbox tests, and a small HTTP client for its API."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers.http import request
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.polling import wait_for
from tests.helpers.service import LiveService

TOKEN = "sandbox-test-token"


class Api:
    def __init__(self, service: LiveService, token: str = TOKEN):
        self.service = service
        self.token = token

    def call(self, method: str, path: str, body=None, *, raw: bytes | None = None, headers=None, timeout: float = 120):
        sent = dict(headers or {})
        sent["Authorization"] = f"Bearer {self.token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        return request(method, self.service.url(path), data=data, headers=sent, timeout=timeout)

    def json(self, method: str, path: str, body=None, **kwargs):
        response = self.call(method, path, body, **kwargs)
        return response.status, (json.loads(response.body) if response.body else None)

    def create(self, spec: dict, **kwargs) -> dict:
        """A ready sandbox: 201, or 202 (a cold pull or a build under way) then GET until it is ready."""
        status, body = self.json("POST", "/sandboxes", spec, **kwargs)
        assert status in (201, 202), body
        if status == 202:
            assert body["status"] == "starting"
            body = wait_for(lambda: self.settled(body["sandbox_id"]), timeout=600, what="the sandbox to be ready")
        assert body["status"] == "ready", body
        return body

    def settled(self, sandbox_id: str) -> dict | None:
        status, body = self.json("GET", f"/sandboxes/{sandbox_id}")
        assert status == 200, body
        return None if body["status"] == "starting" else body

    def exec(self, sandbox_id: str, command, **fields) -> dict:
        status, body = self.json("POST", f"/sandboxes/{sandbox_id}/exec", {"command": command, **fields})
        assert status == 200, body
        return body


def start_service(
    folder: Path, registry, *, public: bool = False, database_url: str | None = None, **env
) -> LiveService:
    """A service with its worker. ``public``: its PUBLIC_URL is its own address (a fleet's node);
    ``database_url``: another service's database, shared (a fleet)."""
    sessions = Path(tempfile.mkdtemp(prefix="te-sbx-", dir="/tmp"))  # traversable by the sandbox uids
    os.chmod(sessions, 0o711)
    service = LiveService(
        folder,
        worker=True,
        env={
            "AUTH_TOKEN": TOKEN,
            "WORKSPACE_BASE": str(sessions),
            "IMAGE_INSECURE_REGISTRIES": registry.host,
            "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
            **env,
        },
    )
    service.sessions = sessions
    if public:
        service.env["PUBLIC_URL"] = service.base_url
    if database_url:
        service.env["DATABASE_URL"] = database_url
    return service.start()


def stop_service(service: LiveService) -> None:
    service.stop()
    shutil.rmtree(service.sessions, ignore_errors=True)


TENANTS = {"alice": "alice-token", "bob": "bob-token"}


@pytest.fixture(scope="session")
def web(tmp_path_factory):
    """An HTTP server on 127.0.0.1 for the run: task archives, and a destination for the sandboxes'
    egress (the service's EGRESS_ALLOW names it: the defaults refuse 127.0.0.1)."""
    folder = tmp_path_factory.mktemp("www")
    (folder / "hello.txt").write_text("hello from the host\n")
    with TestHTTPServer(folder) as server:
        server.www = folder
        yield server


@pytest.fixture(scope="session")
def web6(tmp_path_factory):
    """An HTTP server on the host's ::1 (an IPv6 destination the operator's rules allow)."""
    folder = tmp_path_factory.mktemp("www6")
    (folder / "hello.txt").write_text("hello from ::1\n")
    with TestHTTPServer(folder, host="::1") as server:
        yield server


@pytest.fixture(scope="session")
def shared_images(tmp_path_factory) -> Path:
    """IMAGES_DIR for every service of this test process: the base image pulled once, not per service."""
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="session")
def sandbox_service(tmp_path_factory, hub_mirror, web, web6, shared_images):
    """One service with its worker for the sandbox tests of this test process (a service's start
    and stop cost seconds; each test makes and deletes its own sandboxes). docker.io's mirror is
    the suite's registry (a Harbor example's ``FROM debian:bookworm``), which the operator's rules
    let sandboxes reach, as ``web`` and ``web6`` (EGRESS_ALLOW)."""
    service = start_service(
        tmp_path_factory.mktemp("sandbox-service"),
        hub_mirror,
        AUTH_TOKENS=",".join(f"{name}:{token}" for name, token in TENANTS.items()),
        IMAGE_REGISTRY_MIRRORS=f"docker.io={hub_mirror.host}",
        EGRESS_ALLOW=f"127.0.0.1:{web.port},[::1]:{web6.port},{hub_mirror.host}",
        IMAGES_DIR=str(shared_images),
    )
    yield service
    stop_service(service)


@pytest.fixture
def api(sandbox_service) -> Api:
    return Api(sandbox_service)


@pytest.fixture
def image_ref(base_image) -> str:
    return base_image[1]


@pytest.fixture
def sandbox_services(tmp_path, base_image, shared_images):
    """Factory: services of the test's own (``start_service``'s arguments), stopped after it."""
    started = []

    def start(**kwargs):
        kwargs.setdefault("IMAGES_DIR", str(shared_images))
        started.append(start_service(tmp_path / f"svc{len(started)}", base_image[0], **kwargs))
        return started[-1]

    yield start
    for one in reversed(started):
        stop_service(one)
