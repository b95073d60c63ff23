"""Build real task archives for tests.

``write_archive(path, files, fmt)`` makes a .tar.gz, .tar or .zip from a dict
of relative names to contents (``bytes`` or ``str``; a name ending in ``/``
is a folder). ``Exec(content)`` marks a file executable. ``minimal_task()``
is a dict of the files a valid task needs, to extend per test.

For hostile archives (links, devices, lying sizes) build the members by
hand with ``tar_member`` / ``write_tar`` or ``zip_member`` / ``write_zip``.
"""

from __future__ import annotations

import io
import stat
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

FORMATS = ("tar.gz", "tar", "zip")


@dataclass(frozen=True)
class Exec:
    """File contents marked executable (mode 0o755)."""

    content: bytes | str


def _bytes(content: bytes | str | Exec) -> bytes:
    if isinstance(content, Exec):
        content = content.content
    return content.encode() if isinstance(content, str) else content


def minimal_task(
    extra: dict[str, bytes | str | Exec] | None = None,
    *,
    repo: str = "https://example.com/repo.git",
    base_commit: str = "0123abcd",
    prompt: str = "Fix the bug.\n",
    extra_yaml: str = "",
) -> dict[str, bytes | str | Exec]:
    """The files of a valid task (one test script), updated with ``extra``."""
    task: dict[str, bytes | str | Exec] = {
        "workspace.yaml": f"repo: {repo}\nbase_commit: '{base_commit}'\n{extra_yaml}",
        "prompt.md": prompt,
        "tests/fail_to_pass_1.sh": Exec("#!/bin/bash\ntrue\n"),
    }
    task.update(extra or {})
    return task


def write_archive(
    path: Path,
    files: dict[str, bytes | str | Exec],
    fmt: str = "tar.gz",
    *,
    top: str | None = None,
) -> Path:
    """Write ``files`` as an archive of format ``fmt``; ``top`` puts them under one folder."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt}")
    items = [((f"{top}/{name}" if top else name), content) for name, content in files.items()]
    if fmt == "zip":
        entries = []
        if top:
            entries.append((zip_member(f"{top}/", is_dir=True), b""))
        for name, content in items:
            if name.endswith("/"):
                entries.append((zip_member(name, is_dir=True), b""))
            else:
                mode = 0o755 if isinstance(content, Exec) else 0o644
                entries.append((zip_member(name, mode=mode), _bytes(content)))
        return write_zip(path, entries)
    members = []
    if top:
        members.append((tar_member(top, tarfile.DIRTYPE), None))
    for name, content in items:
        if name.endswith("/"):
            members.append((tar_member(name.rstrip("/"), tarfile.DIRTYPE), None))
        else:
            mode = 0o755 if isinstance(content, Exec) else 0o644
            members.append((tar_member(name, mode=mode), _bytes(content)))
    return write_tar(path, members, gzip=(fmt == "tar.gz"))


def tar_member(
    name: str,
    type_: bytes = tarfile.REGTYPE,
    *,
    mode: int | None = None,
    linkname: str = "",
    size: int | None = None,
) -> tarfile.TarInfo:
    """A TarInfo of any type (REGTYPE, DIRTYPE, SYMTYPE, LNKTYPE, CHRTYPE, FIFOTYPE...)."""
    info = tarfile.TarInfo(name)
    info.type = type_
    info.mode = mode if mode is not None else (0o755 if type_ == tarfile.DIRTYPE else 0o644)
    info.linkname = linkname
    info.mtime = 1_700_000_000
    if size is not None:
        info.size = size
    if type_ in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info


def write_tar(
    path: Path,
    members: list[tuple[tarfile.TarInfo, bytes | None]],
    *,
    gzip: bool = True,
    fmt: int = tarfile.PAX_FORMAT,
) -> Path:
    """Write members as given (data ``None`` for non-files); sizes set from the data."""
    with tarfile.open(path, "w:gz" if gzip else "w", format=fmt) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return path


def zip_member(name: str, *, mode: int = 0o644, is_dir: bool = False, file_type: int | None = None) -> zipfile.ZipInfo:
    """A ZipInfo carrying a Unix mode; ``file_type`` (e.g. ``stat.S_IFLNK``) overrides the type."""
    info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
    kind = file_type if file_type is not None else (stat.S_IFDIR if is_dir else stat.S_IFREG)
    info.external_attr = (kind | mode) << 16
    info.create_system = 3  # Unix
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def write_zip(path: Path, entries: list[tuple[zipfile.ZipInfo, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return path


def write_lying_zip_bomb(path: Path, *, real_size: int, declared_size: int, name: str = "bomb.bin") -> Path:
    """A deflated zip of ``real_size`` zero bytes whose headers declare ``declared_size``."""
    write_zip(path, [(zip_member(name), b"\0" * real_size)])
    raw = bytearray(path.read_bytes())
    fake = declared_size.to_bytes(4, "little")
    local = raw.find(b"PK\x03\x04")
    raw[local + 22 : local + 26] = fake  # local header: uncompressed size
    central = raw.find(b"PK\x01\x02")
    raw[central + 24 : central + 28] = fake  # central directory: uncompressed size
    path.write_bytes(bytes(raw))
    return path


def archive_bytes(files: dict[str, bytes | str | Exec], fmt: str = "tar.gz", *, top: str | None = None) -> bytes:
    """``write_archive``'s bytes, e.g. an agent project for ``agent_archive`` (base64 of these)."""
    with tempfile.TemporaryDirectory() as scratch:
        return write_archive(Path(scratch) / f"archive.{fmt}", files, fmt, top=top).read_bytes()
