"""Fixtures for the pipeline tests: a real HTTP server and URL policies for it."""

from __future__ import annotations

import pytest

from evaluations.network.urlguard import URLPolicy
from tests.helpers.httpserver import TestHTTPServer


@pytest.fixture
def www(tmp_path):
    """The folder the ``http_server`` fixture serves."""
    folder = tmp_path / "www"
    folder.mkdir()
    return folder


@pytest.fixture
def http_server(www):
    """A started TestHTTPServer on 127.0.0.1 serving ``www``."""
    with TestHTTPServer(www) as server:
        yield server


@pytest.fixture
def loopback_policy():
    """http/https, with only 127.0.0.1 let through the private-address rule."""
    return URLPolicy(allowed_private_hosts=("127.0.0.1",))


# -- end-to-end fixtures ------------------------------------------------------

import dataclasses  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.helpers.tasks import TaskFactory  # noqa: E402


@pytest.fixture
def tasks(www, http_server):
    return TaskFactory(www, http_server.url("/"))


@pytest.fixture(params=["none", "bwrap"])
def sandbox(request):
    """Each end-to-end test runs without and with bubblewrap (a failure if REQUIRE_SANDBOX=1 and it is missing)."""
    if request.param == "bwrap":
        from evaluations.runtime import probe_bwrap

        works, detail = probe_bwrap()
        if not works:
            if os.environ.get("REQUIRE_SANDBOX") == "1":
                pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
            pytest.skip(f"bubblewrap does not work here: {detail}")
    return request.param


@pytest.fixture
def e2e_config(settings):
    """The service's config with a workspace the sandbox uid can reach and 127.0.0.1 allowed."""
    base = Path(tempfile.mkdtemp(prefix="te-sessions-", dir="/tmp"))
    os.chmod(base, 0o711)
    config = dataclasses.replace(
        settings.EXECUTOR,
        workspace_base=base,
        allowed_private_hosts=("127.0.0.1",),
        agent_timeout_secs=60,
        test_timeout_secs=60,
        clone_timeout_secs=60,
        install_timeout_secs=60,
        cache_dir=base.with_name(base.name + "-cache"),  # the workspace cache (SPEC §13) of this test only
    )
    yield config
    from evaluations.cache.mounts import unmount_below

    if os.geteuid() == 0:
        unmount_below(base)
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(config.cache_dir, ignore_errors=True)
