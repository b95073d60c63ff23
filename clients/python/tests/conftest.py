import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # recording_server, beside the tests

from recording_server import RecordingServer  # noqa: E402


@pytest.fixture
def server():
    """A RecordingServer on 127.0.0.1, started for the test and shut down after it."""
    with RecordingServer() as running:
        yield running


@pytest.fixture
def other_server():
    """A second one: another origin (another port), as another host of a fleet."""
    with RecordingServer() as running:
        yield running


@pytest.fixture(autouse=True)
def no_service_settings(monkeypatch):
    """The client reads TERM_EXECUTOR_URL/TOKEN when not given them: none leak in from the shell."""
    monkeypatch.delenv("TERM_EXECUTOR_URL", raising=False)
    monkeypatch.delenv("TERM_EXECUTOR_TOKEN", raising=False)
