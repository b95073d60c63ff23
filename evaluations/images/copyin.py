"""What COPY, ADD and WORKDIR write into a build step's root (SPEC §16, §21).

The builder writes as host root into an overlay of layers that someone else made, so:

1. Every path in the root goes through images/inroot.py: a link anywhere on the way is followed
   as if the root were ``/``; the last name is created ``O_EXCL`` and never followed; owners,
   modes and times are set on the handle just made (``fchown``, ``fchmod``, ``futimens``), never
   by a path resolved again later, when a later member or file may have swapped a link.
2. A local tar (ADD) is unpacked member by member through the same resolver, never with
   ``extractall``: a member below a link lands where that link leads inside the root (as
   Docker, which unpacks in a chroot); the tar's links are made as links, content, never
   followed here; a ``..`` member, a device, or ids outside 0..65535 are refused.
3. ``Budget``: each file's size (``st_size``: a sparse file by its size) and each entry are
   counted against the build's ``DISK_QUOTA_MB`` and ``MAX_FILES`` before a byte of it is
   written, from what the build's folders already hold, as RUN's monitor counts them. Over
   either, the instruction fails naming the cap; the step's folder goes with what it wrote.
"""

from __future__ import annotations

import errno
import lzma
import os
import posixpath
import stat
import tarfile
import zlib

from evaluations import safefs
from evaluations.images import inroot
from evaluations.images.errors import ImageError
from evaluations.runtime.types import mib_up

MAX_ID = 65535  # ids an image may use: the evaluation's namespace maps 0..65535
_CHUNK = 1 << 20
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_HELD_FOLDERS = 256  # folder handles kept to set their times last; past it, set at once


class Budget:
    """What one COPY or ADD may still write under the build's disk and file limits."""

    def __init__(self, instruction, config, used: safefs.TreeUsage):
        self.instruction, self.config = instruction, config
        self.bytes, self.files = used.bytes, used.files

    def take(self, what: str, size: int = 0) -> None:
        """Count ``what`` (``size`` bytes, one file) before it is written; ImageError past a cap."""
        self.bytes += size
        self.files += 1
        if self.bytes > self.config.disk_quota_bytes:
            raise self.instruction.error(
                f"{what} ({mib_up(size)} MiB) would take the build past its disk quota "
                f"(DISK_QUOTA_MB={self.config.disk_quota_mb})."
            )
        if self.files > self.config.max_files:
            raise self.instruction.error(
                f"{what} would take the build past its file count limit (MAX_FILES={self.config.max_files})."
            )


def mkdirs(root_fd: int, path: str, uid: int, gid: int, idmap, *, mode: int | None = None) -> int:
    """``path`` (inside the image) as a folder, links on the way followed inside the root: an
    ``O_PATH`` handle of it. Folders made are owned ``uid:gid`` inside, 0755 (``mode`` for the
    last, when made here). ImageError when something on the way is not a folder."""
    host_uid, host_gid = idmap.host_uid(uid), idmap.host_gid(gid)
    parent, name = posixpath.split(posixpath.normpath("/" + path))
    try:
        if mode is None or not name:
            return inroot.mkdirs_in(root_fd, path, host_uid, host_gid, 0o755)
        parent_fd = inroot.mkdirs_in(root_fd, parent, host_uid, host_gid, 0o755)
        try:
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:  # there already (a folder, or a link to follow inside)
                return inroot.mkdirs_in(root_fd, path, host_uid, host_gid, 0o755)
            made = os.open(name, inroot.DIR_FLAGS, dir_fd=parent_fd)
            try:
                os.fchown(made, host_uid, host_gid)
                os.fchmod(made, mode)  # after the chown, which drops setgid
                return os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=made)
            finally:
                os.close(made)
        finally:
            os.close(parent_fd)
    except (NotADirectoryError, FileExistsError):
        raise ImageError(f"a part of {posixpath.normpath('/' + path)} is in the image, and not a folder") from None


def clear(parent_fd: int, name: str, *, folders: bool) -> None:
    """Whatever ``name`` is in the folder, never followed; a folder only when ``folders`` (a tar's
    later member wins), else IsADirectoryError (COPY does not replace a folder with a file)."""
    found = inroot.lstat_at(parent_fd, name)
    if found is None:
        return
    if stat.S_ISDIR(found.st_mode):
        if not folders:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
        safefs.remove_entry_nofollow(parent_fd, name)
    else:
        os.unlink(name, dir_fd=parent_fd)


def write_file(source, size: int, parent_fd: int, name: str, ids: tuple[int, int], mode: int, mtime_ns: int) -> None:
    """``name`` made (``O_EXCL``, never through a link) in the folder with ``size`` bytes read from
    ``source``, at most: what grows while being copied is not counted, so it is not copied."""
    fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent_fd)
    try:
        left = size
        while left > 0 and (chunk := source.read(min(left, _CHUNK))):
            left -= len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.fchown(fd, *ids)
        os.fchmod(fd, mode)  # after the chown, which drops setuid and setgid
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)


def put_file(root_fd: int, path: str, source, size: int, idmap, mode: int, mtime_ns: int) -> None:
    """``path`` (inside the image) written from ``source`` as the image's root's file, as ``docker cp``
    and Harbor's upload leave one: the folders on the way made as root's (0755, ``mkdirs``), whatever
    stood at its name (a folder and all it holds too) replaced. ImageError or SafeFSError when a part
    of the way is not a folder."""
    folder, name = posixpath.split(posixpath.normpath("/" + path))
    parent_fd = mkdirs(root_fd, folder, 0, 0, idmap)
    try:
        clear(parent_fd, name, folders=True)
        write_file(source, size, parent_fd, name, (idmap.host_uid(0), idmap.host_gid(0)), mode, mtime_ns)
    finally:
        os.close(parent_fd)


def write_link(target: str, parent_fd: int, name: str, ids: tuple[int, int], mtime_ns: int | None = None) -> None:
    """A link to ``target`` made as ``name``: its content, never followed here."""
    os.symlink(target, name, dir_fd=parent_fd)
    os.chown(name, *ids, dir_fd=parent_fd, follow_symlinks=False)
    if mtime_ns is not None:
        os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=parent_fd, follow_symlinks=False)


def is_archive(handle) -> bool:
    """What ADD unpacks: a tar, plain or compressed with gzip, bzip2 or xz (Docker's list)."""
    head = handle.read(512)
    handle.seek(0)
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")):
        return True
    return len(head) >= 262 and head[257:262] == b"ustar"


def unpack_tar(instruction, handle, shown: str, root_fd: int, dest: str, idmap, budget: Budget) -> None:
    """ADD of a local tar read from ``handle``: its members under ``dest`` in the root, owners as
    in the tar (through ``idmap``), each through the resolver (the module's point 2)."""
    writer = _TarWriter(instruction, shown, root_fd, dest, idmap, budget)
    try:
        with tarfile.open(fileobj=handle, mode="r|*") as tar:  # one pass, in order
            for member in tar:
                writer.add(tar, member)
        writer.finish()
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise instruction.error(f"the archive {shown} cannot be unpacked: {exc}.") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise instruction.error(f"the archive {shown} cannot be unpacked: {exc.strerror or exc}.") from None
    finally:
        writer.close()


class _TarWriter:
    def __init__(self, instruction, shown: str, root_fd: int, dest: str, idmap, budget: Budget):
        self.instruction, self.shown, self.root_fd, self.dest = instruction, shown, root_fd, dest
        self.idmap, self.budget = idmap, budget
        self.folders: list[tuple[int, int]] = []  # (handle, mtime_ns): times set last, on the handle

    def refuse(self, member: tarfile.TarInfo, why: str) -> ImageError:
        return self.instruction.error(f"the archive {self.shown} {why}: {member.name}.")

    def parts(self, member: tarfile.TarInfo, path: str) -> list[str]:
        parts = [part for part in path.split("/") if part not in ("", ".")]
        if ".." in parts or "\0" in path:
            raise self.refuse(member, "has a member outside its folder")
        return parts

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = self.parts(member, member.name)
        if not parts:
            return  # "./": the destination itself, made already
        if member.isdev():
            raise self.refuse(member, "has a device file")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise self.refuse(member, f"has a member of an unsupported type {member.type!r}")
        if not (0 <= member.uid <= MAX_ID and 0 <= member.gid <= MAX_ID):
            raise self.refuse(member, f"has a member owned by {member.uid}:{member.gid}, outside 0..{MAX_ID}")
        self.budget.take(f"the archive {self.shown}'s {member.name}", member.size if member.isreg() else 0)
        ids = (self.idmap.host_uid(member.uid), self.idmap.host_gid(member.gid))
        mode, mtime_ns = member.mode & 0o7777, int(member.mtime * 10**9)
        parent = mkdirs(self.root_fd, posixpath.join(self.dest, *parts[:-1]), 0, 0, self.idmap)
        name = parts[-1]
        try:
            if member.isdir():
                self.folder(parent, name, ids, mode, mtime_ns)
                return
            clear(parent, name, folders=True)
            if member.isreg():
                write_file(tar.extractfile(member), member.size, parent, name, ids, mode, mtime_ns)
            elif member.issym():
                if not member.linkname:
                    raise self.refuse(member, "has a link with an empty target")
                write_link(member.linkname, parent, name, ids, mtime_ns)
            else:
                self.hard_link(member, parent, name)
        finally:
            os.close(parent)

    def folder(self, parent: int, name: str, ids: tuple[int, int], mode: int, mtime_ns: int) -> None:
        found = inroot.lstat_at(parent, name)
        if found is None or not stat.S_ISDIR(found.st_mode):
            clear(parent, name, folders=True)
            os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, inroot.DIR_FLAGS, dir_fd=parent)
        os.fchown(fd, *ids)
        os.fchmod(fd, mode)
        if len(self.folders) < _HELD_FOLDERS:
            self.folders.append((fd, mtime_ns))  # its later members would change its time
        else:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
            os.close(fd)

    def hard_link(self, member: tarfile.TarInfo, parent: int, name: str) -> None:
        target = posixpath.join(self.dest, *self.parts(member, member.linkname))
        try:
            target_parent, target_name = inroot.parent_and_name(self.root_fd, target)
        except OSError:
            raise self.refuse(member, f"has a hard link to {member.linkname}, which is not a file") from None
        try:
            found = inroot.lstat_at(target_parent, target_name)
            if found is None or not stat.S_ISREG(found.st_mode):
                raise self.refuse(member, f"has a hard link to {member.linkname}, which is not a file")
            os.link(target_name, name, src_dir_fd=target_parent, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(target_parent)

    def finish(self) -> None:
        for fd, mtime_ns in self.folders:
            os.utime(fd, ns=(mtime_ns, mtime_ns))

    def close(self) -> None:
        for fd, _ in self.folders:
            os.close(fd)
        self.folders = []
