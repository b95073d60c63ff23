"""Helpers for the build tests (their fixtures are in conftest.py): a ``BuildEnvironment`` over
the real bubblewrap runtime that records its progress lines, the Config, a context on disk."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from evaluations.images.build import BuildEnvironment
from evaluations.runtime.idmap import ID_COUNT
from tests.helpers.images import image_config
from tests.runtime.support import UID

_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
ID_BASE = 420_000_000 + _WORKER * 4 * ID_COUNT  # far from test_rootfs' ranges and every uid of the suite
BASE_REF = "localhost/test/debian:base"


def config_for(images_dir: Path, **env: str):
    """A Config with IMAGES_DIR ``images_dir`` and, beside it, a WORKSPACE_BASE of the test's own
    (0711 as a real one: a build mounts its roots there, where the sandbox uid reaches them; the
    store itself is 0700)."""
    sessions = images_dir.parent / "sessions"
    sessions.mkdir(mode=0o711, exist_ok=True)
    values = {
        "IMAGES_DIR": str(images_dir),
        "WORKSPACE_BASE": str(sessions),
        "BUILD_NETWORK": "off",
        "BUILD_TIMEOUT_SECS": "600",
    }
    return image_config(**{**values, **env})


class Recorder:
    """The progress callback: every line kept, so a test can count the RUNs that ran."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        self.lines.append(text)

    def ran(self) -> list[str]:
        return [line for line in self.lines if ": RUN " in line and not line.endswith("(cached)")]


def environment(runtime, config, **fields) -> BuildEnvironment:
    return BuildEnvironment(runtime=runtime, uid=UID, id_base=ID_BASE, config=config, progress=Recorder(), **fields)


def write_context(folder: Path, files: dict[str, str | bytes]) -> Path:
    """A build context: ``files`` by relative path (the Dockerfile among them)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for relpath, data in files.items():
        path = folder / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return folder
