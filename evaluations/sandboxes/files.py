"""Files into and out of a live sandbox (SPEC §24), every path resolved inside its root (SPEC §21).

The sandbox's root is an overlay the sandbox's own root user writes; the executor touches it as
host root, so nothing here builds a host path from a sandbox path. Every path goes through
images/inroot.py: a link on the way is followed as if the root were ``/`` (as ``docker cp`` does in
the container), the last name of a written file is made ``O_EXCL`` and never followed, owners and
modes are set on the handle just made. A tar is unpacked member by member through the same resolver
(images/copyin.py, as ADD does), counted against the sandbox's disk quota and file limit before a
byte is written. What is written belongs to the sandbox's root (uid 0 inside), as ``docker cp``
leaves it.

A path at or below a bind of the sandbox (``binds``: a compose volume, main's /logs/artifacts shared
with a service; each a folder of the session) is in that folder, as the sandbox sees it: the rest of
the path is resolved with the bound folder as the root, through the same resolver, so a link the
sandbox put in a volume is followed inside that volume and never out of it. A bind is matched on the
path as asked (normalised): a link in the root that leads into a bind's mount point is followed in
the root, where the mount point is an empty folder. A read-only bind refuses writes (409); a folder
read as a tar shows each bind below it with the bound folder's contents.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass

from evaluations.images import archive, copyin, inroot
from evaluations.images.errors import ImageError
from evaluations.runtime.types import ImageRoot, Mount
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


def put_file(
    root: ImageRoot, path: str, source, size: int, quota: Quota, used: TreeUsage, binds: Sequence[Mount] = ()
) -> None:
    """``size`` bytes from ``source`` as the file ``path`` (its missing folders made, an existing
    file replaced, a folder there refused)."""
    path = check_path(path)
    tree_fd, inner, bind = _place(root, binds, path, write=True)
    parent, name = posixpath.split(inner)
    try:
        if not name:
            if bind is not None:
                raise FileRequestError(409, "conflict", f"{path} is a folder in the sandbox")
            raise FileRequestError(400, "bad_request", "path: names the root, not a file")
        budget = copyin.Budget(_Upload(path), quota, used)
        budget.take(path, size)
        ids = (root.idmap.host_uid(0), root.idmap.host_gid(0))
        parent_fd = _folder(tree_fd, parent, root)
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
        os.close(tree_fd)


def put_tar(root: ImageRoot, path: str, source, quota: Quota, used: TreeUsage, binds: Sequence[Mount] = ()) -> None:
    """The tar read from ``source`` unpacked under the folder ``path`` (made if missing), in the tree
    that holds ``path`` (its members below another bind land in the folder under it, unseen)."""
    path = check_path(path)
    upload = _Upload(path)
    tree_fd, inner, _ = _place(root, binds, path, write=True)
    try:
        os.close(_folder(tree_fd, inner, root))
        copyin.unpack_tar(upload, source, "the body", tree_fd, inner, root.idmap, copyin.Budget(upload, quota, used))
    except OSError as exc:
        raise _os_error(exc, path) from None
    finally:
        os.close(tree_fd)


def open_path(root: ImageRoot, path: str, binds: Sequence[Mount] = ()) -> tuple[str, int]:
    """("file" | "folder", a handle of it) for ``path``, links followed inside the root (or the bind
    holding it); 404 if missing."""
    path = check_path(path)
    tree_fd, inner, _ = _place(root, binds, path)
    try:
        try:
            fd = inroot.open_in(tree_fd, inner, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise FileRequestError(404, "not_found", f"{path}: no such file or folder in the sandbox") from None
        except OSError as exc:
            raise _os_error(exc, path) from None
    finally:
        os.close(tree_fd)
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        return "folder", fd
    if stat.S_ISREG(mode):
        return "file", fd
    os.close(fd)
    raise FileRequestError(400, "bad_request", f"{path}: neither a file nor a folder")


def _place(root: ImageRoot, binds: Sequence[Mount], path: str, *, write: bool = False) -> tuple[int, str, Mount | None]:
    """Where ``path`` (normalised) is: a handle of the tree holding it (the root, or the folder of the
    innermost bind at or above it), the path inside that tree, and that bind (None: the root).
    ``write``: a read-only bind is refused (409)."""
    bind = max(
        (mount for mount in binds if path == mount.target or path.startswith(mount.target.rstrip("/") + "/")),
        key=lambda mount: len(mount.target),
        default=None,
    )
    if bind is None:
        return inroot.open_root(root.rootfs), path, None
    if write and not bind.writable:
        raise FileRequestError(409, "conflict", f"{path} is on a read-only volume of the sandbox ({bind.target})")
    return inroot.open_root(bind.source), path[len(bind.target) :] or "/", bind


def write_folder(folder_fd: int, out, path: str, binds: Sequence[Mount] = ()) -> None:
    """The folder ``path`` (``folder_fd``, from ``open_path``) as a tar of its contents on ``out``
    (images/archive.py's walk, from handles), each bind below it with the bound folder's contents."""
    path = check_path(path)
    below = [mount for mount in binds if mount.target.startswith(path.rstrip("/") + "/")]
    mounts: dict[str, int] = {}
    try:
        for mount in below:
            mounts[mount.target[len(path.rstrip("/")) + 1 :]] = inroot.open_root(mount.source)
        archive.write_folder_tar(folder_fd, out, f"sandbox folder {path}", mounts)
    finally:
        for fd in mounts.values():
            os.close(fd)


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
