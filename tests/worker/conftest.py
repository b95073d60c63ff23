"""Fixtures for the tests of the running worker: a task server, session folders, gunicorn + run_worker."""

import pytest

from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.tasks import TaskFactory


@pytest.fixture
def tasks(tmp_path):
    """A TaskFactory serving its task archives from a TestHTTPServer thread on 127.0.0.1 (tmp_path/www),
    shut down after the test."""
    www = tmp_path / "www"
    www.mkdir()
    with TestHTTPServer(www) as server:
        yield TaskFactory(www, server.url("/"))


@pytest.fixture
def worker_service(live_service, workspace_base):
    """worker_service(**env) -> gunicorn + run_worker on a fresh database, allowed to fetch from 127.0.0.1.

    The processes and database are ``live_service``'s (tests/conftest.py): stopped and dropped after
    the test; session folders go to ``workspace_base``."""

    def start(**env):
        settings = {
            "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
            "WORKSPACE_BASE": str(workspace_base),
            "MAX_CONCURRENT_EVALS": "2",
            "MAX_QUEUED_EVALS": "20",
        }
        settings.update({k: str(v) for k, v in env.items()})
        return live_service(env=settings, web_workers=2, worker=True)

    return start
