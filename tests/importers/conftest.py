"""Fixtures for `manage.py import_swebench`: instances served on 127.0.0.1, the command as a subprocess."""

from __future__ import annotations

import pytest

from tests.helpers.cli import EvaluateCli
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.swebench import Instances
from tests.worker.conftest import worker_service  # noqa: F401  (gunicorn + run_worker)


@pytest.fixture
def served(tmp_path):
    """(Instances making rows whose repositories it serves, the server, the --repo-url template).

    Starts a TestHTTPServer thread on 127.0.0.1 serving tmp_path/www (git repositories made there),
    shut down after the test."""
    www = tmp_path / "www"
    www.mkdir()
    with TestHTTPServer(www) as server:
        yield Instances(www, tmp_path / "work"), server, server.url("/{repo}.git")


@pytest.fixture
def cli(tmp_path):
    """The command line, on a database of its own (migrated only by the tests that verify).

    Each command is a subprocess; after the test the database is dropped and the workspace removed."""
    runner = EvaluateCli(tmp_path / "cli")
    yield runner
    runner.close()
