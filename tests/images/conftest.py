"""Fixtures for images: a store per test (the registry and the Debian base image are tests/conftest.py's)."""

from __future__ import annotations

import pytest

from evaluations.images.store import ImageStore
from tests.helpers.images import image_config, need_root


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
