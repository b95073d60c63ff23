"""Fixtures for the network tests: the runtime tests' sandbox fixtures (a Spawner with the Bubblewrap
runtime, its session folder; see tests/runtime/conftest.py for what they start and remove) and a URL
policy for the ``http_server`` of tests/conftest.py."""

import pytest

from evaluations.network.urlguard import URLPolicy
from tests.runtime.conftest import bwrap_probe, bwrap_runtime, bwrap_sp, session  # noqa: F401


@pytest.fixture
def loopback_policy():
    """http/https, with only 127.0.0.1 let through the private-address rule. Starts nothing."""
    return URLPolicy(allowed_private_hosts=("127.0.0.1",))
