"""The toolchains the task's commands see (SPEC §11): a Python venv, caches and prefixes, trusted CAs.

For host and named environments (``command_env``):

1. A venv per evaluation at ``<session>/venv``, first on ``PATH``, so
   ``pip install -e .`` works as written (Debian's interpreter refuses it
   with PEP 668's "externally-managed-environment": the marker concerns the
   base interpreter, never a venv) and what install puts there the agent and
   the tests see. ``include-system-site-packages``: the interpreter's own pip
   (Debian's python3-pip) and whatever the system has stay importable, so no
   pip is copied in.
2. Its few files are written here, not by ``python3 -m venv --without-pip
   --system-site-packages``: the same tree (a test compares them), no
   process to sandbox or kill, a small fraction of that command through the
   spawner, let alone ``ensurepip`` (``python -m bench.venv``, bench/RESULTS.md).
3. Caches and global prefixes (pip, npm, Go, Cargo) live in the session's
   HOME, so ``npm install -g`` needs no root and nothing is shared between
   evaluations.
4. Every common client is pointed at the CA bundle the host trusts
   (``Config.ca_bundle``): the registries here are signed by a local CA,
   and npm stops reading the global npmrc that names it once its prefix
   moves into the session.

An image task (``image_command_env``, SPEC §21) runs with the image's own
environment: no venv, no prefix and nothing of the session on ``PATH``, so
``python3`` and ``pip`` are the image's and what a command installs lands in
the evaluation's writable layer, where ``system_changes`` sees it. Only the
caches in HOME and the CA trust (4) are set, under the image's ``Env``.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from evaluations.images import inroot
from evaluations.runtime.policy import SANDBOX_CA_BUNDLE

log = logging.getLogger(__name__)

# The clients that read a CA bundle from the environment, by the variable each reads.
CA_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL's default (Python's ssl, curl, wget, Go, Ruby)
    "REQUESTS_CA_BUNDLE",  # requests
    "PIP_CERT",  # pip (it vendors requests but reads its own option)
    "NODE_EXTRA_CA_CERTS",  # node, added to its built-in roots
    "npm_config_cafile",  # npm (what the global npmrc set before the prefix moved)
    "GIT_SSL_CAINFO",  # git over https
    "CURL_CA_BUNDLE",  # curl builds that ignore SSL_CERT_FILE
)
_VERSIONED_NAME = re.compile(r"python(\d+\.\d+)")


class Folders(Protocol):
    """The session's folders a task's commands use (pipeline/session.py ``Session`` is one)."""

    @property
    def root(self) -> Path: ...
    @property
    def repo(self) -> Path: ...
    @property
    def home(self) -> Path: ...
    @property
    def tmp(self) -> Path: ...
    @property
    def venv(self) -> Path: ...
    @property
    def uid(self) -> int | None: ...


@dataclass(frozen=True)
class Python:
    """An interpreter as the task's commands see it: ``path`` on their PATH, ``version`` major.minor."""

    path: str
    version: str


@dataclass(frozen=True)
class CaBundle:
    """The CA bundle the host trusts: ``host``, the file; ``sandbox``, where commands read it.

    The same path while commands see the host's own /etc and /usr; under
    another root filesystem the sandbox binds ``host`` at ``sandbox``.
    """

    host: Path
    sandbox: str


def host_ca(config, *, sandboxed: bool) -> CaBundle | None:
    """The host's bundle: in a sandbox, bound at SANDBOX_CA_BUNDLE whatever the root filesystem
    and wherever the host keeps it; without one, where the host has it."""
    if config.ca_bundle is None:
        return None
    return CaBundle(config.ca_bundle, SANDBOX_CA_BUNDLE if sandboxed else str(config.ca_bundle))


def find_python(command_path: str, root: Path = Path("/")) -> Python | None:
    """The ``python3`` a command running with ``command_path`` and ``root`` as / finds first.

    Links are followed inside ``root`` (images/inroot.py: from handles, never on the host);
    the version comes from the name the link ends at (``python3.11``), else from
    ``<prefix>/lib/pythonX.Y``. None when there is none (a Node-only environment): commands
    get no venv.
    """
    root_fd = inroot.open_root(root)
    try:
        for folder in command_path.split(":"):
            if not folder.startswith("/"):
                continue  # an empty or relative entry would depend on the command's cwd
            path = f"{folder.rstrip('/')}/python3"
            try:
                real = inroot.resolve(root_fd, path, keep_missing=False, folder=False)
            except OSError:
                continue
            if not _executable(root_fd, real):
                continue
            version = _version(root_fd, real)
            if version is None:
                log.warning("%s (/%s): cannot tell its version; commands get no venv", path, real)
                return None
            return Python(path, version)
        return None
    finally:
        os.close(root_fd)


def make_venv(venv_dir: Path, python: Python, uid: int | None) -> None:
    """Write a venv for ``python`` into the empty folder ``venv_dir``, then give it to ``uid``.

    What ``python3 -m venv --without-pip --system-site-packages`` writes
    (the activate scripts aside), plus ``pip``/``pip3`` launchers running
    the interpreter's own pip. Call before any command of the evaluation
    runs: the files are written as root, in a folder no one else can write.
    """
    if any(venv_dir.iterdir()):
        raise FileExistsError(errno.EEXIST, "venv folder is not empty", str(venv_dir))
    short = f"python{python.version}"
    made: list[Path] = []

    def folder(path: Path) -> Path:
        path.mkdir(mode=0o755)
        made.append(path)
        return path

    def link(path: Path, target: str) -> None:
        os.symlink(target, path)
        made.append(path)

    def write(path: Path, text: str, mode: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        made.append(path)

    write(
        venv_dir / "pyvenv.cfg",
        f"home = {os.path.dirname(python.path)}\ninclude-system-site-packages = true\nversion = {python.version}\n",
        0o644,
    )
    bin_dir = folder(venv_dir / "bin")
    link(bin_dir / "python3", python.path)
    link(bin_dir / "python", "python3")
    link(bin_dir / short, "python3")
    for name in ("pip", "pip3", f"pip{python.version}"):
        write(bin_dir / name, _pip_launcher(bin_dir / "python3"), 0o755)
    folder(folder(folder(venv_dir / "lib") / short) / "site-packages")
    link(venv_dir / "lib64", "lib")
    folder(folder(venv_dir / "include") / short)
    if uid is not None:
        for path in (venv_dir, *made):
            os.chown(path, uid, uid, follow_symlinks=False)
    os.chmod(venv_dir, 0o755)


def make_session_venv(session: Folders, python: Python | None) -> None:
    """The evaluation's venv, if its commands have a Python at all."""
    if python is not None:
        make_venv(session.venv, python, session.uid)


def command_env(session: Folders, command_path: str, ca: CaBundle | None) -> dict[str, str]:
    """The variables of SPEC §11 for every task command: PATH, the venv, caches, prefixes, CA trust."""
    home = session.home
    env = home_env(home)
    bins = [home / ".npm-global" / "bin", home / "go" / "bin", home / ".cargo" / "bin"]
    if (session.venv / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(session.venv)
        bins.insert(0, session.venv / "bin")
    env["PATH"] = ":".join([*map(str, bins), command_path])
    if ca is not None:
        env.update(dict.fromkeys(CA_VARIABLES, ca.sandbox))
    return env


def image_command_env(home: Path, command_path: str, ca: CaBundle | None) -> dict[str, str]:
    """An image task's variables (SPEC §21): the image's PATH as it is, the caches in HOME, CA trust.

    No VIRTUAL_ENV and no global prefix of ours (npm's, Go's, Cargo's): the image's own, from its
    ``Env`` or its tools' defaults, so ``npm install -g`` and ``cargo install`` land in the image."""
    env = cache_env(home)
    env["PATH"] = command_path
    if ca is not None:
        env.update(dict.fromkeys(CA_VARIABLES, ca.sandbox))
    return env


def home_env(home: Path) -> dict[str, str]:
    """HOME and the caches and global prefixes of pip, npm, Go and Cargo in it."""
    return {
        **cache_env(home),
        "npm_config_prefix": str(home / ".npm-global"),  # `npm install -g` without root
        "GOPATH": str(home / "go"),
        "CARGO_HOME": str(home / ".cargo"),
    }


def cache_env(home: Path) -> dict[str, str]:
    """HOME and the caches of pip, npm and Go in it: nothing there is on a PATH or imported."""
    return {
        "HOME": str(home),
        "PIP_CACHE_DIR": str(home / ".cache" / "pip"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",  # one request to PyPI per evaluation, for a notice
        "npm_config_cache": str(home / ".npm"),
        "npm_config_update_notifier": "false",  # the same for npm
        "npm_config_fund": "false",
        "GOCACHE": str(home / ".cache" / "go-build"),
    }


def _pip_launcher(python: Path) -> str:
    # pip's own console script, with a sentence instead of a traceback when the interpreter has no pip.
    return (
        f"#!{python}\n"
        "import sys\n"
        "try:\n"
        "    from pip._internal.cli.main import main\n"
        "except ImportError as exc:\n"
        "    sys.exit(f'pip: this Python ({sys.base_prefix}) has no pip of its own ({exc}); '\n"
        "             'install it in the environment (Debian: python3-pip)')\n"
        "sys.exit(main())\n"
    )


def _executable(root_fd: int, real: str) -> bool:
    """Whether ``real`` (resolved in the root) is a regular file someone may execute."""
    try:
        fd = inroot.open_in(root_fd, real, os.O_PATH, follow_last=False)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)


def _version(root_fd: int, real: str) -> str | None:
    named = _VERSIONED_NAME.fullmatch(os.path.basename(real))
    if named:
        return named.group(1)
    prefix = os.path.dirname(os.path.dirname(real))
    try:
        lib = inroot.open_dir(root_fd, f"{prefix}/lib")
    except OSError:
        return None
    try:
        names = [name for name in os.listdir(lib) if fnmatch.fnmatchcase(name, "python3.*")]
    finally:
        os.close(lib)
    versions = {name.removeprefix("python") for name in names if _exists(root_fd, f"{prefix}/lib/{name}/os.py")}
    return versions.pop() if len(versions) == 1 else None


def _exists(root_fd: int, path: str) -> bool:
    try:
        os.close(inroot.open_in(root_fd, path, os.O_PATH))
    except OSError:
        return False
    return True
