"""The one resolver for paths inside an untrusted tree (SPEC §21).

An image's root, a layer, a build context, an ``ADD`` archive's destination or an evaluation's
writable layer is content someone else shaped: any component of any path in it may be a link,
absolute or relative, and may be swapped between two calls. The executor touches such a tree
only through this module, and this is the property it keeps:

    A path given here is resolved as if the tree's root were ``/``: every link, anywhere on the
    path, is followed inside the root; ``..`` stops at the root; an absolute link starts again
    at the root. Nothing resolved here names a file outside the root, whatever the tree holds
    and however it changes meanwhile.

How:

1. The root is held as a handle (``open_root``), never as a string to join onto.
2. ``open_in`` asks the kernel: ``openat2(2)`` with ``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS``
   (Linux 5.6+), which keeps the property against concurrent renames too. Without it
   (``ENOSYS``), or for a path longer than ``PATH_MAX``, ``_walk`` does the same from handles:
   each component opened ``O_PATH | O_NOFOLLOW`` from the folder before it, each link read
   (``readlinkat``) and applied itself, an absolute one from the root handle, ``..`` at the root
   staying there, at most ``MAX_LINKS`` links per call (``ELOOP``), as the kernel.
3. No host path through the tree is ever built as a string, so there is no ``PATH_MAX`` on how
   deep a tree or a chain of links goes, and no ``realpath`` that silently gives up.
4. Creating or replacing the last component never follows it: ``parent_and_name`` resolves the
   folder in the root and hands back the last name for ``*at`` calls (``O_EXCL``, ``O_NOFOLLOW``,
   ``AT_SYMLINK_NOFOLLOW``) on that folder's handle.
5. ``resolve`` gives the resolved path itself, as the tree's own (relative) path, for what needs
   a name rather than a handle (a WorkingDir compared with a layer's folders, a program's path
   inside the image); it is computed by the same walk from handles, never on a host path.
6. Attributes are applied on handles (``fchmod``, ``fchown``, ``futimens`` on a descriptor opened
   here), never by a path resolved again later.

Every function but ``resolve`` returns descriptors the caller closes; errors are ``OSError`` with the kernel's
errno (``ENOENT``, ``ENOTDIR``, ``ELOOP``, ``EEXIST``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

MAX_LINKS = 40  # per resolution, as the kernel's ELOOP bound
PATH_MAX = 4096

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(os.uname().machine)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_RESOLVE_IN_ROOT = 0x10
_O_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_STEP = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # a folder to list or fchmod


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
# None until the first call tells; the tests set it False to exercise the walk.
use_openat2: bool | None = None if _SYS_OPENAT2 is not None else False


def open_root(path) -> int:
    """A handle of the folder ``path`` (host-chosen, trusted) as the root of what lies below."""
    return os.open(path, _O_PATH_DIR | os.O_NOFOLLOW)


def open_in(
    root_fd: int, relpath: str, flags: int, mode: int = 0o644, *, follow_last: bool = True, beneath: bool = False
) -> int:
    """``relpath`` opened with ``flags`` as if ``root_fd`` were ``/`` (the module's property).

    A leading ``/`` is the root's. ``follow_last=False``: a link as the last component is not
    followed (``O_NOFOLLOW``: ``ELOOP``, or with ``O_PATH`` the link itself). ``beneath``: a
    ``..`` above the root or an absolute link is refused (``EXDEV``) instead of starting again
    at the root (``RESOLVE_BENEATH``): a build context, whose links may not leave it.
    """
    if "\0" in relpath:
        raise OSError(errno.EINVAL, "NUL byte in path", relpath)
    flags |= os.O_CLOEXEC | (0 if follow_last else os.O_NOFOLLOW)
    path = relpath.lstrip("/") or "."
    if len(path.encode()) < PATH_MAX and _have_openat2(root_fd):
        creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
        resolve = _RESOLVE_BENEATH if beneath else _RESOLVE_IN_ROOT
        return _openat2(root_fd, path, flags, mode if creates else 0, resolve)
    return _walk(root_fd, path, flags, mode, beneath=beneath)


def _have_openat2(root_fd: int) -> bool:
    global use_openat2
    if use_openat2 is None:
        try:
            os.close(_openat2(root_fd, ".", _O_PATH_DIR, 0, _RESOLVE_IN_ROOT))
            use_openat2 = True
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):  # no such syscall, or a seccomp filter's
                raise
            use_openat2 = False
    return use_openat2


def _openat2(root_fd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    how = _OpenHow(flags, mode, resolve | _RESOLVE_NO_MAGICLINKS)
    encoded = os.fsencode(path)
    for _ in range(16):  # EAGAIN: a rename raced a ".." in the kernel's walk, which asks to retry
        fd = _libc.syscall(_SYS_OPENAT2, root_fd, encoded, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    raise OSError(err, os.strerror(err), path)


def _walk(root_fd: int, path: str, flags: int, mode: int, *, mkdir=None, beneath: bool = False) -> int:
    """``open_in`` from handles alone (the module's point 2).

    ``mkdir``: ``(dir_fd, name) -> None``, making a missing folder (mkdirs_in); every component
    is then a folder and the result an ``O_PATH`` handle of the last.
    """
    nofollow = bool(flags & os.O_NOFOLLOW)  # the caller's: the last link is not followed
    pending = _parts(path)[::-1]  # a stack: the next component last
    cur = os.dup(root_fd)
    depth = 0  # components below the root: ".." at 0 stays at the root
    links = 0
    try:
        while True:
            if not pending:  # the path names a folder ("", "a/..", a link to one)
                return os.open(".", _O_PATH_DIR if mkdir else flags & ~os.O_NOFOLLOW, mode, dir_fd=cur)
            part = pending.pop()
            if part == "..":
                if beneath and not depth:
                    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), path)
                if depth:
                    nxt = os.open("..", _O_PATH_DIR, dir_fd=cur)
                    os.close(cur)
                    cur, depth = nxt, depth - 1
                continue
            if not pending and mkdir is None:
                fd = _open_last(cur, part, flags, mode, nofollow)
                if fd is not None:
                    return fd
            try:
                nxt = os.open(part, _STEP, dir_fd=cur)
            except FileNotFoundError:
                if mkdir is None:
                    raise
                mkdir(cur, part)
                nxt = os.open(part, _STEP, dir_fd=cur)
            kind = stat.S_IFMT(os.fstat(nxt).st_mode)
            if kind == stat.S_IFLNK or not pending and mkdir is None:
                target = os.readlink("", dir_fd=nxt) if kind == stat.S_IFLNK else part  # else: swapped, again
                os.close(nxt)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    if beneath:
                        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), path)
                    os.close(cur)
                    cur, depth = os.dup(root_fd), 0
                pending.extend(_parts(target)[::-1])
                continue
            if kind != stat.S_IFDIR:
                os.close(nxt)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            os.close(cur)
            cur, depth = nxt, depth + 1
    finally:
        os.close(cur)


def _open_last(dir_fd: int, name: str, flags: int, mode: int, nofollow: bool) -> int | None:
    """The last component opened as asked, never through a link; None when it is a link to follow."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:  # O_NOFOLLOW met a link: ELOOP (ENOTDIR with O_DIRECTORY)
        if nofollow or exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not _is_link(dir_fd, name):
            raise
        return None
    if nofollow or not flags & os.O_PATH or not stat.S_ISLNK(os.fstat(fd).st_mode):
        return fd
    os.close(fd)  # O_PATH | O_NOFOLLOW opened the link itself
    return None


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_dir(root_fd: int, relpath: str) -> int:
    """The folder ``relpath`` (links followed in the root), open to list and to change."""
    return open_in(root_fd, relpath, os.O_RDONLY | os.O_DIRECTORY)


def parent_and_name(root_fd: int, relpath: str) -> tuple[int, str]:
    """The folder holding ``relpath`` (an ``O_PATH`` handle, resolved in the root) and the last
    name, not followed: what creating, replacing or removing it acts on. ``EINVAL`` for a path
    naming no entry of a folder (the root itself, or one ending in ``..``)."""
    parts = _parts(relpath)
    if not parts or parts[-1] == "..":
        raise OSError(errno.EINVAL, "names no entry of a folder", relpath)
    return open_in(root_fd, "/".join(parts[:-1]), _O_PATH_DIR), parts[-1]


def mkdirs_in(root_fd: int, relpath: str, uid: int = 0, gid: int = 0, mode: int = 0o755) -> int:
    """The folder ``relpath`` (links followed in the root), with the missing ones made on the way,
    each owned ``uid:gid`` (host ids) with ``mode``, set on its own handle. Returns an ``O_PATH``
    handle of it; ``ENOTDIR`` when something on the way is not a folder."""
    try:
        return open_in(root_fd, relpath, _O_PATH_DIR)
    except FileNotFoundError:
        pass

    def make(dir_fd: int, name: str) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            return  # made meanwhile (or a dangling link): the walk takes what is there
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    return _walk(root_fd, relpath.lstrip("/"), _O_PATH_DIR, 0, mkdir=make)


def resolve(root_fd: int, path: str, *, keep_missing: bool = True, folder: bool = True) -> str:
    """``path`` as the tree's own path: relative to its root, no ``/`` at either end (``""`` for the
    root), every link on it resolved as if the root were ``/`` (the module's property), from
    handles (``O_PATH | O_NOFOLLOW`` per component, ``readlinkat``, ``..`` stopping at the root).
    What names it when the tree holds it: no host path is built, so no ``PATH_MAX`` either.

    ``keep_missing``: what the tree lacks (a WorkingDir the executor makes) is kept as written
    from there on, ``..`` in it applied by name (and back into the tree, resolving again); else
    ``ENOENT``. ``folder``: the last component must be a folder (``ENOTDIR``); else any entry (a
    last link followed like the rest). ``ENOTDIR`` for a file with components after it, ``ELOOP``
    past ``MAX_LINKS`` links."""
    pending = _parts(path)[::-1]
    resolved: list[str] = []
    cur: int | None = os.dup(root_fd)
    have = 0  # how many of ``resolved`` the tree has (``cur`` is the last of them, None past it)
    links = 0
    try:
        while pending:
            part = pending.pop()
            if part == "..":
                if resolved:
                    resolved.pop()
                if len(resolved) < have:  # back up in what the tree has
                    parent = os.open("..", _O_PATH_DIR, dir_fd=cur)
                    os.close(cur)
                    cur, have = parent, have - 1
                elif cur is None and len(resolved) == have:  # back from as-written into the tree
                    cur = _reopen(root_fd, resolved)
                continue
            if cur is None:  # below what the tree has: as written
                resolved.append(part)
                continue
            try:
                nxt = os.open(part, _STEP, dir_fd=cur)
            except FileNotFoundError:
                if not keep_missing:
                    raise
                os.close(cur)
                cur = None
                resolved.append(part)
                continue
            kind = stat.S_IFMT(os.fstat(nxt).st_mode)
            if kind == stat.S_IFLNK:
                target = os.readlink("", dir_fd=nxt)
                os.close(nxt)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    os.close(cur)
                    cur, resolved, have = os.dup(root_fd), [], 0
                pending.extend(_parts(target)[::-1])
                continue
            if kind != stat.S_IFDIR:
                os.close(nxt)
                if pending or folder:
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
                resolved.append(part)
                continue
            os.close(cur)
            cur, have = nxt, have + 1
            resolved.append(part)
        return "/".join(resolved)
    finally:
        if cur is not None:
            os.close(cur)


def host_path(path) -> str:
    """``path``, one of the host's own (a setting, an interpreter, a folder the executor made),
    absolute with every link on it resolved: what ``os.path.realpath`` answers, by ``resolve``'s walk
    from handles with the host's ``/`` as the root, so the project has one resolver and no
    ``realpath``. What is missing is kept as written; a loop is ``OSError`` (``ELOOP``)."""
    root_fd = open_root("/")
    try:
        return "/" + resolve(root_fd, os.path.abspath(path), folder=False)
    finally:
        os.close(root_fd)


def _reopen(root_fd: int, names: list[str]) -> int:
    """The folder ``names`` below ``root_fd``, each a folder already resolved (no link on the way)."""
    cur = os.dup(root_fd)
    for name in names:
        nxt = os.open(name, _STEP | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = nxt
    return cur


def lstat_at(dir_fd: int | None, name: str) -> os.stat_result | None:
    """``name`` in the folder ``dir_fd``, not followed; None when nothing has that name (or there
    is no folder: ``dir_fd`` None, a tree that has nothing at that place)."""
    if dir_fd is None:
        return None
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_in(root_fd: int, relpath: str, max_bytes: int, *, follow_last: bool = True) -> bytes | None:
    """At most ``max_bytes`` of the file ``relpath`` (links followed in the root); None when it is
    missing or not a regular file (a FIFO cannot block: ``O_NONBLOCK``, checked by ``fstat``)."""
    try:
        fd = open_in(root_fd, relpath, os.O_RDONLY | os.O_NONBLOCK, follow_last=follow_last)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], max_bytes
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
