"""`manage.py import_swebench`: rows in, task folders and archives out, optionally verified (SPEC §15).

1. Every row is read and checked first (rows.py); rows are then built in
   file order (build.py), cloning each repository once. A bad row is
   reported by its id and skipped; nothing of it is written.
2. ``DIR/index.json`` lists the tasks: ``instance_id``, ``folder``,
   ``archive`` (both relative to DIR), ``sha256`` of the archive, ``repo``
   (the clone URL), and with --verify ``verified`` and ``reason``. An
   import into a DIR that holds earlier tasks keeps their entries (an
   ``--only`` re-import updates just its own); the file is replaced whole.
3. --verify (verify.py) writes ``DIR/verification.json`` the same way: per
   task, ``verified``, ``reason`` and each run's outcome.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import build, recipes, verify
from .index import merge_index
from .rows import BadRow, Instance, parse_instance, read_rows


@dataclass
class ImportResult:
    built: list[build.Built] = field(default_factory=list)
    skipped: list[BadRow] = field(default_factory=list)
    verifications: list[verify.Verification] = field(default_factory=list)

    @property
    def unverified(self) -> list[verify.Verification]:
        return [v for v in self.verifications if not v.verified]

    @property
    def no_environment(self) -> list[BadRow]:
        """The rows skipped for want of an environment for their Python version (--environment-for)."""
        return [bad for bad in self.skipped if isinstance(bad, recipes.NoEnvironment)]


def import_file(
    path: Path,
    out: Path,
    options: build.Options,
    *,
    only: set[str] | None = None,
    verify_jobs: int | None = None,  # None: no verification
    report=print,  # progress lines
    report_bad=print,  # one line per skipped row
) -> ImportResult:
    """Import the rows of ``path`` into ``out``; raises ValueError when FILE cannot be read at all."""
    result = ImportResult()
    instances: list[Instance] = []
    seen: set[str] = set()
    notes: set[str] = set()  # each said once
    rows = read_rows(path)
    for label, row in rows:
        try:
            instance = parse_instance(label, row)
            if only and instance.instance_id not in only:
                continue
            if instance.instance_id in seen:
                raise BadRow(instance.instance_id, f"a second row with instance_id {instance.instance_id}")
            seen.add(instance.instance_id)
            recipe = recipes.recipe_for(instance, options)
            recipes.environment_for(instance, recipe, options)  # NoEnvironment: skipped before any clone
            if recipe.note and recipe.note not in notes:
                notes.add(recipe.note)
                report(f"note: {recipe.note}")
            instances.append(instance)
        except BadRow as bad:
            if only and _id_of(row) not in only:
                continue
            result.skipped.append(bad)
            report_bad(f"skipped {bad.label}: {bad.message}")
    for missing in sorted((only or set()) - {_id_of(row) for _label, row in rows}):
        result.skipped.append(BadRow(missing, "no row of FILE has this instance_id (--only)"))
        report_bad(f"skipped {missing}: no row of FILE has this instance_id (--only)")
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="te-import-"))
    try:
        git = build.Git(scratch)
        clones = build.Clones(git)
        for number, instance in enumerate(instances, 1):
            url = build.repo_url(options.repo_url, instance.repo)
            try:
                clone = clones.get(url, instance.instance_id)
                files = build.test_files(git, clone, instance)
                built = build.build_task(instance, files, url, options, out)
            except BadRow as bad:
                result.skipped.append(bad)
                report_bad(f"skipped {bad.label}: {bad.message}")
                continue
            result.built.append(built)
            report(f"[{number}/{len(instances)}] {built.instance_id}: {built.archive} (sha256 {built.sha256[:12]})")
        write_index(out, result.built, [], result.skipped)
        if verify_jobs is not None and result.built:
            patches = {i.instance_id: i.patch for i in instances}
            checks = [
                verify.Check(
                    task.instance_id, out / task.archive, verify.gold_agent(task.instance_id, patches[task.instance_id])
                )
                for task in result.built
            ]
            result.verifications = verify.verify(checks, scratch, verify_jobs, report, verify.SWEBENCH)
            write_index(out, result.built, result.verifications, result.skipped)
            write_verification(out, result.verifications)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


def _id_of(row: object) -> object:
    return row.get("instance_id") if isinstance(row, dict) else None


def write_index(
    out: Path, built: list[build.Built], verifications: list[verify.Verification], skipped: list[BadRow] = ()
) -> None:
    checked = {v.task: v for v in verifications}
    entries = []
    for task in built:
        entry = {
            "instance_id": task.instance_id,
            "folder": task.folder,
            "archive": task.archive,
            "sha256": task.sha256,
            "repo": task.repo_url,
        }
        if task.instance_id in checked:
            entry["verified"] = checked[task.instance_id].verified
            if not checked[task.instance_id].verified:
                entry["reason"] = checked[task.instance_id].reason
        entries.append(entry)
    # An earlier entry stays while its archive does; a verification of it is dropped with a re-import.
    merge_index(
        out / "index.json",
        entries,
        key="instance_id",
        keep=lambda e: (out / str(e.get("archive", ""))).is_file(),
        extra={"skipped": [{"row": bad.label, "reason": bad.message} for bad in skipped]},
    )


def write_verification(out: Path, verifications: list[verify.Verification]) -> None:
    entries = [{"instance_id": v.task, **v.as_json(verify.SWEBENCH)} for v in verifications]
    merge_index(out / "verification.json", entries, key="instance_id")
