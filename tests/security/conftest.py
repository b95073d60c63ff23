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
from tests.pipeline.conftest import e2e_config, image_task_config, sandbox  # noqa: F401  (fixtures, re-exported)

# www and http_server are tests/conftest.py's.


@pytest.fixture
def tasks(www, http_server):
    """A TaskFactory writing task archives into ``www``, served by ``http_server`` (tests/conftest.py's:
    a TestHTTPServer thread on 127.0.0.1, shut down after the test)."""
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
    """live_factory(**env) -> a started gunicorn + run_worker, stopped at the module's end.

    Each service runs as subprocesses on a database of its own (migrated first) with session folders
    under /tmp; at the module's end each is stopped (SIGTERM, then SIGKILL), its database dropped and
    its session folder removed."""
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
    """(TaskFactory, server) for a whole module: a TestHTTPServer thread on 127.0.0.1, shut down at the
    module's end."""
    folder = tmp_path_factory.mktemp("www")
    with TestHTTPServer(folder) as server:
        yield TaskFactory(folder, server.url("/")), server
