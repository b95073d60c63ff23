"""Headless Chromium for the admin's browser test: Debian's chromium, driven by playwright-core (npm).

Nothing is vendored and no browser is downloaded: playwright-core (the driver alone, about
14 MB) is installed once into .venv/node-playwright with npm, and launches /usr/bin/chromium.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
PLAYWRIGHT_CORE = "playwright-core@1.65.1"
DRIVER_DIR = PROJECT / ".venv" / "node-playwright"
SCRIPT = Path(__file__).with_name("browse.js")


def _missing(reason: str):
    # CI (.ci/run) installs chromium and sets REQUIRE_SANDBOX=1: there a missing browser is a failure.
    if os.environ.get("REQUIRE_SANDBOX") == "1":
        pytest.fail(f"REQUIRE_SANDBOX=1 but {reason}")
    pytest.skip(reason)


def chromium_path() -> str:
    found = shutil.which("chromium")
    if found is None:
        _missing("Debian's chromium is not installed (apt-get install chromium)")
    return found


def driver_dir() -> Path:
    """The folder whose node_modules holds playwright-core, installed on first use."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        _missing("node and npm are needed to drive chromium")
    marker = DRIVER_DIR / "node_modules" / "playwright-core" / "package.json"
    if not marker.exists():
        DRIVER_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(DRIVER_DIR), PLAYWRIGHT_CORE],
            check=True,
            capture_output=True,
            timeout=300,
            env={**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"},
        )
    return DRIVER_DIR


def browse(base: str, visits: list[dict], *, user: str, password: str, shots: Path) -> dict:
    """Log in, then make each visit in one fresh browser profile; returns what the probes read."""
    executable = chromium_path()
    modules = driver_dir() / "node_modules"
    shots.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="te-chromium-") as profile:
        plan = {
            "base": base,
            "user": user,
            "password": password,
            "userDataDir": profile,
            "executable": executable,
            "shots": str(shots),
            "visits": visits,
        }
        done = subprocess.run(
            ["node", str(SCRIPT)],
            input=json.dumps(plan),
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "NODE_PATH": str(modules)},
        )
    if done.returncode != 0:
        raise AssertionError(f"the browser script failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)
