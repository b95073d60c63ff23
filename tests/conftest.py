import dataclasses

import pytest
from rest_framework.test import APIClient

from tests.helpers.service import LiveService


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def executor_config(settings):
    """Change settings.EXECUTOR for one test: executor_config(max_concurrent_evals=1)."""

    def apply(**changes):
        settings.EXECUTOR = dataclasses.replace(settings.EXECUTOR, **changes)
        return settings.EXECUTOR

    return apply


@pytest.fixture
def live_service(tmp_path):
    """Factory: live_service(env={...}, web_workers=3, worker=False) -> a started LiveService."""
    started = []

    def start(**kwargs):
        service = LiveService(tmp_path / f"svc{len(started)}", **kwargs).start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()
