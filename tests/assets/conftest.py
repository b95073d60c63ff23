"""A real assets root on disk: files, folders and links, built per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path) -> Path:
    """STATIC_ASSETS_ROOT with a file, a folder tree, links inside and out, and a secret beside it.

    Files only, in the test's tmp_path (pytest removes it); starts nothing."""
    base = tmp_path / "root"
    (base / "corpora" / "en" / "sub").mkdir(parents=True)
    (base / "corpora" / "en" / "words.txt").write_text("alpha\nbeta\n")
    (base / "corpora" / "en" / "sub" / "more.txt").write_text("gamma\n")
    (base / "specs").mkdir()
    (base / "specs" / "api.yaml").write_text("openapi: 3.0.0\n")
    (base / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    os.chmod(base / "tool.sh", 0o750)
    (tmp_path / "secret.txt").write_text("SECRET\n")
    (base / "escape").symlink_to(tmp_path / "secret.txt")
    (base / "escape_dir").symlink_to(tmp_path)
    (base / "inside_link").symlink_to("specs/api.yaml")
    (base / "dangling_out").symlink_to("/nonexistent/elsewhere")
    return base
