"""Fixtures for the pipeline tests (``www`` and ``http_server`` are tests/conftest.py's)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers.images import seed_image_store
from tests.helpers.tasks import TaskFactory


@pytest.fixture
def tasks(www, http_server):
    """A TaskFactory writing task archives into ``www``, served by ``http_server`` (tests/conftest.py)."""
    return TaskFactory(www, http_server.url("/"))


@pytest.fixture(params=["none", "bwrap"])
def sandbox(request):
    """Each end-to-end test runs without and with bubblewrap (a failure if REQUIRE_SANDBOX=1 and it is missing).

    The sandbox's name; runs ``bwrap ... true`` once to know whether it works, starts nothing else."""
    if request.param == "bwrap":
        from evaluations.runtime import probe_bwrap

        works, detail = probe_bwrap()
        if not works:
            if os.environ.get("REQUIRE_SANDBOX") == "1":
                pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
            pytest.skip(f"bubblewrap does not work here: {detail}")
    return request.param


@pytest.fixture
def hub_task_config(e2e_config, hub_mirror, base_layer_unpacked, tmp_path):
    """e2e_config for Harbor tasks as written (``FROM debian:bookworm``): a store of the test's own
    holding the Debian layer (tests/helpers/images.py's ``seed_image_store``), docker.io mirrored by the
    suite's registry on 127.0.0.1 over plain HTTP."""
    return dataclasses.replace(
        e2e_config,
        images_dir=seed_image_store(tmp_path / "images", base_layer_unpacked),
        image_registry_mirrors=(f"docker.io={hub_mirror.host}",),
        image_insecure_registries=(hub_mirror.host,),
        allowed_private_hosts=("127.0.0.1",),
    )


@pytest.fixture
def image_task_config(e2e_config, base_image, base_layer_unpacked, tmp_path):
    """e2e_config for image tasks: a store of the test's own holding the Debian layer
    (``seed_image_store``), the suite's registry (tests/conftest.py's ``base_image``) reached over plain
    HTTP on 127.0.0.1."""
    registry, _, _ = base_image
    return dataclasses.replace(
        e2e_config,
        images_dir=seed_image_store(tmp_path / "images", base_layer_unpacked),
        image_insecure_registries=(registry.host,),
        allowed_private_hosts=("127.0.0.1",),
    )


@pytest.fixture
def e2e_config(settings):
    """The service's config with a workspace the sandbox uid can reach and 127.0.0.1 allowed.

    Makes a session folder under /tmp and a workspace cache beside it; after the test (as root) it
    unmounts what a test left mounted below the workspace, then removes both."""
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
