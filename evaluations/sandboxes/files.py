"""Files into and out of a live sandbox (SPEC §24), every path resolved inside its root (SPEC §21).

The sandbox's root is an overlay the sandbox's own root user writes; the executor touches it as
host root, so nothing here builds a host path from a sandbox path. Every path goes through
images/inroot.py: a link on the way is followed as if the root were ``/`` (as ``docker cp`` does in
the container), the last name of a written file is made ``O_EXCL`` and never followed, owners and
modes are set on the handle just made. A tar is unpacked member by member through the same resolver
(images/copyin.py, as ADD does), counted against the sandbox's disk quota and file limit before a
byte is written. What is written belongs to the sandbox's root (uid 0 inside), as ``docker cp``
leaves it.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import time
from dataclasses import dataclass

from evaluations.images import archive, copyin, inroot
from evaluations.images.errors import ImageError
from evaluations.runtime.types import ImageRoot
from evaluations.safefs import TreeUsage


class FileRequestError(Exception):
    """A transfer that cannot be done; ``status`` is the HTTP status it answers with."""

    def __init__(self, status: int, code: str, sentence: str):
        super().__init__(sentence)
        self.status = status
        self.code = code
        self.sentence = sentence


@dataclass(frozen=True)
class Quota:
    """What the sandbox's writable layer may hold (DISK_QUOTA_MB and MAX_FILES, or the sandbox's own)."""

    disk_quota_bytes: int
    max_files: int

    @property
    def disk_quota_mb(self) -> int:
        return self.disk_quota_bytes // (1024 * 1024)


class _Upload:
    """What copyin's tar writer and budget call back on: the error of this upload."""

    def __init__(self, shown: str):
        self.shown = shown

    def error(self, sentence: str) -> FileRequestError:
        if "quota" in sentence or "limit" in sentence:
            return FileRequestError(413, "payload_too_large", sentence)
        return FileRequestError(400, "bad_request", sentence)


def check_path(path: str | None, what: str = "path") -> str:
    """An absolute path inside the sandbox, normalised; ``..`` past the root stays at the root."""
    if not path or not path.startswith("/") or "\0" in path or len(path) > 4096:
        raise FileRequestError(400, "bad_request", f"{what}: expected an absolute path inside the sandbox")
    return posixpath.normpath(path)


def put_file(root: ImageRoot, path: str, source, size: int, quota: Quota, used: TreeUsage) -> None:
    """``size`` bytes from ``source`` as the file ``path`` (its missing folders made, an existing
    file replaced, a folder there refused)."""
    path = check_path(path)
    parent, name = posixpath.split(path)
    if not name:
        raise FileRequestError(400, "bad_request", "path: names the root, not a file")
    budget = copyin.Budget(_Upload(path), quota, used)
    budget.take(path, size)
    ids = (root.idmap.host_uid(0), root.idmap.host_gid(0))
    root_fd = inroot.open_root(root.rootfs)
    try:
        parent_fd = _folder(root_fd, parent, root)
        try:
            try:
                copyin.clear(parent_fd, name, folders=False)
            except IsADirectoryError:
                raise FileRequestError(409, "conflict", f"{path} is a folder in the sandbox") from None
            copyin.write_file(source, size, parent_fd, name, ids, 0o644, time.time_ns())
        finally:
            os.close(parent_fd)
    except OSError as exc:
        raise _os_error(exc, path) from None
    finally:
        os.close(root_fd)


def put_tar(root: ImageRoot, path: str, source, quota: Quota, used: TreeUsage) -> None:
    """The tar read from ``source`` unpacked under the folder ``path`` (made if missing)."""
    path = check_path(path)
    upload = _Upload(path)
    root_fd = inroot.open_root(root.rootfs)
    try:
        os.close(_folder(root_fd, path, root))
        copyin.unpack_tar(upload, source, "the body", root_fd, path, root.idmap, copyin.Budget(upload, quota, used))
    except OSError as exc:
        raise _os_error(exc, path) from None
    finally:
        os.close(root_fd)


def open_path(root: ImageRoot, path: str) -> tuple[str, int]:
    """("file" | "folder", a handle of it) for ``path``, links followed inside the root; 404 if missing."""
    path = check_path(path)
    root_fd = inroot.open_root(root.rootfs)
    try:
        try:
            fd = inroot.open_in(root_fd, path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise FileRequestError(404, "not_found", f"{path}: no such file or folder in the sandbox") from None
        except OSError as exc:
            raise _os_error(exc, path) from None
    finally:
        os.close(root_fd)
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        return "folder", fd
    if stat.S_ISREG(mode):
        return "file", fd
    os.close(fd)
    raise FileRequestError(400, "bad_request", f"{path}: neither a file nor a folder")


def write_folder(folder_fd: int, out, path: str) -> None:
    """The folder as a tar of its contents on ``out`` (images/archive.py's walk, from handles)."""
    archive.write_folder_tar(folder_fd, out, f"sandbox folder {path}")


def _folder(root_fd: int, path: str, root: ImageRoot) -> int:
    try:
        return copyin.mkdirs(root_fd, path, 0, 0, root.idmap)
    except ImageError as exc:
        raise FileRequestError(409, "conflict", str(exc)) from None


def _os_error(exc: OSError, path: str) -> FileRequestError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return FileRequestError(507, "insufficient_storage", f"{path}: the host's disk is full")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return FileRequestError(409, "conflict", f"{path}: a part of it is not a folder in the sandbox")
    return FileRequestError(400, "bad_request", f"{path}: {exc.strerror or exc}")
