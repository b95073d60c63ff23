"""Fixtures for images: a store per test, and a build store holding the Debian tree as a one-layer
image (the registry and the Debian base image pushed to it are tests/conftest.py's).

A build store's IMAGES_DIR is made under a /tmp folder of 0711, beside the builds' WORKSPACE_BASE: a
build's RUN is started by bwrap as the sandbox uid, which must reach each step's root in
``WORKSPACE_BASE/.image-builds/<id>/``; the store itself is 0700, as every store is (SPEC §21).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from evaluations.images.store import ImageRecord, ImageStore, now_iso
from evaluations.runtime import Bubblewrap, probe_bwrap
from evaluations.runtime.sandbox import usable_language_runtimes
from tests.helpers.images import image_config, need_root
from tests.images.build_support import BASE_REF
from tests.images.rootfs_support import image_sessions
from tests.runtime.support import UID


@pytest.fixture
def store(tmp_path) -> ImageStore:
    need_root()
    return ImageStore(tmp_path / "images")


@pytest.fixture
def pull_config(registry):
    return image_config(registry)


@pytest.fixture
def base_config(base_image):
    return image_config(base_image[0])


@pytest.fixture(scope="module")
def bwrap_runtime():
    works, detail = probe_bwrap()
    if not works:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
        pytest.skip(f"bubblewrap does not work here: {detail}")
    return Bubblewrap(usable_language_runtimes(UID))


@pytest.fixture
def image_session(bwrap_runtime):
    """A factory: image_session(user=0, base=RANGE, layers=...) -> (spawner, ImageRoot, session folder)."""
    yield from image_sessions(bwrap_runtime)


@pytest.fixture(scope="module")
def build_images_dir():
    """``<tmp>/images``: the store (made 0700 by ImageStore), beside ``<tmp>/sessions``, the builds'
    WORKSPACE_BASE (build_support.config_for), which the sandbox uid must reach through ``<tmp>``."""
    parent = Path(tempfile.mkdtemp(prefix="te-images-", dir="/tmp"))
    os.chmod(parent, 0o711)
    yield parent / "images"
    subprocess.run(["rm", "-rf", "--one-file-system", str(parent)], check=False)


@pytest.fixture(scope="module")
def build_store(build_images_dir):
    return ImageStore(build_images_dir)


@pytest.fixture(scope="module")
def debian_image(build_store, debian_environment) -> ImageRecord:
    """The Debian tree as a one-layer image, tagged BASE_REF (hard links: the tree is never written)."""
    tree = debian_environment.root
    layer_id = "sha256:" + hashlib.sha256(f"debian-tree:{tree}".encode()).hexdigest()

    def populate(target: Path) -> None:
        link = "-al" if os.stat(tree).st_dev == os.stat(target).st_dev else "-a"
        subprocess.run(["cp", link, f"{tree}/.", str(target)], check=True)

    build_store.add_layer(layer_id, populate)
    record = ImageRecord(
        digest="sha256:" + hashlib.sha256(layer_id.encode()).hexdigest(),
        refs=[],
        config={"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["bash"]},
        layers=[layer_id],
        size_bytes=build_store.layer_meta(layer_id)["size_bytes"],
        source="import",
        created_at=now_iso(),
        last_used_at=now_iso(),
    )
    return build_store.save_image(record, refs=[BASE_REF])
