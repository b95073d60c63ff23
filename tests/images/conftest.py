"""Fixtures for images: a real registry for the session, a store per test, the Debian base image;
for builds, a store whose folders the sandbox uid can reach with that image in it.

A build's IMAGES_DIR is made under /tmp, 0711: a RUN is started by bwrap as the sandbox uid,
which must reach each step's root in ``IMAGES_DIR/builds/<id>/<n>/rootfs`` (a DATA_DIR is 0700).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from evaluations.images.pull import pull
from evaluations.images.store import ImageRecord, ImageStore
from evaluations.runtime import Bubblewrap, probe_bwrap
from evaluations.runtime.sandbox import usable_language_runtimes
from tests.helpers import environments as environment_helpers
from tests.helpers.images import IMAGE_CACHE, RegistryServer, image_config, push_image
from tests.images.build_support import BASE_REF
from tests.runtime.support import UID


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


# -- builds --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bwrap_runtime():
    works, detail = probe_bwrap()
    if not works:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
        pytest.skip(f"bubblewrap does not work here: {detail}")
    return Bubblewrap(usable_language_runtimes(UID))


@pytest.fixture(scope="module")
def build_images_dir():
    folder = Path(tempfile.mkdtemp(prefix="te-images-", dir="/tmp"))
    os.chmod(folder, 0o711)
    yield folder
    subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=False)


@pytest.fixture(scope="module")
def build_store(build_images_dir):
    _need_root()
    return ImageStore(build_images_dir)


@pytest.fixture(scope="module")
def debian_image(build_store, base_image) -> ImageRecord:
    """``base_image`` pulled into the build store, also tagged BASE_REF (a tag the store answers
    for IMAGE_TAG_TTL_SECS, so the Dockerfiles need not name the registry's port)."""
    registry, ref, _ = base_image
    record = pull(ref, store=build_store, config=image_config(registry)).record
    return build_store.save_image(record, refs=[BASE_REF])
