"""Safe extraction of a task archive (.tar.gz, .tar or .zip), and its listing without extraction.

``tarfile``'s ``filter="data"`` alone is not trusted (it has had bypasses),
so extraction works in two passes:

1. Walk the members and refuse anything but plain files and folders, unsafe
   names, too many members (counted while walking, so a huge archive fails
   fast) and a declared total size over the cap.
2. Create each accepted member ourselves under the destination: folders
   with ``mkdir``, files with ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to a
   folder fd walked component by component, counting the bytes actually
   written (a zip whose declared sizes lie stops at the cap).

``list_archive`` is pass 1 alone: the API checks an agent archive with it, writing nothing
but the upload, and the pipeline extracts it at installing_agent.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from evaluations.safefs import SafeFSError, open_root_dir, open_subdir

_CHUNK = 1 << 16
_MAX_TAR_PADDING = 1 << 20  # tar pads to its record size (10 KiB by default)
_IGNORED_TOP_LEVEL = {"__MACOSX", ".DS_Store"}
_SUBJECT = "task archive"  # every ArchiveError sentence starts so; extract_archive's subject replaces it
_NOT_AN_ARCHIVE = "task archive is not a .tar.gz, .tar or .zip file"


class ArchiveError(Exception):
    """The task archive is unreadable or unsafe; the message says why in one sentence.

    ``transient``: the host failed (its disk full), not the archive; another try may succeed.
    """

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class _Entry:
    """A member as listed by the archive, before its name is checked."""

    name: str
    is_dir: bool
    executable: bool
    declared_size: int
    handle: tarfile.TarInfo | zipfile.ZipInfo


@dataclass(frozen=True)
class _Member:
    """A member that passed every check; ``parts`` is its safe relative path."""

    parts: tuple[str, ...]
    is_dir: bool
    executable: bool
    handle: tarfile.TarInfo | zipfile.ZipInfo


@dataclass(frozen=True)
class Listing:
    """What an archive holds, from its headers: files and folders as relative paths joined by "/".

    ``folders`` includes the folders its paths imply. The same for an archive listed
    (list_archive) and extracted (extract_archive), so a check made on the one holds for the other.
    """

    files: frozenset[str]
    folders: frozenset[str]

    def is_file(self, relative: str) -> bool:
        return relative in self.files

    def top_level(self) -> list[tuple[str, bool]]:
        """(name, is a folder) of each entry at the root, but the ignored ones (__MACOSX, .DS_Store)."""
        names = {path.split("/", 1)[0] for path in self.files | self.folders}
        return sorted((name, name in self.folders) for name in names if name not in _IGNORED_TOP_LEVEL)


def extract_archive(
    archive_path: Path | str, dest_dir: Path | str, *, max_members: int, max_bytes: int, subject: str = _SUBJECT
) -> Listing:
    """Extract a task archive into ``dest_dir`` (created if missing); what it held.

    The format is recognised by content, not by name. Raises ``ArchiveError``, whose sentence
    starts with ``subject`` ("agent archive" for an agent project, evaluations/agents.py).
    """
    return _with_subject(subject, _read, archive_path, max_members, max_bytes, dest_dir)


def list_archive(archive_path: Path | str, *, max_members: int, max_bytes: int, subject: str = _SUBJECT) -> Listing:
    """Every check of extract_archive that needs no byte written: the format, each member's type
    and name, the caps on members and declared bytes, names that clash, the end of a tar.

    Only what extraction counts as it writes (a zip whose declared sizes lie, a full disk) is
    left to extract_archive.
    """
    return _with_subject(subject, _read, archive_path, max_members, max_bytes, None)


def _with_subject(subject: str, read, *args) -> Listing:
    try:
        return read(*args)
    except ArchiveError as exc:
        text = str(exc)
        if subject != _SUBJECT and text.startswith(_SUBJECT):
            raise ArchiveError(subject + text[len(_SUBJECT) :], transient=exc.transient) from None
        raise


def _read(archive_path: Path | str, max_members: int, max_bytes: int, dest_dir: Path | str | None) -> Listing:
    """Pass 1 (and, given ``dest_dir``, pass 2) over the archive."""
    kind = _sniff(archive_path)
    if dest_dir is not None:
        os.makedirs(dest_dir, exist_ok=True)
    try:
        if kind == "zip":
            _check_zip_entry_count(archive_path, max_members)
            with zipfile.ZipFile(archive_path) as zf:
                members = _checked(_zip_members(zf), max_members, max_bytes)
                listing = _listing(members)
                if dest_dir is not None:
                    _extract(members, dest_dir, max_bytes, lambda m: zf.open(m.handle))
        else:
            with _open_tar(archive_path, "r:gz" if kind == "tar.gz" else "r:") as tf:
                members = _checked(_tar_members(tf), max_members, max_bytes)
                _check_tar_end(tf)
                listing = _listing(members)
                if dest_dir is not None:
                    _extract(members, dest_dir, max_bytes, lambda m: tf.extractfile(m.handle))
        return listing
    except ArchiveError:
        raise
    except SafeFSError as exc:
        raise ArchiveError(f"task archive cannot be extracted: {exc}") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # our disk, not the archive
            raise ArchiveError(f"task archive cannot be extracted ({_describe(exc)})", transient=True) from None
        raise ArchiveError(f"task archive is corrupt ({_describe(exc)})") from None
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, ValueError) as exc:
        raise ArchiveError(f"task archive is corrupt ({_describe(exc)})") from None
    except NotImplementedError as exc:  # zip compression method we cannot read
        raise ArchiveError(f"task archive uses an unsupported feature ({exc})") from None
    except RecursionError:
        raise ArchiveError("task archive is corrupt (headers nested too deeply)") from None


# The file that makes a folder a task root: ours (SPEC §4), Harbor's, Terminal-Bench 1.x's (SPEC §17).
TASK_FILES = ("workspace.yaml", "task.toml", "task.yaml")


def is_task_root(folder: Path | str) -> bool:
    """``folder`` holds one of TASK_FILES as a regular file."""
    return any(_is_regular(Path(folder) / name) for name in TASK_FILES)


def find_task_root(dest_dir: Path | str) -> Path:
    """The archive root if it holds a task file (TASK_FILES), else its single top-level folder."""
    root = Path(dest_dir)
    if is_task_root(root):
        return root
    entries = [e for e in os.scandir(root) if e.name not in _IGNORED_TOP_LEVEL]
    if len(entries) == 1 and entries[0].is_dir(follow_symlinks=False):
        top = root / entries[0].name
        if is_task_root(top):
            return top
    raise ArchiveError(
        "task archive has no workspace.yaml, task.toml (Harbor) or task.yaml (Terminal-Bench) "
        "at its root or in its single top-level folder"
    )


# -- recognising the format -------------------------------------------------


def _sniff(archive_path: Path | str) -> str:
    try:
        with open(archive_path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        raise ArchiveError(f"task archive cannot be read ({_describe(exc)})") from None
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if len(head) == 512 and _is_tar_header(head):
        return "tar"
    raise ArchiveError(_NOT_AN_ARCHIVE)


def _is_tar_header(block: bytes) -> bool:
    """A ustar magic, or a header block whose checksum is right (old v7 tar)."""
    if block[257:262] == b"ustar":
        return True
    try:
        stored = int(block[148:156].replace(b"\0", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
    return stored == computed and any(block)


def _open_tar(archive_path: Path | str, mode: str) -> tarfile.TarFile:
    try:
        return tarfile.open(archive_path, mode)
    except tarfile.ReadError:  # e.g. a gzip file that holds no tar
        raise ArchiveError(_NOT_AN_ARCHIVE) from None


# -- pass 1: walking and checking members -----------------------------------


def _tar_members(tf: tarfile.TarFile) -> Iterator[_Entry]:
    """Yield entries one header at a time, so checks run before the next seek."""
    while True:
        info = tf.next()
        if info is None:
            return
        if info.isdir():
            yield _Entry(info.name, True, False, 0, info)
        elif info.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
            yield _Entry(info.name, False, bool(info.mode & 0o111), info.size, info)
        else:
            raise ArchiveError(f"task archive member {info.name!r} is {_tar_kind(info)}")


def _tar_kind(info: tarfile.TarInfo) -> str:
    if info.issym():
        return f"a symbolic link (to {info.linkname!r}); links are not allowed"
    if info.islnk():
        return f"a hard link (to {info.linkname!r}); links are not allowed"
    if info.ischr() or info.isblk():
        return "a device; only files and folders are allowed"
    if info.isfifo():
        return "a FIFO; only files and folders are allowed"
    if info.issparse():
        return "a sparse file; only plain files and folders are allowed"
    return f"of unsupported type {info.type!r}; only files and folders are allowed"


def _check_tar_end(tf: tarfile.TarFile) -> None:
    """Only zero padding may follow the last member, then the end of the file.

    tarfile ends its listing quietly at the first bad header after the first
    one, so a damaged archive would otherwise extract in part without a word.
    Reading to the end also makes gzip verify its checksum. The padding is
    bounded, so a stream of compressed zeros after the end cannot stall us.
    """
    fileobj = tf.fileobj
    fileobj.seek(tf.offset)
    left = _MAX_TAR_PADDING
    while chunk := fileobj.read(min(_CHUNK, left + 1)):
        if chunk.strip(b"\0"):
            raise ArchiveError("task archive is corrupt (unreadable data where a member header should be)")
        left -= len(chunk)
        if left < 0:
            raise ArchiveError("task archive is corrupt (too much padding after the last member)")


def _zip_members(zf: zipfile.ZipFile) -> Iterator[_Entry]:
    for info in zf.infolist():
        name = info.orig_filename  # ZipInfo.filename is cut at a NUL byte
        if info.flag_bits & 0x1:
            raise ArchiveError(f"task archive member {name!r} is encrypted")
        unix_mode = info.external_attr >> 16
        fmt = stat.S_IFMT(unix_mode)
        if name.endswith("/") or (fmt == stat.S_IFDIR):
            yield _Entry(name, True, False, 0, info)
        elif fmt in (0, stat.S_IFREG):
            yield _Entry(name, False, bool(unix_mode & 0o111), info.file_size, info)
        elif fmt == stat.S_IFLNK:
            raise ArchiveError(f"task archive member {name!r} is a symbolic link; links are not allowed")
        else:
            raise ArchiveError(
                f"task archive member {name!r} is a device, FIFO or socket; only files and folders are allowed"
            )


def _check_zip_entry_count(archive_path: Path | str, max_members: int) -> None:
    """Read the entry count from the end record before zipfile parses every entry."""
    with open(archive_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (22 + 65535)))
        tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return  # zipfile will report the damage
    total = struct.unpack("<H", tail[at + 10 : at + 12])[0]
    if total != 0xFFFF and total > max_members:
        raise ArchiveError(f"task archive has more than {max_members} members ({total})")


def _checked(entries: Iterator[_Entry], max_members: int, max_bytes: int) -> list[_Member]:
    members: list[_Member] = []
    count = 0
    declared = 0
    for entry in entries:
        count += 1
        if count > max_members:
            raise ArchiveError(f"task archive has more than {max_members} members")
        parts = _safe_parts(entry.name)
        declared += entry.declared_size
        if declared > max_bytes:
            raise ArchiveError(
                f"task archive would extract to more than {max_bytes} bytes (declared sizes, at member {entry.name!r})"
            )
        if parts:  # "." or "./" names the root itself
            members.append(_Member(parts, entry.is_dir, entry.executable, entry.handle))
    return members


def _safe_parts(name: str) -> tuple[str, ...]:
    if "\0" in name or "\n" in name or "\r" in name:
        raise ArchiveError(f"task archive member {name!r} has a NUL or newline in its name")
    if name.startswith("/"):
        raise ArchiveError(f"task archive member {name!r} has an absolute name")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ArchiveError(f"task archive member {name!r} has a '..' component")
    return parts


def _listing(members: list[_Member]) -> Listing:
    """The files and folders; a name given twice to a file, or to a file and a folder, is refused."""
    files: set[str] = set()
    folders: set[str] = set()
    for member in members:
        path = "/".join(member.parts)
        parents = ["/".join(member.parts[:i]) for i in range(1, len(member.parts))]
        if path in files or any(parent in files for parent in parents) or (not member.is_dir and path in folders):
            raise ArchiveError(f"task archive member {path!r} appears twice or clashes with a folder")
        folders.update(parents)
        (folders if member.is_dir else files).add(path)
    return Listing(frozenset(files), frozenset(folders))


# -- pass 2: creating files and folders -------------------------------------


def _extract(members: list[_Member], dest_dir, max_bytes: int, open_member) -> None:
    root_fd = open_root_dir(dest_dir)
    written = 0
    try:
        for member in members:
            shown = "/".join(member.parts)
            if member.is_dir:
                fd = open_subdir(root_fd, list(member.parts), create=True, shown=shown)
                os.fchmod(fd, 0o755)
                os.close(fd)
                continue
            dir_fd = open_subdir(root_fd, list(member.parts[:-1]), create=True, shown=shown)
            try:
                try:
                    out = os.open(
                        member.parts[-1],
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o600,
                        dir_fd=dir_fd,
                    )
                except FileExistsError:
                    raise ArchiveError(
                        f"task archive member {shown!r} appears twice or clashes with a folder"
                    ) from None
            finally:
                os.close(dir_fd)
            try:
                source = open_member(member)
                with source:
                    written = _copy(source, out, written, max_bytes, shown)
                os.fchmod(out, 0o755 if member.executable else 0o644)
            finally:
                os.close(out)
    finally:
        os.close(root_fd)


def _copy(source: BinaryIO, out: int, written: int, max_bytes: int, shown: str) -> int:
    while True:
        chunk = source.read(_CHUNK)
        if not chunk:
            return written
        written += len(chunk)
        if written > max_bytes:
            raise ArchiveError(f"task archive extracts to more than {max_bytes} bytes (at member {shown!r})")
        view = memoryview(chunk)
        while view:
            view = view[os.write(out, view) :]


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]
