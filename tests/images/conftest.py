"""Fixtures for images: a real registry for the session, a store per test, the Debian base image."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest

from evaluations.images.store import ImageStore
from tests.helpers import environments as environment_helpers
from tests.helpers.images import IMAGE_CACHE, RegistryServer, image_config, push_image


def _need_registry() -> None:
    if shutil.which("docker-registry") is None:
        reason = "docker-registry is not installed (apt-get install -y docker-registry)"
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but {reason}")
        pytest.skip(reason)


def _need_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail("REQUIRE_SANDBOX=1 but the image tests need root (owners, device nodes, overlay xattrs)")
        pytest.skip("unpacking layers needs root (owners, whiteout devices, trusted.* xattrs)")


@pytest.fixture(scope="session")
def registry():
    """docker-registry on 127.0.0.1 over plain HTTP, for the whole run (tests push to their own names)."""
    _need_registry()
    with RegistryServer() as server:
        yield server


@pytest.fixture
def store(tmp_path) -> ImageStore:
    _need_root()
    return ImageStore(tmp_path / "images")


@pytest.fixture
def pull_config(registry):
    return image_config(registry)


def base_layer_tarball(request) -> Path:
    """The suite's Debian tree as one gzip'd layer tar, kept in data/cache/images between runs (named
    after the debootstrap tarball it comes from); built from ``debian_environment`` only when missing."""
    debootstrap = environment_helpers.cached_tarball()
    out = IMAGE_CACHE / f"{debootstrap.name.removesuffix('.tar.gz')}-layer.tar.gz"
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    with open(IMAGE_CACHE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_file():
            from tests.helpers.images import tree_layer

            tree_layer(request.getfixturevalue("debian_environment").root, out)
    return out


@pytest.fixture(scope="session")
def base_image(request, registry):
    """(registry, ref, digest): the suite's Debian tree pushed as ``base/debian:bookworm``.

    Cheap on re-runs: the layer tarball is cached, so debootstrap runs only the first time.
    """
    _need_root()
    blob = base_layer_tarball(request).read_bytes()
    pushed = push_image(
        registry,
        "base/debian:bookworm",
        layers=[blob],
        config={"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["bash"]},
    )
    return registry, pushed.ref, pushed.digest


@pytest.fixture
def base_config(base_image):
    return image_config(base_image[0])
