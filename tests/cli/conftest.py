"""Fixtures for `manage.py evaluate`: a migrated database per test, the examples built and served."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.cli import EvaluateCli
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.service import PROJECT


@pytest.fixture
def cli(tmp_path):
    """An EvaluateCli: a fresh database (a SQLite file, or a new PostgreSQL database), migrated, and a
    workspace under /tmp; `manage.py evaluate` runs as a subprocess per call. After the test the
    database is dropped and the workspace removed."""
    runner = EvaluateCli(tmp_path / "cli").migrate()
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def built_examples(tmp_path_factory):
    """examples/build.py's output, served on 127.0.0.1 as the README does: {"dir", "url"}.

    Runs examples/build.py once per module and starts a TestHTTPServer thread on its output; the
    server is shut down at the module's end (the folder is pytest's tmp_path_factory's)."""
    build = tmp_path_factory.mktemp("examples-build")
    with TestHTTPServer(build) as server:
        base_url = server.url("").rstrip("/")
        subprocess.run([sys.executable, "examples/build.py", base_url, str(build)], cwd=PROJECT, check=True)
        yield {"dir": build, "url": base_url}
