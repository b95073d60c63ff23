"""An agent as a request gives it (SPEC §14): its row's fields, the archive stored once, and
the rules of an agent project (one archive, its root, its entry point), checked alike by the
API (serializers, at POST) and the pipeline (installing_agent, when it is extracted to run).

An agent project is a .tar.gz or .zip extracted with the task archives' rules
(pipeline/archive.py: no links, no ``..``, no absolute names, caps on members and bytes).
The entry point is ``agent_entrypoint`` (a relative path), else the first of the language's
DEFAULT_ENTRYPOINTS; looked for at the archive's root, then in its single top-level folder
(when the archive holds nothing else). Where it is found is the project root: its
requirements.txt or package.json is the project's. The API stores the entry point found,
relative to that root; resolved again from it, it finds the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.db import IntegrityError, transaction
from django.utils import timezone

from evaluations.models import AgentArchive
from evaluations.pipeline import archive

DEFAULT_ENTRYPOINTS = {
    "python": ("agent.py", "main.py"),
    "bash": ("agent.sh",),
    "node": ("agent.js", "index.js"),
}
_IGNORED_TOP_LEVEL = {"__MACOSX", ".DS_Store"}


class ProjectError(Exception):
    """An agent archive that cannot run; ``field`` is the request field to blame.

    ``transient``: our disk failed while extracting it, not the archive.
    """

    def __init__(self, field: str, message: str, *, transient: bool = False):
        super().__init__(message)
        self.field = field
        self.transient = transient


@dataclass(frozen=True)
class Project:
    """An extracted agent project: ``root`` its project root, ``entrypoint`` relative to it."""

    root: Path
    entrypoint: str

    @property
    def entry(self) -> Path:
        return self.root / self.entrypoint


def store_archive(data: bytes) -> str:
    """The sha256 of the AgentArchive row of these bytes: one row per content, so a batch's tasks share it.

    An existing row is touched first (``last_used_at``), in its own statement: the reaper's purge
    skips a row used within RETENTION_DAYS, so the row found here is still there when the
    evaluation or batch pointing at it is written.
    """
    digest = hashlib.sha256(data).hexdigest()
    if AgentArchive.objects.filter(sha256=digest).update(last_used_at=timezone.now()):
        return digest
    try:
        with transaction.atomic():
            AgentArchive.objects.create(sha256=digest, data=data, size=len(data))
    except IntegrityError:
        pass  # stored meanwhile by another request: the same bytes
    return digest


def model_fields(validated: dict) -> dict:
    """The agent's fields of an Evaluation or a Batch row, from AgentSourceSerializer's validated_data.

    By attname (``agent_archive_id``): admission inserts rows by column, not through the ORM.
    """
    code = validated.get("agent_code")
    if code is not None:
        return {
            "agent_code": code,
            "agent_archive_id": None,
            "agent_entrypoint": "",
            "agent_sha256": hashlib.sha256(code.encode("utf-8", errors="surrogatepass")).hexdigest(),
        }
    digest = store_archive(validated["agent_archive"])
    return {
        "agent_code": "",
        "agent_archive_id": digest,
        "agent_entrypoint": validated.get("agent_entrypoint", ""),
        "agent_sha256": digest,
    }


def unpack(data: bytes, dest: Path, *, language: str, entrypoint: str, config) -> Project:
    """Extract the archive ``data`` into ``dest`` (created) and find its project root and entry point.

    Raises ProjectError. ``dest``'s parent receives the archive file for as long as it is read.
    """
    archive_file = dest.with_name(dest.name + ".archive")
    with _archive_file(data, archive_file):
        listing = _read(archive.extract_archive, archive_file, dest, config=config)
    return find(dest, listing, language, entrypoint)


def check(data: bytes, *, language: str, entrypoint: str, config) -> str:
    """The entry point (relative to the project root) of a valid archive; raises ProjectError.

    The API's check: the archive's headers are read (archive.list_archive), nothing is extracted;
    the same listing and rules as unpack's, so what passes here extracts there (but for what only
    writing tells: a zip whose declared sizes lie, a full disk).
    """
    with tempfile.TemporaryDirectory(prefix="agent-check-") as scratch:
        archive_file = Path(scratch) / "agent.archive"
        with _archive_file(data, archive_file):
            listing = _read(archive.list_archive, archive_file, config=config)
    return locate(listing, language, entrypoint)[1]


@contextlib.contextmanager
def _archive_file(data: bytes, path: Path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        yield
    finally:
        path.unlink(missing_ok=True)


def _read(read, archive_file: Path, *dest: Path, config) -> archive.Listing:
    try:
        return read(
            archive_file,
            *dest,
            max_members=config.max_archive_members,
            max_bytes=config.max_extracted_bytes,
            subject="agent archive",
        )
    except archive.ArchiveError as exc:
        raise ProjectError("agent_archive", str(exc), transient=exc.transient) from None


def find(dest: Path, tree: archive.Listing | Folder, language: str, entrypoint: str) -> Project:
    """The project in ``dest``, an archive extracted there and read as ``tree``."""
    root, relative = locate(tree, language, entrypoint)
    return Project(dest / root, relative)


class Folder:
    """An extracted project on disk, read as an archive.Listing is: what locate needs of a tree."""

    def __init__(self, path: Path):
        self.path = path

    def is_file(self, relative: str) -> bool:
        return is_file(self.path / relative)

    def top_level(self) -> list[tuple[str, bool]]:
        return sorted(
            (e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(self.path) if e.name not in _IGNORED_TOP_LEVEL
        )


def locate(tree: archive.Listing | Folder, language: str, entrypoint: str) -> tuple[str, str]:
    """(the project root, relative to the archive's root: "" or its single top-level folder; the
    entry point, relative to that root): the entry point is looked for from the archive's root,
    then from its single top-level folder (when the archive holds nothing else)."""
    roots = [""]
    entries = tree.top_level()
    if len(entries) == 1 and entries[0][1]:
        roots.append(entries[0][0])
    if entrypoint:
        relative = _relative(entrypoint)
        for root in roots:
            if tree.is_file(_join(root, relative)):
                return root, relative
        raise ProjectError("agent_entrypoint", f"{relative!r} is not a file of the agent archive")
    defaults = DEFAULT_ENTRYPOINTS.get(language, ())
    for root in roots:
        for name in defaults:
            if tree.is_file(_join(root, name)):
                return root, name
    names = " or ".join(defaults) or "no default"
    raise ProjectError(
        "agent_archive",
        f"has no entry point: no {names} at its root or in its single top-level folder "
        "(name another one with agent_entrypoint)",
    )


def _join(root: str, relative: str) -> str:
    return f"{root}/{relative}" if root else relative


def _relative(entrypoint: str) -> str:
    if "\0" in entrypoint or entrypoint.startswith("/") or "\\" in entrypoint:
        raise ProjectError("agent_entrypoint", "must be a relative path inside the archive, with / between names")
    parts = [p for p in entrypoint.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ProjectError("agent_entrypoint", "must be a relative path inside the archive (no '..')")
    return "/".join(parts)


def is_file(path: Path) -> bool:
    """A regular file, not a link to one."""
    # Members are plain files and folders (the archive rules refuse links), so lstat tells it all.
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
