"""Folders to tar and back, on the client's own disk.

``pack_folder`` writes a folder's contents as a tar: names relative to the folder, links kept as
links (never followed), owners reset to root (uid 0), as ``docker cp`` gives them in a container.

``extract_tar`` is the one place where bytes from a sandbox reach this machine's disk. A sandbox is
untrusted, so the function never relies on tarfile's own extraction (its ``data`` filter had escapes
fixed as late as Python 3.12.11 and 3.10.18) and holds these, member by member:

1. a name that is absolute or climbs out (``..``) is refused;
2. nothing is written through a link: every parent folder on disk is checked with ``lstat``, and a
   file is opened with ``O_NOFOLLOW`` (a link already in its place is removed first, as tar does);
3. a symbolic link is kept only if, once every link of the archive is in place, it resolves inside
   the folder (``realpath``, so chains of links count); the others are removed;
4. only files, folders, symbolic links and hard links (written as copies of their data, which comes
   from the archive, not from the disk) are made; devices, FIFOs and the rest are refused;
5. modes keep their permission bits only (no setuid, setgid or sticky), and the owner can always
   read and write what was written.

A refused member is skipped, not fatal: an agent's stray link to ``/usr/bin`` must not lose the rest
of its logs (Harbor's own ``tar_transfer.extract_dir`` chose the same). The refusals are returned.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
from pathlib import Path


def pack_folder(folder: str | os.PathLike, *, compress: bool = False) -> bytes:
    """The contents of ``folder`` as a tar (gzip'd with ``compress``), in a stable order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"not a folder: {folder}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if compress else "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(folder):  # never descends into a linked folder
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                path = Path(dirpath, name)
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False, filter=_as_root)
    return buffer.getvalue()


def _as_root(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    return member


def extract_tar(data: bytes, folder: str | os.PathLike) -> list[str]:
    """Unpack a tar (gzip allowed) into ``folder`` (made if missing) under the rules above.

    Returns one line per refused member, ``"name: why"``; an empty list when all were written.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    refused: list[str] = []
    links: list[Path] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar:
            why = _place(tar, member, root, links)
            if why:
                refused.append(f"{member.name}: {why}")
    while True:  # removing a link can change where another resolves: repeat until none leaves
        leaving = [link for link in links if not _inside(Path(os.path.realpath(link)), root)]
        if not leaving:
            return refused
        for link in leaving:
            link.unlink()
            links.remove(link)
            refused.append(f"{link.relative_to(root).as_posix()}: a link that resolves outside the folder")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _place(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path, links: list[Path]) -> str | None:
    """Write one member under ``root``; the reason it was refused, or None."""
    name = posixpath.normpath(member.name)
    if name.startswith("/"):
        return "an absolute name"
    if name == ".." or name.startswith("../"):
        return "a name leaving the folder"
    if name == ".":
        return None  # the folder itself
    parts = name.split("/")
    parent = root
    for part in parts[:-1]:
        parent = parent / part
        if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
            return f"its parent {parent.relative_to(root).as_posix()} is a link or not a folder"
        parent.mkdir(mode=0o755, exist_ok=True)
    target = parent / parts[-1]
    in_the_way = target.is_symlink() or target.exists()
    if member.isdir():
        if in_the_way and (target.is_symlink() or not target.is_dir()):
            target.unlink()
        target.mkdir(mode=0o755, exist_ok=True)
        target.chmod((member.mode & 0o777) | 0o700)
        return None
    if in_the_way and target.is_dir() and not target.is_symlink():
        return "a folder is in its place"
    if member.issym():
        if member.linkname.startswith("/"):
            return f"a link to an absolute path ({member.linkname})"
        lexical = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
        if lexical == ".." or lexical.startswith("../"):
            return f"a link leaving the folder ({member.linkname})"
        if in_the_way:
            target.unlink()
        os.symlink(member.linkname, target)
        links.append(target)
        return None
    if member.isfile() or member.islnk():
        try:
            source = tar.extractfile(member)  # a hard link reads its target member's data
        except KeyError:
            source = None
        if source is None:
            return f"a hard link to a member the archive does not hold ({member.linkname})"
        if in_the_way:
            target.unlink()
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "wb") as out, source:
            shutil.copyfileobj(source, out)
            os.fchmod(out.fileno(), (member.mode & 0o777) | 0o600)
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
        return None
    return "not a file, folder or link (a device, FIFO or other special file)"
