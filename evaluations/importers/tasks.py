"""`manage.py import_tasks`: Harbor and Terminal-Bench 1.x task folders -> Harbor-layout folders and
archives in OUT (SPEC §17).

1. Each DIR is a task (it holds the format's file: ``task.toml`` for Harbor,
   ``task.yaml`` for Terminal-Bench) or a folder of tasks (its sub-folders
   that do, by name); a sub-folder holding no task is named and passed over.
   A task's name is its folder's.
2. Every task is read by the executor's own reader (``load_task``) first: a
   task it would refuse is refused here with the same sentence, and nothing
   of it is written.
3. A Terminal-Bench task is written in Harbor's layout (harborlayout.py); a
   Harbor task is copied as it is.
4. The folder is written in a scratch folder inside OUT, read back, packed,
   the archive extracted and read back again (what is written is what the
   executor accepts), and only then renamed into place: a task is in OUT
   whole or not at all.
5. ``OUT/index.json`` lists ``{name, format, source_format, source, folder,
   archive, sha256}`` under ``tasks``; entries of earlier imports stay while
   their archive does.
6. ``--report FILE`` (``ImportResult.report``): every folder read, imported or
   not, with the sentence that refused it (or passed it over).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from evaluations.pipeline.archive import ArchiveError, extract_archive, find_task_root
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import TaskError, TaskSpec
from evaluations.worker.localrun import pack_folder
from executor_project.config import Config

from .build import replace_folder
from .harborlayout import CannotConvert, write_harbor_layout
from .index import merge_index

FORMATS = {"harbor": "task.toml", "terminal-bench": "task.yaml"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Imported:
    name: str
    source: str
    source_format: str
    folder: str  # relative to OUT
    archive: str  # relative to OUT
    sha256: str

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "format": "harbor",
            "source_format": self.source_format,
            "source": self.source,
            "folder": self.folder,
            "archive": self.archive,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class Refused:
    source: str
    message: str
    dataset: str = ""


@dataclass
class ImportResult:
    imported: list[Imported] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    passed_over: list[Refused] = field(default_factory=list)  # sub-folders holding no task: named, not refused
    datasets: dict[str, str] = field(default_factory=dict)  # a task's source folder -> its dataset

    def report(self) -> list[dict]:
        """``--report FILE``: every folder read, ``{folder, dataset, imported, reason}``, in the order read."""
        entries = [
            {"folder": task.source, "dataset": self.datasets.get(task.source, ""), "imported": True, "reason": ""}
            for task in self.imported
        ]
        entries += [
            {"folder": bad.source, "dataset": bad.dataset, "imported": False, "reason": bad.message}
            for bad in [*self.refused, *self.passed_over]
        ]
        return sorted(entries, key=lambda entry: (entry["dataset"], entry["folder"]))


def task_format(folder: Path) -> str | None:
    """Which format's file ``folder`` holds (Harbor wins, as load_task reads it), or None."""
    for name, marker in FORMATS.items():
        if (folder / marker).is_file():
            return name
    return None


def find_tasks(dirs: list[Path], source_format: str, report=print, result: ImportResult | None = None) -> list[Path]:
    """The task folders of ``dirs``; a DIR that is a task of the other format, or holds none, is refused
    (in ``result.refused``), a sub-folder holding none passed over (``result.passed_over``). A task's
    dataset is the DIR that held it (the folder of tasks), or, for a DIR that is a task, its parent's name."""
    result = result if result is not None else ImportResult()
    found = []
    marker = FORMATS[source_format]
    for folder in dirs:
        here = task_format(folder)
        dataset = (folder.resolve().parent if here is not None else folder.resolve()).name
        if here == source_format:
            found.append(folder)
            result.datasets[str(folder)] = dataset
            continue
        if here is not None:
            message = f"is a {here} task ({FORMATS[here]}), not a {source_format} one"
            result.refused.append(Refused(str(folder), message, dataset))
            continue
        tasks = []
        for child in sorted(folder.iterdir()):
            if child.name.startswith(".") or not child.is_dir() or child.is_symlink():
                continue
            child_format = task_format(child)
            if child_format == source_format:
                tasks.append(child)
                result.datasets[str(child)] = dataset
                continue
            why = f"it is a {child_format} task, not a {source_format} one" if child_format else f"it holds no {marker}"
            result.passed_over.append(Refused(str(child), f"passed over: {why}", dataset))
            report(f"passed over {child}: {why}")
        if not tasks:
            message = f"holds no {source_format} task ({marker} in it or in a sub-folder)"
            result.refused.append(Refused(str(folder), message, dataset))
        found += tasks
    return found


def import_tasks(dirs: list[Path], out: Path, source_format: str, *, report=print, report_bad=print) -> ImportResult:
    result = ImportResult()
    folders = find_tasks(dirs, source_format, report, result)
    for bad in result.refused:
        report_bad(f"refused {bad.source}: {bad.message}")
    out.mkdir(parents=True, exist_ok=True)
    names: set[str] = set()
    for number, folder in enumerate(folders, 1):
        dataset = result.datasets.get(str(folder), "")
        try:
            name = folder.resolve().name
            if not _NAME.fullmatch(name):
                raise CannotConvert(f"its folder name {name!r} is not a task name (letters, digits, '.', '_', '-')")
            if name in names:
                raise CannotConvert(f"a second task named {name}")
            names.add(name)
            imported = _import_one(folder, name, source_format, out)
        except (TaskError, CannotConvert, ArchiveError) as exc:
            result.refused.append(Refused(str(folder), str(exc), dataset))
            report_bad(f"refused {folder}: {exc}")
            continue
        result.imported.append(imported)
        report(f"[{number}/{len(folders)}] {name}: {imported.archive} (sha256 {imported.sha256[:12]})")
    merge_index(
        out / "index.json",
        [task.as_json() for task in result.imported],
        key="name",
        keep=lambda e: (out / str(e.get("archive", ""))).is_file(),
    )
    return result


def _import_one(source: Path, name: str, source_format: str, out: Path) -> Imported:
    task = load_task(source)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{name}.", suffix=".tmp") as scratch:
        folder = Path(scratch) / name
        if source_format == "terminal-bench":
            write_harbor_layout(task, folder)
        else:
            shutil.copytree(source, folder, symlinks=True)
        written = _read_back(folder, "the converted task")
        archive = Path(scratch) / f"{name}.tar.gz"
        pack_folder(folder, archive)
        _check_archive(archive, Path(scratch) / "extracted", written)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        replace_folder(folder, out / name)
        os.replace(archive, out / f"{name}.tar.gz")
    return Imported(name, str(source), source_format, name, f"{name}.tar.gz", digest)


def _read_back(folder: Path, what: str) -> TaskSpec:
    try:
        task = load_task(folder)
    except TaskError as exc:
        raise CannotConvert(f"{what} would be invalid: {exc}") from None
    if task.format != "harbor":  # a written task.toml is what makes it Harbor's
        raise CannotConvert(f"{what} is not read as a Harbor task")
    return task


def _check_archive(archive: Path, dest: Path, written: TaskSpec) -> None:
    """The archive as the executor takes it: extracted under its default caps, its root found, read
    the same as the folder."""
    extract_archive(archive, dest, max_members=Config.max_archive_members, max_bytes=Config.max_extracted_bytes)
    packed = _read_back(find_task_root(dest), "the archive's task")
    if (packed.prompt, packed.verifier, packed.request, packed.solution) != (
        written.prompt,
        written.verifier,
        written.request,
        written.solution,
    ):
        raise CannotConvert("the archive's task does not read as the folder does")
