"""Environments for tests: small hand-made trees, and a real one built by `manage.py make_environment`.

The real one costs a debootstrap. What debootstrap downloads is kept between runs of
the suite in ``<project>/data/cache/debootstrap/`` (``--save-tarball`` the first time,
``--from-tarball`` after), so only the first run on a machine needs the mirror (~25 s
download), and the tree make_environment built is kept in ``data/cache/environments/`` until the
code that builds it changes (``build_real``).
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
    """make_environment NAME with PACKAGES in ``root``, as built by the first of the suite's runs
    since the code that builds it last changed.

    The tree a real make_environment made is kept in ``data/cache/environments/<key>/`` (``key``:
    the tarball, the packages, and the bytes of the environments' code and of the command), with
    what the command printed; each pytest-xdist worker of each run copies it into its own root
    (seconds, against 40-90 s for a build beside the other worker's tests). The first worker to
    need it builds it under a lock the others wait on, downloading only when the tarball is not
    cached either. A build that fails is returned as it is and not kept.
    """
    tarball = cached_tarball()
    build = [name, "--suite", SUITE, "--packages", PACKAGES]
    CACHE.mkdir(parents=True, exist_ok=True)
    BUILT.mkdir(parents=True, exist_ok=True)
    kept = BUILT / _built_key(tarball, build)
    with open(BUILT / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (kept / "done").is_file():
            for old in BUILT.iterdir():  # another key's tree: its code has changed since
                if old.name != ".build.lock":
                    shutil.rmtree(old, ignore_errors=True)
            kept.mkdir()
            made = kept / "root"
            made.mkdir(mode=0o755)
            with open(CACHE / ".download.lock", "w") as download:
                fcntl.flock(download, fcntl.LOCK_EX)
                how = ("--from-tarball",) if tarball.is_file() else ("--save-tarball",)
                built = make_environment(made, *build, *how, str(tarball))
            if built.returncode != 0:
                shutil.rmtree(kept, ignore_errors=True)
                return built
            (kept / "stdout").write_text(built.stdout.replace(str(made), _ROOT_MARK))
            (kept / "stderr").write_text(built.stderr.replace(str(made), _ROOT_MARK))
            (kept / "done").touch()
    copied = subprocess.run(["cp", "-a", str(kept / "root" / name), str(root / name)], capture_output=True, text=True)
    if copied.returncode != 0:
        return copied
    stdout, stderr = ((kept / part).read_text().replace(_ROOT_MARK, str(root)) for part in ("stdout", "stderr"))
    return subprocess.CompletedProcess(copied.args, 0, stdout, stderr)


BUILT = PROJECT / "data" / "cache" / "environments"
_ROOT_MARK = "\0ENVIRONMENTS_ROOT\0"  # where the kept output named the root it was built in


def _built_key(tarball: Path, build: list[str]) -> str:
    code = PROJECT / "evaluations"
    sources = [*sorted((code / "environments").glob("*.py")), code / "management/commands/make_environment.py"]
    digest = hashlib.sha256("\0".join([tarball.name, *build]).encode())
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


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
