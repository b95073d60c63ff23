"""Environments for tests: small hand-made trees, and a real one built by `manage.py make_environment`.

The real one costs a debootstrap. What debootstrap downloads is kept between runs of
the suite in ``<project>/data/cache/debootstrap/`` (``--save-tarball`` the first time,
``--from-tarball`` after), so only the first run on a machine needs the mirror (~25 s
download); every run (each of its xdist workers) still builds the tree with make_environment (~40 s).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from evaluations.environments.build import DEFAULT_MIRROR, DEFAULT_PACKAGES
from tests.helpers.service import PROJECT

SUITE = "bookworm"
NAME = "tools"
HOST_LACKS = "tree"  # the tool the test environment has and this host has not
PACKAGES = f"{DEFAULT_PACKAGES} {HOST_LACKS}"
CACHE = PROJECT / "data" / "cache" / "debootstrap"


def environments_root() -> Path:
    """A fresh ENVIRONMENTS_ROOT the sandbox uids can enter (pytest's tmp folders are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="te-environments-", dir="/tmp"))
    os.chmod(root, 0o755)
    return root


def make_environment(
    root: Path, *args: str, environ: dict[str, str] | None = None, timeout: float = 900, **popen
) -> subprocess.CompletedProcess | subprocess.Popen:
    """`manage.py make_environment ARGS` with ENVIRONMENTS_ROOT=root; background=True gives the Popen."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST_"))}
    env.update({"ENVIRONMENTS_ROOT": str(root), "DATA_DIR": str(root.parent / f"{root.name}-data")})
    env.pop("DEFAULT_ENVIRONMENT", None)
    env.update(environ or {})
    argv = [sys.executable, "manage.py", "make_environment", *args]
    if popen.pop("background", False):
        return subprocess.Popen(argv, cwd=PROJECT, env=env, text=True, **popen)
    return subprocess.run(argv, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=timeout, **popen)


def cached_tarball(packages: str = PACKAGES, suite: str = SUITE, mirror: str = DEFAULT_MIRROR) -> Path:
    key = hashlib.sha256(f"{suite}\0{' '.join(sorted(packages.split()))}\0{mirror}".encode()).hexdigest()[:16]
    return CACHE / f"{suite}-{key}.tar.gz"


def build_real(root: Path, name: str = NAME) -> subprocess.CompletedProcess:
    """make_environment NAME with PACKAGES, downloading only when the cache lacks the tarball.

    Each pytest-xdist worker builds its own tree; the download is made once, under a lock that
    the others wait on, then each builds from the tarball.
    """
    tarball = cached_tarball()
    build = [name, "--suite", SUITE, "--packages", PACKAGES]
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.is_file():
            return make_environment(root, *build, "--save-tarball", str(tarball))
    return make_environment(root, *build, "--from-tarball", str(tarball))


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(root.parent / f"{root.name}-data", ignore_errors=True)


# -- hand-made trees ---------------------------------------------------------------------


def fake_environment(root: Path, name: str, *, sh: bool = True, usr: bool = True) -> Path:
    """The least a Debian tree has for the checks: bin -> usr/bin, usr/bin/sh -> dash (nothing here is run)."""
    tree = root / name
    tree.mkdir(parents=True)
    os.chmod(tree, 0o755)
    if usr:
        (tree / "usr" / "bin").mkdir(parents=True)
        (tree / "bin").symlink_to("usr/bin")
    if usr and sh:
        executable(tree / "usr" / "bin" / "dash")
        (tree / "usr" / "bin" / "sh").symlink_to("dash")
    return tree


def executable(path: Path, text: str = "#!/bin/false\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, 0o755)
    return path


def dpkg_status(tree: Path, packages: dict[str, str], *, removed: tuple[str, ...] = ()) -> None:
    """var/lib/dpkg/status with these packages installed (and ``removed`` ones only configured away)."""
    stanzas = [
        f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
        f"Description: {name}\n a line of description: with a colon\n"
        for name, version in packages.items()
    ]
    stanzas += [f"Package: {name}\nStatus: deinstall ok config-files\nVersion: 9.9.9-1\n" for name in removed]
    status = tree / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n".join(stanzas))
