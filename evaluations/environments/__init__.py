"""Environments: root filesystems under ENVIRONMENTS_ROOT that a task's commands run in as `/` (SPEC §11).

Plain Python, no Django: the API lists them, the pipeline resolves one, make_environment builds one
(build.py, beside).

1. A link inside an environment means what it would mean with the environment as `/`
   (`bin -> usr/bin`, `/usr/bin/sh -> dash`): ``inside`` resolves it against the
   environment's root, never against the host's, and every file here is read through a
   handle opened in that root (images/inroot.py, the one resolver: an image's root is
   an environment too), never by a host path joined from what the tree holds.
2. Nothing is run to learn what an environment offers: versions come from files
   (dpkg's database, Python's patchlevel.h, node's node_version.h, the interpreter's
   file name), as the web process runs no command.
3. ``identity`` changes when the environment is rebuilt, replaced or has packages
   installed into it, so it can key a cache of things made from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from evaluations.images import inroot

NAME_RULE = re.compile(r"[a-z0-9][a-z0-9._-]*")
MAX_NAME_LENGTH = 64
STAMP_FILE = ".term-executor-environment"  # written by make_environment: {"id": ..., how it was built}
DPKG_STATUS = "var/lib/dpkg/status"
BIN_DIRS = ("usr/local/bin", "usr/bin", "bin")  # the order of the sandbox's PATH

_PY_VERSION = re.compile(rb'#define\s+PY_VERSION\s+"([0-9][^"]*)"')
_NODE_PART = re.compile(rb"#define\s+NODE_(MAJOR|MINOR|PATCH)_VERSION\s+([0-9]+)")
_PYTHON_FILE = re.compile(r"python(3\.[0-9]+)")
_UPSTREAM = re.compile(r"[0-9]+(?:\.[0-9]+)*")


class BadEnvironment(ValueError):
    """An environment name or folder that cannot be used; the message says which and why."""


class UnknownEnvironment(BadEnvironment):
    """No environment of that name: ``unknown environment: NAME (available: a, b)``."""


@dataclass(frozen=True)
class Environment:
    name: str
    root: Path  # the real path (links resolved): what the sandbox binds as /
    identity: str
    python: str | None  # e.g. "3.11.2"; "3.11" when only the file name tells
    node: str | None


def check_name(name: object) -> str:
    """The name if it follows the rule; BadEnvironment with one sentence otherwise."""
    if not isinstance(name, str):
        raise BadEnvironment("an environment name must be a string")
    if not name:
        raise BadEnvironment("an environment name must not be empty")
    if "/" in name:
        raise BadEnvironment(f"environment name {name!r} must not contain '/'")
    if ".." in name:
        raise BadEnvironment(f"environment name {name!r} must not contain '..'")
    if len(name) > MAX_NAME_LENGTH:
        raise BadEnvironment(f"environment name {name!r} is longer than {MAX_NAME_LENGTH} characters")
    if not NAME_RULE.fullmatch(name):
        raise BadEnvironment(
            f"environment name {name!r} is not valid: lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or a digit"
        )
    return name


def list_environments(root: Path | str | None) -> list[Environment]:
    """The valid environments under root, by name; other entries (``.building-*``, bad ones) are left out."""
    if root is None:
        return []
    found = []
    for name in _candidate_names(Path(root)):
        try:
            found.append(inspect(Path(root), name))
        except BadEnvironment:
            continue
    return found


def resolve(root: Path | str | None, name: str) -> Environment:
    """The environment called name; UnknownEnvironment or BadEnvironment saying why not."""
    check_name(name)
    base = Path(root) if root is not None else None
    if base is None or not os.path.lexists(base / name):
        available = ", ".join(env.name for env in list_environments(base)) or "none"
        hint = "" if base is not None else "; ENVIRONMENTS_ROOT is not set"
        raise UnknownEnvironment(f"unknown environment: {name} (available: {available}{hint})")
    return inspect(base, name)


def inside(root: Path | str, path: str) -> str | None:
    """What ``path`` names with root as `/`: a path inside root with every link resolved, or None.

    None when a component is missing, not a folder, or links loop. ``..`` stops at
    the root as it does at `/`, so no link can lead out of the environment. The walk is
    inroot.resolve's, from handles (no host path is built: no PATH_MAX, no link followed
    on the host).
    """
    try:
        with _root(root) as root_fd:
            return "/" + inroot.resolve(root_fd, path, keep_missing=False, folder=False)
    except OSError:
        return None


@contextlib.contextmanager
def _root(root: Path | str) -> Iterator[int]:
    """A handle of the environment's root (inroot.open_root), closed after the block."""
    root_fd = inroot.open_root(root)
    try:
        yield root_fd
    finally:
        os.close(root_fd)


def _stat_in(root: Path | str, inner: str) -> os.stat_result | None:
    """What ``inner`` (links resolved in root) is, by a handle opened in root; None when missing."""
    try:
        with _root(root) as root_fd:
            fd = inroot.open_in(root_fd, inner, os.O_PATH)
    except OSError:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def find_interpreter(env_or_root: Environment | Path | str, name: str) -> str | None:
    """Where ``name`` (python3, node, bash) is inside the environment, as PATH would find it, or None.

    The path is the one PATH gives (``/usr/bin/python3``), not its link's target; it
    names an executable regular file once links are resolved inside the environment.
    """
    root = env_or_root.root if isinstance(env_or_root, Environment) else Path(env_or_root)
    for folder in BIN_DIRS:
        target = inside(root, f"{folder}/{name}")
        if target is not None and _is_executable(root, target):
            return f"/{folder}/{name}"
    return None


def runtimes(root: Path | str = "/") -> dict[str, str | None]:
    """{"python": ..., "node": ...}: the versions python3 and node on PATH would be (None if absent).

    With the default root, what the host itself offers (GET /status `runtimes`).
    """
    root = Path(root)
    return {"python": _python_version(root), "node": _node_version(root)}


def identity(root: Path) -> str:
    """Changes when the tree is replaced (inode, ctime), rebuilt (the stamp's id) or apt-installed into (dpkg)."""
    st = os.stat(root)
    parts = [str(st.st_ino), str(st.st_ctime_ns), _stamp_id(root)]
    status = _stat_in(root, DPKG_STATUS)
    parts.append(f"{status.st_mtime_ns}-{status.st_size}" if status is not None else "")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


# -- validation ---------------------------------------------------------------------------


def _candidate_names(root: Path) -> list[str]:
    try:
        entries = os.listdir(root)
    except OSError:
        return []
    return sorted(name for name in entries if NAME_RULE.fullmatch(name) and ".." not in name)


def inspect(base: Path, folder_name: str, shown: str | None = None) -> Environment:
    """Check base/folder_name as SPEC §11 asks and read what it offers; messages call it ``shown``.

    make_environment checks its tree here before giving it its name (``shown``).
    """
    name = shown or folder_name
    folder = base / folder_name
    try:
        real_base, real = inroot.host_path(base), inroot.host_path(folder)
    except OSError:  # a loop of links: nothing it names exists
        raise BadEnvironment(f"environment {name} does not exist (a dangling link)") from None
    if os.path.islink(folder) and not real.startswith(real_base.rstrip("/") + "/"):
        raise BadEnvironment(f"environment {name} is a symbolic link to {real}, outside ENVIRONMENTS_ROOT")
    try:
        st = os.stat(real)
    except OSError:
        raise BadEnvironment(f"environment {name} does not exist (a dangling link)") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BadEnvironment(f"environment {name} is not a folder")
    if st.st_mode & 0o005 != 0o005:
        raise BadEnvironment(
            f"environment {name}: its folder is mode {stat.S_IMODE(st.st_mode):04o}; "
            "the sandbox uids need to read and enter it (0755)"
        )
    root = Path(real)
    usr = _stat_in(root, "usr")
    if usr is None or not stat.S_ISDIR(usr.st_mode):
        raise BadEnvironment(f"environment {name} has no usr/ folder")
    sh = inside(root, "bin/sh")
    if sh is None or not _is_executable(root, sh):
        raise BadEnvironment(f"environment {name} has no bin/sh (an executable file, links resolved inside it)")
    versions = runtimes(root)
    return Environment(name, root, identity(root), versions["python"], versions["node"])


def _is_executable(root: Path, inner: str) -> bool:
    st = _stat_in(root, inner)
    return st is not None and stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)


def _stamp_id(root: Path) -> str:
    try:
        return str(json.loads(_read(root, STAMP_FILE, 1024 * 1024) or b"").get("id", ""))
    except (ValueError, AttributeError):
        return ""


# -- versions, from files ----------------------------------------------------------------


def _python_version(root: Path) -> str | None:
    """python3 as PATH finds it; its file name gives 3.X, then a header or dpkg gives 3.X.Y."""
    found = find_interpreter(root, "python3")
    if found is None:
        return None
    target = inside(root, found)
    matched = _PYTHON_FILE.fullmatch(os.path.basename(target))
    minor = matched.group(1) if matched else None
    prefix = os.path.dirname(os.path.dirname(target))  # /usr/bin/python3.11 -> /usr
    minors = [minor] if minor else _header_minors(root, prefix)
    for each in minors:
        header = _read(root, f"{prefix}/include/python{each}/patchlevel.h", 64 * 1024)
        found_version = _PY_VERSION.search(header or b"")
        if found_version:
            return found_version.group(1).decode()
    packages = _dpkg_versions(root)
    if prefix == "/usr":
        candidates = [f"python{minor}-minimal", f"python{minor}"] if minor else ["python3-minimal", "python3"]
        for package in candidates:
            if package in packages:
                return packages[package]
    return minor


def _header_minors(root: Path, prefix: str) -> list[str]:
    """For a python3 that is no link to python3.X: the versions whose headers the prefix holds, newest first."""
    try:
        with _root(root) as root_fd:
            fd = inroot.open_dir(root_fd, f"{prefix}/include")
    except OSError:
        return []
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    minors = [m.group(1) for m in map(_PYTHON_FILE.fullmatch, names) if m]
    return sorted(minors, key=lambda v: int(v.split(".")[1]), reverse=True)


def _node_version(root: Path) -> str | None:
    found = find_interpreter(root, "node")
    if found is None:
        return None
    prefix = os.path.dirname(os.path.dirname(inside(root, found)))
    header = _read(root, f"{prefix}/include/node/node_version.h", 64 * 1024)
    parts = dict((k.decode(), v.decode()) for k, v in _NODE_PART.findall(header or b""))
    if len(parts) == 3:
        return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    if prefix == "/usr":
        return _dpkg_versions(root).get("nodejs")
    return None


def _read(root: Path, path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``path`` (links resolved in root); None if none."""
    try:
        with _root(root) as root_fd:
            return inroot.read_in(root_fd, path, limit)
    except OSError:
        return None


_DPKG_MAX_BYTES = 256 * 1024 * 1024
_parsed: dict[tuple, dict[str, str]] = {}  # (root, inode, mtime, size) -> versions; at most 64 kept


def _dpkg_versions(root: Path) -> dict[str, str]:
    """Installed python3*/nodejs packages -> upstream version, from the environment's dpkg database.

    Parsed once per version of the file (a full system's is ~1 MB): the key holds its inode,
    mtime and size, read from the handle the bytes come from."""
    try:
        with _root(root) as root_fd:
            fd = inroot.open_in(root_fd, DPKG_STATUS, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {}
        key = (str(root), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if key not in _parsed:
            with os.fdopen(os.dup(fd), "rb") as handle:
                text = handle.read(_DPKG_MAX_BYTES).decode("utf-8", errors="replace")
            if len(_parsed) >= 64:
                _parsed.pop(next(iter(_parsed)))
            _parsed[key] = _parse_dpkg_status(text)
        return _parsed[key]
    except OSError:
        return {}
    finally:
        os.close(fd)


def _parse_dpkg_status(text: str) -> dict[str, str]:
    versions = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        package = fields.get("Package", "")
        if not (package.startswith("python3") or package == "nodejs"):
            continue
        if not fields.get("Status", "").endswith(" installed"):
            continue
        upstream = _UPSTREAM.match(fields.get("Version", "").split(":", 1)[-1])
        if upstream:
            versions[package] = upstream.group(0)
    return versions
