"""The Python 3.12 venv with real Harbor, pytest and this checkout's client (clients/python), made
once per machine and reused: for the client's own tests and tests/sandboxes/test_harbor_real.py.

    .venv/bin/python -m tests.helpers.harbor_venv     # makes or reuses it, prints its path

It lives in ``~/.cache/term-executor/harbor-venv-<HARBOR_VERSION>``. Harbor's install (some 200
packages) happens when that folder is new; the client is installed again (``pip install
./clients/python``, not editable: as a user gets it) whenever the hash of its source changes. A
stamp file per step says it finished, so an interrupted install is redone, and a lock keeps two
test processes from installing at once. Harbor needs Python 3.12 or later; the venv is made with 3.12
(what issue 37 measured): HARBOR_PYTHON names one, else pyenv's 3.12 or ``python3.12`` on PATH.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HARBOR_VERSION = "0.25.0"
PACKAGES = (f"harbor=={HARBOR_VERSION}", "pytest==9.2.0")
PROJECT = Path(__file__).resolve().parents[2]
CLIENT = PROJECT / "clients" / "python"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "term-executor"


def venv_path() -> Path:
    return CACHE / f"harbor-venv-{HARBOR_VERSION}"


def client_hash() -> str:
    """SHA-256 of the client's package: pyproject, README and src/ (its tests are not installed)."""
    digest = hashlib.sha256()
    files = [CLIENT / "pyproject.toml", CLIENT / "README.md", *sorted((CLIENT / "src").rglob("*.py"))]
    for path in files:
        digest.update(path.relative_to(CLIENT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def python312() -> str:
    if os.environ.get("HARBOR_PYTHON"):
        return os.environ["HARBOR_PYTHON"]
    candidates = []
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(Path(root, "versions").glob("3.12.*/bin/python"), reverse=True)
    if found := shutil.which("python3.12"):
        candidates.append(Path(found))
    if not candidates:
        raise RuntimeError("Harbor needs Python 3.12: set HARBOR_PYTHON, or install one (pyenv install 3.12)")
    return str(candidates[0])


def _pip(venv: Path, *args: str) -> None:
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        check=True,
        cwd=PROJECT,
        stdout=sys.stderr,  # stdout is the venv's path alone (.ci/run reads it)
    )


def ensure() -> Path:
    """The venv's folder, made or brought up to date first (see the module's docstring)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    venv = venv_path()
    with open(CACHE / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        harbor_stamp = venv / ".harbor-installed"
        if not harbor_stamp.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([python312(), "-m", "venv", str(venv)], check=True, stdout=sys.stderr)
            _pip(venv, *PACKAGES)
            harbor_stamp.touch()
        client_stamp = venv / f".client-{client_hash()}"
        if not client_stamp.exists():
            for old in venv.glob(".client-*"):
                old.unlink()
            _pip(venv, "--force-reinstall", "--no-deps", str(CLIENT))
            client_stamp.touch()
    return venv


if __name__ == "__main__":
    try:
        print(ensure())
    except (RuntimeError, subprocess.CalledProcessError) as error:
        sys.exit(f"harbor_venv: {error}")
