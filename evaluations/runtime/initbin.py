"""The sandbox's init (``init.c``), compiled once per host and per source, static.

Static, so that it runs in any image whatever its libc (or none): nothing of the image is loaded
before our code runs. It lives under WORKSPACE_BASE (which every sandbox uid may traverse, as the
egress relay's bundle), in a folder of its own named by the source's hash, made read-only to all
but root; a changed ``init.c`` gets a new folder. It is built once per host into the user's cache
(``~/.cache/term-executor/sandbox-init``) and copied from there. Building needs a C compiler with a
static libc (Debian: ``gcc`` and ``libc6-dev``); where there is none, ``InitUnavailable`` says so.
A sandbox runs it from a descriptor its bubblewrap inherits (``open_binary``, ``exec_path``), so no
root it runs in, an image's layer or a read-only one, gets a mount point for it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("init.c")
NAME = "te-init"


class InitUnavailable(RuntimeError):
    """The init cannot be built on this host (no C compiler or static libc)."""


@functools.cache  # once per process: every phase's launch and every policy with network ask
def source_digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def ensure_init(base: Path) -> Path:
    """The folder holding the built init for this source, under ``base`` (WORKSPACE_BASE, which the
    sandbox uids can traverse), copied from this host's build cache (built there if missing)."""
    folder = Path(base) / f".sandbox-init-{source_digest()}"
    if (folder / NAME).is_file():
        return folder
    Path(base).mkdir(parents=True, exist_ok=True)
    binary = built()
    scratch = Path(tempfile.mkdtemp(prefix=".sandbox-init-copy-", dir=base))
    try:
        shutil.copyfile(binary, scratch / NAME)
        os.chmod(scratch / NAME, 0o755)
        os.chmod(scratch, 0o755)
        try:
            os.rename(scratch, folder)  # atomic: a concurrent copy's rename wins, ours is removed
        except OSError:
            if not (folder / NAME).is_file():
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return folder


def open_binary(base: Path) -> int:
    """The built init (``ensure_init``) open for a sandbox to run it from the descriptor, without a
    mount point in the sandbox's root: its bubblewrap gets it with ``pass_fds`` and execs
    ``exec_path(fd)`` (an image's layer and a read-only root stay untouched). Close-on-exec here."""
    return os.open(ensure_init(base) / NAME, os.O_RDONLY | os.O_CLOEXEC)


def exec_path(fd: int) -> str:
    """The path a sandbox execs the init by when it holds it as descriptor ``fd``: its own /proc's
    link to it (the init renames itself te-init, and closes the descriptor, at start)."""
    return f"/proc/self/fd/{fd}"


@functools.cache
def host_binary() -> Path | None:
    """This host's build (``built``), once per process, for the host's own use (a user namespace's
    maker: idmap.py; the launch of every command: policy.py); None where it cannot be built, and
    those do without it."""
    try:
        return built()
    except (InitUnavailable, OSError):
        return None


def cache_dir() -> Path:
    """This host's build cache: one binary per source, for every service and test run of the host."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "term-executor" / "sandbox-init"


def built() -> Path:
    """This host's build of the init for this source (``cache_dir``), built now if missing;
    InitUnavailable without a compiler."""
    binary = cache_dir() / f"{NAME}-{source_digest()}"
    if binary.is_file():
        return binary
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise InitUnavailable("live sandboxes need a C compiler to build their init (apt-get install gcc libc6-dev)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=f".{NAME}-", dir=binary.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, "-O2", "-static", "-Wall", "-o", scratch, str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise InitUnavailable(f"could not build the sandbox init: {done.stderr.strip()[-500:]}")
        os.chmod(scratch, 0o755)
        os.replace(scratch, binary)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
    return binary
