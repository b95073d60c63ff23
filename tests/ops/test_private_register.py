"""The register of private internals (docs/internals.md, docs/private-internals.json) cannot rot.

It fails when Python, Django, DRF or pip run at another version than the one the register was
checked against (naming the rows to re-check), when a row's private name is gone from its file
or from its library, when a row's pinning test is gone, and when the docs table is not the
register's rendering.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import platform
import re
import shutil
from pathlib import Path

from tests.helpers.service import PROJECT

REGISTER = PROJECT / "docs" / "private-internals.json"
DOCS = PROJECT / "docs" / "internals.md"


def load(path: Path = REGISTER) -> dict:
    return json.loads(path.read_text())


def running_versions(libraries) -> dict[str, str]:
    return {
        library: platform.python_version() if library == "python" else importlib.metadata.version(library)
        for library in libraries
    }


def version_mismatches(register: dict, running: dict[str, str]) -> list[str]:
    """One line per library whose running version is not the checked one, naming its rows."""
    problems = []
    for library, checked in register["checked"].items():
        if running[library] != checked:
            rows = [row["id"] for row in register["rows"] if row["library"] == library]
            problems.append(
                f"{library} {running[library]} runs, {checked} was checked: re-check the rows "
                f"{', '.join(rows)} of docs/internals.md, then set {library!r} in docs/private-internals.json"
            )
    return problems


def missing_names(register: dict, root: Path) -> list[str]:
    """Each row's names, as they must still appear in its file."""
    problems = []
    for row in register["rows"]:
        path = root / row["file"]
        if not path.exists():
            problems.append(f"row {row['id']}: {row['file']} does not exist")
            continue
        text = path.read_text()
        problems += [f"row {row['id']}: {name!r} is not in {row['file']}" for name in row["names"] if name not in text]
    return problems


def resolve(dotted: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def gone_from_libraries(register: dict) -> list[str]:
    """Each row's library names, as the running libraries must still have them."""
    problems = []
    for row in register["rows"]:
        for dotted in row.get("resolves", []):
            try:
                resolve(dotted)
            except (ImportError, AttributeError) as exc:
                problems.append(f"row {row['id']}: {dotted} is gone ({exc})")
        for dotted, text in row.get("source_mentions", {}).items():
            if text not in inspect.getsource(resolve(dotted)):
                problems.append(f"row {row['id']}: {dotted} no longer mentions {text!r}")
        if entry := row.get("entry_point"):
            points = importlib.metadata.distribution(entry["distribution"]).entry_points
            values = [point.value for point in points if point.name == entry["name"]]
            if values != [entry["value"]]:
                problems.append(f"row {row['id']}: {entry['distribution']}'s {entry['name']} runs {values}")
    return problems


def render_table(register: dict) -> str:
    """The table of docs/internals.md, as this register renders it."""
    lines = [
        "| row | file | private name | checked against | the figure that pays for it | the test that pins it |",
        "|---|---|---|---|---|---|",
    ]
    for row in register["rows"]:
        version = register["checked"][row["library"]]
        names = ", ".join(f"`{name}`" for name in row["names"])
        tests = ", ".join(f"`{test}`" for test in row["tests"])
        lines.append(
            f"| {row['id']} | `{row['file']}` | {names} | {row['library']} {version} | {row['figure']} | {tests} |"
        )
    return "\n".join(lines) + "\n"


def test_the_running_versions_are_the_checked_ones():
    register = load()
    assert version_mismatches(register, running_versions(register["checked"])) == []


def test_every_row_names_what_its_file_still_holds():
    assert missing_names(load(), PROJECT) == []


def test_every_name_still_exists_in_its_library():
    assert gone_from_libraries(load()) == []


def test_every_pinning_test_exists():
    for row in load()["rows"]:
        for test in row["tests"]:
            path, name = test.split("::")
            assert re.search(rf"^def {name}\(", (PROJECT / path).read_text(), re.M), f"row {row['id']}: {test} is gone"


def test_the_docs_table_is_the_registers():
    table = render_table(load())
    assert table in DOCS.read_text(), f"docs/internals.md's table is not the register's; it should read:\n{table}"


# -- the register can fail ---------------------------------------------------------------------


def test_a_version_change_names_the_rows_to_recheck():
    register = load()
    running = dict(register["checked"], django="9.9.9")
    [problem] = version_mismatches(register, running)
    assert problem.startswith(f"django 9.9.9 runs, {register['checked']['django']} was checked")
    django_rows = [row["id"] for row in register["rows"] if row["library"] == "django"]
    assert django_rows and all(row in problem for row in django_rows)
    assert "forkserver" not in problem


def test_a_name_gone_from_its_file_is_reported(tmp_path):
    register = load()
    row = next(row for row in register["rows"] if row["id"] == "sqlite-write-lock")
    copy = tmp_path / row["file"]
    copy.parent.mkdir(parents=True)
    shutil.copy(PROJECT / row["file"], copy)
    copy.write_text(copy.read_text().replace("_commit", "_commit_renamed"))
    register["rows"] = [row]
    assert missing_names(register, tmp_path) == [
        "row sqlite-write-lock: 'def _commit(' is not in executor_project/backends/sqlite3/base.py",
        "row sqlite-write-lock: 'super()._commit()' is not in executor_project/backends/sqlite3/base.py",
    ]
    copy.unlink()
    assert missing_names(register, tmp_path) == [
        "row sqlite-write-lock: executor_project/backends/sqlite3/base.py does not exist"
    ]


def test_a_name_gone_from_its_library_is_reported():
    register = {
        "rows": [
            {"id": "x", "resolves": ["multiprocessing.forkserver._forkserver._no_such_name", "no_such_module.name"]},
            {"id": "y", "source_mentions": {"django.utils.log.log_response": "_no_such_attribute"}},
            {"id": "z", "entry_point": {"distribution": "pip", "name": "pip", "value": "pip.elsewhere:main"}},
        ]
    }
    problems = gone_from_libraries(register)
    assert [problem.split(":")[0] for problem in problems] == ["row x", "row x", "row y", "row z"]
