"""Host ids the image id ranges must not meet (SPEC §21).

Each uid of the pool owns 65536 host ids from IMAGE_UID_BASE on (``idmap.image_id_base``): files
an image's commands make are owned by them, and its processes run as them. An id another thing
on the host also has would be shared with it: a ``/etc/subuid`` or ``/etc/subgid`` range (another
user's rootless containers), or an account of ``/etc/passwd`` or ``/etc/group`` (its files, its
processes, its signals). ``overlaps`` names each such entry; the start-up check refuses them.

1. Only the files are read (what ``useradd`` and ``newuidmap`` read), so a test hands in copies.
2. A file that does not exist holds nothing; a line that is not ``name:start:count`` (subordinate
   ranges) or has no numeric id is skipped, as shadow-utils skips it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostIdFiles:
    """Where the host keeps its ids; the system's own unless a test says otherwise."""

    subuid: Path = Path("/etc/subuid")
    subgid: Path = Path("/etc/subgid")
    passwd: Path = Path("/etc/passwd")
    group: Path = Path("/etc/group")


SYSTEM = HostIdFiles()


def overlaps(start: int, stop: int, files: HostIdFiles = SYSTEM) -> list[str]:
    """What in ``files`` holds an id in [start, stop), one phrase each, in file order:
    ``/etc/subuid: alice:100000:65536 (100000-165535)`` or ``/etc/passwd: bob (uid 100000007)``."""
    found = []
    for path in (files.subuid, files.subgid):
        for fields in _rows(path):
            if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
                continue
            first, count = int(fields[1]), int(fields[2])
            if count and first < stop and start < first + count:
                found.append(f"{path}: {':'.join(fields)} ({first}-{first + count - 1})")
    for fields in _rows(files.passwd):
        if len(fields) >= 4:
            for kind, value in (("uid", fields[2]), ("gid", fields[3])):
                if value.isdigit() and start <= int(value) < stop:
                    found.append(f"{files.passwd}: {fields[0]} ({kind} {value})")
    for fields in _rows(files.group):
        if len(fields) >= 3 and fields[2].isdigit() and start <= int(fields[2]) < stop:
            found.append(f"{files.group}: {fields[0]} (gid {fields[2]})")
    return found


def _rows(path: Path) -> list[list[str]]:
    """The colon-separated fields of each line of ``path`` but blanks and comments; [] if it is missing."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line.strip().split(":") for line in text.splitlines() if line.strip() and not line.startswith("#")]
