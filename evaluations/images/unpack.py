"""One layer's tar stream into a layer tree in overlayfs format, refusing what could escape it.

The stream is read once, in order (``tarfile`` stream mode): the compressed bytes, the
decompressed bytes and the files are checked as they go by, nothing is staged in between.

1. The uncompressed tar's sha256 is the layer's diff_id; the config names it, and a layer that
   hashes to anything else is refused (it is not the layer the image describes).
2. Nothing in a member can reach outside the tree: every parent component is opened with
   ``O_NOFOLLOW`` relative to the tree's root (a member below a symlink is refused), absolute
   paths and ``..`` are refused, a hard link must name a file this layer already made, a
   relative symlink must not climb above the root (absolute ones are the image's own business:
   they resolve inside the evaluation's root).
3. Device nodes are refused: an image gets ``/dev`` from the sandbox, never from a layer. The
   one exception is the overlay whiteout (char 0/0), made here from an OCI ``.wh.NAME`` entry;
   ``.wh..wh..opq`` marks its folder opaque (``trusted.overlay.opaque=y``).
4. Owners are the image's own (0..65535: the evaluation's user namespace maps that range),
   modes as written; set after the data, so a chown never clears a setuid bit we set.
5. ``ImageCaps`` (IMAGE_MAX_UNPACKED_BYTES, IMAGE_MAX_FILES) count the whole image, layer after
   layer, and are checked *before* a file is made or a byte written: a member's size is its
   header's (a sparse or zero-filled file counts by its size, not by the blocks it would use).
   Layers unpacked at the same time (images/pull.py) share them under a lock.

Two threads share the work (bench/RESULTS.md, issue 38: after the kernel making inodes, the time
goes to tar parsing, then to gzip and sha256):

6. The caller's thread reads the stream (a pull's: the network), decompresses and hashes it, and
   hands it on in chunks (images/pipe.py); its errors (a broken gzip, a download cut
   short) reach the other thread where the stream has them.
7. One thread reads the tar and makes every member, in the stream's order. Threads making files
   beside it were measured and cost more (handing over, the GIL) than they saved.

No thread outlives ``unpack_layer``: every one is joined before it returns or raises.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import stat
import tarfile
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

import zstandard

from evaluations import safefs
from evaluations.images.errors import ImageError
from evaluations.images.pipe import Pipe

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
MAX_ID = 65535  # uids and gids an image may use: the evaluation's namespace maps 0..65535
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_XATTRS_KEPT = ("user.", "security.capability")  # never trusted.*: overlay reads its own there
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_STREAM_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError)


class DigestReader:
    """A file-like ``read`` over ``source`` that hashes (and counts) what goes through it."""

    def __init__(self, source, *, limit: int | None = None, what: str = "the stream"):
        self.source = source
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self.limit = limit
        self.what = what

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size if size and size > 0 else _CHUNK)
        self.sha256.update(data)
        self.bytes += len(data)
        if self.limit is not None and self.bytes > self.limit:
            raise ImageError(f"{self.what} is larger than its declared size of {self.limit} bytes.")
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha256.hexdigest()


class _Prefixed:
    """``prefix`` then the rest of ``source``: the magic bytes read to choose a decompressor."""

    def __init__(self, prefix: bytes, source):
        self.prefix, self.source = prefix, source

    def read(self, size: int = -1) -> bytes:
        if self.prefix:
            cut = len(self.prefix) if size is None or size < 0 else size
            data, self.prefix = self.prefix[:cut], self.prefix[cut:]
            return data
        return self.source.read(size)


class ImageCaps:
    """What one image may unpack to, all its layers together: IMAGE_MAX_UNPACKED_BYTES and
    IMAGE_MAX_FILES. ``reserve`` before anything lands; layers unpacked at once share one."""

    def __init__(self, max_bytes: int, max_files: int):
        self.max_bytes, self.max_files = max_bytes, max_files
        self.bytes = self.files = 0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, config) -> ImageCaps:
        return cls(config.image_max_unpacked_bytes, config.image_max_files)

    def reserve(self, layer: str, files: int, size: int, what: str = "") -> None:
        """Count ``files`` more files of ``size`` bytes; ImageError naming ``layer`` and the cap (and
        nothing counted) if they do not fit."""
        with self._lock:
            if self.bytes + size > self.max_bytes:
                raise ImageError(
                    f"Layer {layer} is refused: {what or 'it'} would take the image past IMAGE_MAX_UNPACKED_BYTES "
                    f"({self.max_bytes} bytes unpacked)."
                )
            if self.files + files > self.max_files:
                raise ImageError(
                    f"Layer {layer} is refused: {what or 'it'} would take the image past IMAGE_MAX_FILES "
                    f"({self.max_files} files)."
                )
            self.files += files
            self.bytes += size

    def count_stored(self, layer: str, meta: dict) -> None:
        """A layer the store holds already (its meta's counts) counts against the image's caps too."""
        self.reserve(layer, int(meta.get("files", 0)), int(meta.get("size_bytes", 0)))


@dataclass(frozen=True)
class LayerCounts:
    files: int
    size_bytes: int
    diff_id: str

    def as_meta(self) -> dict:
        return {"files": self.files, "size_bytes": self.size_bytes}


def decompressed(stream):
    """``stream`` (gzip, zstd or a plain tar, told by its first bytes) as an uncompressed stream."""
    head = b""
    while len(head) < 4:
        more = stream.read(4 - len(head))
        if not more:
            break
        head += more
    source = _Prefixed(head, stream)
    if head.startswith(_GZIP_MAGIC):
        return gzip.GzipFile(fileobj=source, mode="rb")
    if head.startswith(_ZSTD_MAGIC):
        return zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True)
    return source


def unpack_layer(stream, tree: Path, *, layer: str, diff_id: str | None, caps: ImageCaps | None = None) -> LayerCounts:
    """Unpack the layer blob read from ``stream`` into the empty folder ``tree``.

    ``layer`` names it in messages (its blob digest); ``diff_id`` (sha256:...) is the config's, or
    None when nothing tells it yet (an import computes it); ``caps``: the image's, counting this
    layer on top of the others. ImageError for a hostile or broken layer or one over a cap; OSError
    (ENOSPC) passes on for the store to report. ``stream`` is read in the caller's thread only.
    """
    uncompressed = DigestReader(None, what=f"Layer {layer}")
    root_fd = safefs.open_root_dir(tree)
    try:
        writer = _LayerWriter(root_fd, layer, caps or ImageCaps(float("inf"), float("inf")))
        pipe = Pipe()
        reader = threading.Thread(target=writer.read_tar, args=(pipe,), name=f"unpack-{layer[7:19]}", daemon=True)
        reader.start()
        try:
            uncompressed.source = decompressed(stream)
            while pipe.put(data := uncompressed.read(_CHUNK)) and data:
                pass
        except BaseException as exc:  # the tar's thread meets it where the stream has it
            pipe.put(exc)
        finally:
            reader.join()
        if writer.error is not None:
            raise writer.error
    finally:
        os.close(root_fd)
    if diff_id is not None and uncompressed.digest != diff_id:
        raise ImageError(
            f"Layer {layer} unpacks to content with digest {uncompressed.digest}, not the diff_id {diff_id} "
            "its image config names."
        )
    return LayerCounts(writer.files, writer.size_bytes, uncompressed.digest)


class _LayerWriter:
    """Makes each member below the open root ``root_fd``; see the module's rules. ``read_tar`` runs
    in the tar's thread; ``error`` is what ended it, if anything did."""

    def __init__(self, root_fd: int, layer: str, caps: ImageCaps):
        self.root_fd = root_fd
        self.layer = layer
        self.caps = caps
        self.files = 0
        self.size_bytes = 0
        self.regular: set[tuple[str, ...]] = set()  # files made here: the only hard link targets
        self.error: BaseException | None = None

    def read_tar(self, pipe: Pipe) -> None:
        try:
            try:
                with tarfile.open(fileobj=pipe, mode="r|", errorlevel=2) as archive:
                    for member in archive:
                        self.add(archive, member)
                while pipe.read(_CHUNK):  # the end-of-archive blocks and padding: the diff_id hashes them
                    pass
            except _STREAM_ERRORS as exc:
                raise ImageError(f"Layer {self.layer} is not a valid (compressed) tar stream ({exc}).") from None
        except BaseException as exc:  # noqa: BLE001 - handed to unpack_layer's thread
            self.error = exc
            pipe.abandon()

    def refuse(self, member: tarfile.TarInfo, why: str) -> ImageError:
        return ImageError(f"Layer {self.layer} is refused: member {member.name!r} {why}.")

    def room(self, member: tarfile.TarInfo, size: int = 0) -> None:
        """Before one more file (of ``size`` bytes) lands: counted, if the image's caps still hold it."""
        self.caps.reserve(self.layer, 1, size, f"member {member.name!r}")
        self.files += 1
        self.size_bytes += size

    def add(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = self.parts(member, member.name, "path")
        if not parts:
            return  # "./": the root itself, which the overlay's upper dir decides
        if member.ischr() or member.isblk():
            raise self.refuse(member, "is a device node")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.isfifo()):
            raise self.refuse(member, f"has an unsupported type {member.type!r}")
        if member.uid > MAX_ID or member.gid > MAX_ID or member.uid < 0 or member.gid < 0:
            raise self.refuse(member, f"is owned by {member.uid}:{member.gid}, outside 0..{MAX_ID}")
        parent_fd = self.open_parent(member, parts)
        try:
            self.make(archive, member, parts, parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise self.refuse(member, f"cannot be unpacked ({exc.strerror or exc})") from None
        finally:
            os.close(parent_fd)

    def parts(self, member: tarfile.TarInfo, path: str, what: str) -> list[str]:
        if path.startswith("/"):
            raise self.refuse(member, f"has an absolute {what}")
        if "\0" in path:
            raise self.refuse(member, f"has a NUL byte in its {what}")
        parts = [part for part in path.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise self.refuse(member, f"has a '..' component in its {what}")
        return parts

    def open_parent(self, member: tarfile.TarInfo, parts: list[str], *, create: bool = True) -> int:
        """The folder holding ``parts``, walked from the root without following any link."""
        fd = os.dup(self.root_fd)
        try:
            for depth, part in enumerate(parts[:-1], start=1):
                try:
                    try:
                        child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except FileNotFoundError:  # (a dangling link is ELOOP: refused below)
                        if not create:
                            raise
                        self.room(member)
                        os.mkdir(part, 0o755, dir_fd=fd)
                        child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    where = "/".join(parts[:depth])
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, part):
                        raise self.refuse(member, f"lies below {where}, which is a symbolic link") from None
                    if exc.errno == errno.ENOTDIR:
                        raise self.refuse(member, f"lies below {where}, which is not a folder") from None
                    if exc.errno == errno.ENOENT:
                        raise self.refuse(member, f"names {where}, which this layer does not have") from None
                    raise
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def make(self, archive: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str], parent_fd: int) -> None:
        name = parts[-1]
        if name == OPAQUE:
            os.setxattr(parent_fd, "trusted.overlay.opaque", b"y")
            return
        if name.startswith(WHITEOUT + WHITEOUT):
            return  # other AUFS metadata (.wh..wh.plnk): nothing for overlayfs
        if name.startswith(WHITEOUT):
            hidden = name[len(WHITEOUT) :]
            if hidden in ("", ".", ".."):
                raise self.refuse(member, "is a whiteout naming no file")
            self.clear(parent_fd, [*parts[:-1], hidden])
            self.room(member)
            os.mknod(hidden, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=parent_fd)
            return
        mode = member.mode & 0o7777
        if member.isdir():
            existing = _lstat(parent_fd, name)
            if existing is None or not stat.S_ISDIR(existing.st_mode):
                self.clear(parent_fd, parts)
                self.room(member)
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
            try:
                self.finish(fd, member, mode)
            finally:
                os.close(fd)
            return
        self.clear(parent_fd, parts)
        self.room(member, member.size if member.isreg() else 0)
        if member.isreg():
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent_fd
            )
            try:
                source = archive.extractfile(member)
                while chunk := source.read(_CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                self.finish(fd, member, mode)
            finally:
                os.close(fd)
            self.regular.add(tuple(parts))
        elif member.isfifo():
            os.mkfifo(name, 0o600, dir_fd=parent_fd)
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
            try:
                self.finish(fd, member, mode)
            finally:
                os.close(fd)
        elif member.issym():
            self.check_symlink(member, parts)
            os.symlink(member.linkname, name, dir_fd=parent_fd)
            os.chown(name, member.uid, member.gid, dir_fd=parent_fd, follow_symlinks=False)
        else:  # hard link
            target = tuple(self.parts(member, member.linkname, "hard link target"))
            if target not in self.regular:
                raise self.refuse(member, f"is a hard link to {member.linkname!r}, which is not a file of this layer")
            target_fd = self.open_parent(member, list(target), create=False)
            try:
                os.link(target[-1], name, src_dir_fd=target_fd, dst_dir_fd=parent_fd, follow_symlinks=False)
            finally:
                os.close(target_fd)
            self.regular.add(tuple(parts))
        os.utime(name, ns=(int(member.mtime * 10**9),) * 2, dir_fd=parent_fd, follow_symlinks=False)

    def check_symlink(self, member: tarfile.TarInfo, parts: list[str]) -> None:
        target = member.linkname
        if not target or "\0" in target:
            raise self.refuse(member, "is a symbolic link with an empty or invalid target")
        if target.startswith("/"):
            return  # resolved inside the evaluation's root, never here
        depth = len(parts) - 1
        for part in target.split("/"):
            if part == "..":
                depth -= 1
                if depth < 0:
                    raise self.refuse(member, f"is a symbolic link to {target!r}, which climbs above the root")
            elif part not in ("", "."):
                depth += 1

    def finish(self, fd: int, member: tarfile.TarInfo, mode: int) -> None:
        """Owner, then mode (a chown clears setuid bits), then the xattrs the tar carries."""
        os.fchown(fd, member.uid, member.gid)
        os.fchmod(fd, mode)
        for key, value in member.pax_headers.items():
            if key.startswith("SCHILY.xattr."):
                xattr = key[len("SCHILY.xattr.") :]
                if xattr.startswith(_XATTRS_KEPT):
                    os.setxattr(fd, xattr, value.encode("utf-8", "surrogateescape"))

    def clear(self, parent_fd: int, parts: list[str]) -> None:
        """Whatever an earlier member of this layer put at ``parts`` (a later member wins)."""
        if _lstat(parent_fd, parts[-1]) is not None:
            safefs.remove_entry_nofollow(parent_fd, parts[-1])
            size = len(parts)
            self.regular = {path for path in self.regular if list(path[:size]) != parts}


def _is_link(dir_fd: int, name: str) -> bool:
    found = _lstat(dir_fd, name)
    return found is not None and stat.S_ISLNK(found.st_mode)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
