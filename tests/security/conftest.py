"""Fixtures for the attack suite: the end-to-end ones of tests/pipeline, and live services.

Every attack test ends by checking that the service still works: an ordinary
solving evaluation passes (``still_works``), or GET /health and a solving
evaluation through the live service.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.service import LiveService
from tests.helpers.tasks import TaskFactory
from tests.pipeline.conftest import e2e_config, sandbox  # noqa: F401  (fixtures, re-exported)


@pytest.fixture
def www(tmp_path):
    folder = tmp_path / "www"
    folder.mkdir()
    return folder


@pytest.fixture
def http_server(www):
    with TestHTTPServer(www) as server:
        yield server


@pytest.fixture
def tasks(www, http_server):
    return TaskFactory(www, http_server.url("/"))


@pytest.fixture
def canary(tmp_path_factory):
    """A root-owned folder outside every session, holding ``file`` (mode 0666): what an attack
    aims at. Tests assert it is unchanged afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="te-canary-", dir="/tmp"))
    os.chmod(folder, 0o755)
    target = folder / "file"
    target.write_text("canary\n")
    os.chmod(target, 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _live(tmp_path_factory, env: dict) -> LiveService:
    base = Path(tempfile.mkdtemp(prefix="te-sec-sessions-", dir="/tmp"))
    os.chmod(base, 0o711)
    settings = {
        "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
        "WORKSPACE_BASE": str(base),
        "MAX_CONCURRENT_EVALS": "2",
        "MAX_QUEUED_EVALS": "20",
        "AGENT_TIMEOUT_SECS": "60",
        "TEST_TIMEOUT_SECS": "60",
    }
    settings.update(env)
    service = LiveService(tmp_path_factory.mktemp("svc"), env=settings, web_workers=2, worker=True)
    service.workspace_base = base
    return service.start()


@pytest.fixture(scope="module")
def live_factory(tmp_path_factory):
    """live_factory(**env) -> a started gunicorn + run_worker, stopped at the module's end."""
    started = []

    def start(**env) -> LiveService:
        service = _live(tmp_path_factory, {k: str(v) for k, v in env.items()})
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()
        shutil.rmtree(service.workspace_base, ignore_errors=True)


@pytest.fixture(scope="module")
def module_www(tmp_path_factory):
    folder = tmp_path_factory.mktemp("www")
    with TestHTTPServer(folder) as server:
        yield TaskFactory(folder, server.url("/")), server
