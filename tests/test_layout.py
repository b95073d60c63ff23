"""The import graph of the tree (evaluations/, executor_project/): no circles, and the layers' rules.

Read from the source with ``ast``, so nothing is imported: every ``import`` and ``from ... import``
of a module counts, at module level or inside a function (a function's import runs too, later).
Importing ``evaluations.a.b`` runs ``evaluations/__init__.py`` and ``evaluations/a/__init__.py``
first, so those edges count; a module's own parent packages do not (they are already importing).
"""

from __future__ import annotations

import ast
from functools import cache
from itertools import pairwise
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
PACKAGES = ("evaluations", "executor_project")
SKIPPED = ("migrations",)  # Django loads them one by one, by name; they import only Django


@cache
def modules() -> dict[str, Path]:
    """Every module of the tree: dotted name -> file (a package is its ``__init__.py``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((PROJECT / package).rglob("*.py")):
            parts = path.relative_to(PROJECT).with_suffix("").parts
            if any(part in SKIPPED for part in parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def _ran_by_importing(target: str) -> list[str]:
    """The modules of the tree that importing ``target`` runs: each package on the way, then it."""
    parts = target.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1) if ".".join(parts[:n]) in modules()]


def imports_of(name: str) -> dict[str, int]:
    """The modules of the tree ``name`` imports (directly): module -> line of the first such import."""
    tree = ast.parse(modules()[name].read_text(), filename=str(modules()[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    ancestors = set(_ran_by_importing(name)) - {name}
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from a import b``: b is a module of a, or a name defined in a.
            targets = [source] + [f"{source}.{alias.name}" for alias in node.names]
        for target in targets:
            for module in _ran_by_importing(target):
                if module != name and module not in ancestors:
                    found.setdefault(module, node.lineno)
    return found


@cache
def graph() -> dict[str, dict[str, int]]:
    return {name: imports_of(name) for name in modules()}


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), as one circle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_a_circle(group, edges) for group in groups]


def _a_circle(group: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group (breadth first)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in edges[node]:
            if nxt == start:
                return paths[node] + [start]
            if nxt in members and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return group


def describe(circle: list[str]) -> str:
    """``a (line 3) -> b (line 9) -> a``: where each import of the circle is written."""
    steps = [f"{module} (imports {nxt} at line {graph()[module][nxt]})" for module, nxt in pairwise(circle)]
    return " -> ".join(steps)


def offending(importers: str, forbidden: tuple[str, ...]) -> list[str]:
    """The imports, by modules at or under ``importers``, of a module at or under one of ``forbidden``."""
    found = []
    for name, targets in graph().items():
        if name != importers and not name.startswith(importers + "."):
            continue
        for target, line in targets.items():
            if any(target == f or target.startswith(f + ".") for f in forbidden):
                found.append(f"{modules()[name].relative_to(PROJECT)}:{line} imports {target}")
    return found


def test_the_graph_sees_the_tree():
    """A guard for the guard: the parser finds the imports every reader sees (or the rules pass vacuously)."""
    assert len(modules()) > 100
    assert "evaluations.worker.pool" in graph()["evaluations.worker.loop"]
    assert "evaluations.worker" in graph()["evaluations.management.commands.run_worker"]  # its __init__ runs
    assert "evaluations.environments" in graph()["evaluations.pipeline.imageenv"]  # `from evaluations import x`
    assert "evaluations.importers.verify" in graph()["evaluations.importers.swebench"]  # `from . import x`
    assert "evaluations.importers.rows" in graph()["evaluations.importers.swebench"]  # `from .rows import x`
    assert "evaluations.lifecycle" in graph()["evaluations.worker.loop"]
    assert "evaluations.tasks.registry" in graph()["evaluations.pipeline.steps"]
    assert "evaluations.tasks.spec" in graph()["evaluations.tasks.harbor"]  # `from evaluations.tasks.spec import x`
    assert "evaluations.tasks.sweforge" in graph()["evaluations.tasks.workspace"]  # `from evaluations.tasks import x`
    assert "evaluations.grading.parsers.swebench_logs" in graph()["evaluations.grading.parsers.pytest_summary"]
    assert "evaluations.grading.base" in graph()["evaluations.grading.registry"]  # `from .base import x`


def test_no_import_circles():
    found = circles(graph())
    assert not found, "import circles in the tree (break each; a function-level import is still an edge):\n" + (
        "\n".join(describe(circle) for circle in found)
    )


def test_config_imports_no_app_module():
    """config.py is read by settings before the apps load (settings_loader.py adds the checks needing them)."""
    found = offending("executor_project.config", ("evaluations",))
    assert not found, "config.py must import no app module:\n" + "\n".join(found)


def test_the_runtime_stands_alone():
    """The runtime is below the pipeline, the API, the worker and the models: it imports none of them."""
    forbidden = (
        "evaluations.pipeline",
        "evaluations.api",
        "evaluations.admin",
        "evaluations.worker",
        "evaluations.models",
        "evaluations.lifecycle",
    )
    found = offending("evaluations.runtime", forbidden) + third_party(
        "evaluations.runtime", ("django", "rest_framework")
    )
    assert not found, "the runtime must not import the layers above it, nor Django:\n" + "\n".join(found)


def third_party(importers: str, forbidden: tuple[str, ...]) -> list[str]:
    """The imports of a library outside the tree (``django``...), by modules at or under ``importers``."""
    found = []
    for name, path in modules().items():
        if name != importers and not name.startswith(importers + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            sources = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                sources = [node.module or ""]
            for source in sources:
                if source.split(".")[0] in forbidden:
                    found.append(f"{path.relative_to(PROJECT)}:{node.lineno} imports {source}")
    return found


def test_the_pipeline_reaches_no_view():
    """Data flows down from the API: the pipeline does not import the API or the admin."""
    found = offending("evaluations.pipeline", ("evaluations.api", "evaluations.admin"))
    assert not found, "the pipeline must not import the API or the admin:\n" + "\n".join(found)


def test_tasks_are_read_below_the_pipeline():
    """Reading a task folder needs no pipeline: the importers, the settings and the local runner read
    tasks with evaluations/tasks/ alone, and the pipeline imports it, never the other way."""
    forbidden = ("evaluations.pipeline", "evaluations.api", "evaluations.admin", "evaluations.worker")
    found = offending("evaluations.tasks", forbidden)
    assert not found, "evaluations/tasks/ must not import the pipeline or above:\n" + "\n".join(found)


def test_the_environments_are_below_the_pipeline():
    """Host, named and image environments (environments/kinds.py) are what the pipeline and the live
    sandboxes both hold: they import neither the pipeline nor the layers above it."""
    forbidden = ("evaluations.pipeline", "evaluations.api", "evaluations.admin", "evaluations.worker")
    found = offending("evaluations.environments", forbidden)
    assert not found, "the environments must not import the pipeline or above:\n" + "\n".join(found)


# -- one writer of statuses and transitions (SPEC §26) -------------------------------------------

WRITERS = ("evaluations.lifecycle", "evaluations.db")  # lifecycle, and the measured SQL under db/ it runs
ROW_WRITES = {"create", "bulk_create", "update", "bulk_update", "get_or_create", "update_or_create", "delete", "save"}
STATUS_COLUMNS = {"status", "step"}


def _chain(node: ast.expr) -> list[str]:
    """The names along ``a.b(...).c.d``: ["a", "b", "c", "d"] (calls passed through, their arguments not)."""
    names = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            names.append(node.id)
            return names[::-1]
        else:
            return names[::-1]


def status_and_transition_writes(name: str) -> list[str]:
    """What module ``name`` writes of a status or a transition, as ``ast`` sees it in its source:

    - a write (``create``, ``bulk_create``, ``update``, ``save``...) on a chain through ``Transition``
      or an evaluation's ``transitions``; a ``Transition(...)`` row built;
    - ``Transition._meta`` or the table's name in a string: SQL written by hand for it;
    - a write on a chain through ``Evaluation`` or ``Batch`` that sets ``status`` or ``step``, and an
      ``Evaluation(...)`` or ``Batch(...)`` built with one of them.

    A queryset kept in a variable and written later is not seen; the rule holds the direct forms.
    """
    path = modules()[name]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        what = None
        if isinstance(node, ast.Call):
            chain = _chain(node.func)
            keywords = {keyword.arg for keyword in node.keywords}
            if chain and chain[-1] == "Transition":
                what = "builds a Transition row"
            elif chain and chain[-1] in ("Evaluation", "Batch") and keywords & STATUS_COLUMNS:
                what = f"builds a row of {chain[-1]} with its status or step"
            elif len(chain) > 1 and chain[-1] in ROW_WRITES:
                if "Transition" in chain[:-1] or "transitions" in chain[:-1]:
                    what = f"writes transitions ({'.'.join(chain)})"
                elif {"Evaluation", "Batch"} & set(chain[:-1]) and keywords & STATUS_COLUMNS:
                    what = f"writes a status or step ({'.'.join(chain)})"
        elif isinstance(node, ast.Attribute) and node.attr == "_meta" and _chain(node.value)[-1:] == ["Transition"]:
            what = "reads Transition._meta (SQL by hand)"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "evaluations_transition" in node.value:
            what = "names the transitions' table"
        if what:
            found.append(f"{path.relative_to(PROJECT)}:{node.lineno} {what}")
    return found


def test_lifecycle_is_the_one_writer_of_statuses_and_transitions():
    found = [
        line
        for name in modules()
        if not any(name == writer or name.startswith(writer + ".") for writer in WRITERS)
        for line in status_and_transition_writes(name)
    ]
    assert not found, (
        "only evaluations/lifecycle.py writes statuses and transitions (and the SQL under evaluations/db/ "
        "that it runs); call lifecycle instead:\n" + "\n".join(found)
    )


def test_the_writer_rule_sees_each_form_of_write():
    """A guard for the guard: lifecycle's own writes are found, so the rule above can fail."""
    found = "\n".join(status_and_transition_writes("evaluations.lifecycle"))
    assert "builds a Transition row" in found
    assert "writes transitions (Transition.objects.create)" in found
    assert "writes transitions (Transition.objects.bulk_create)" in found
    assert "writes transitions (Transition.objects.filter.update)" in found
    assert "writes a status or step (Batch.objects.filter.filter.update)" in found
    sql = "\n".join(status_and_transition_writes("evaluations.db.admission"))
    assert "reads Transition._meta (SQL by hand)" in sql


# -- the top of evaluations/ (SPEC §26) ------------------------------------------------------------

TOP_LIMIT = 12


def test_at_most_twelve_modules_at_the_top_of_evaluations():
    """Every ``.py`` file directly in evaluations/ counts, Django's own three included (``__init__``,
    ``apps``, ``models``: the app needs them there, but a reader meets them all the same). A module
    that serves one package lives in it; the top keeps what many layers share."""
    top = sorted(path.name for path in (PROJECT / "evaluations").glob("*.py"))
    assert len(top) <= TOP_LIMIT, (
        f"{len(top)} modules at the top of evaluations/ (at most {TOP_LIMIT}); move one into the package "
        f"that uses it: {', '.join(top)}"
    )


def test_grading_is_below_the_pipeline():
    """Graders reach the sandbox through the Sandbox the pipeline gives them (grading/base.py): grading
    imports no step, no Context, no run, no API, no worker."""
    found = offending("evaluations.grading", ("evaluations.pipeline", "evaluations.api", "evaluations.worker"))
    assert not found, "grading must not import the pipeline, the API or the worker:\n" + "\n".join(found)


def test_the_graders_parsers_read_text_only():
    """grading/parsers/ are pure functions of text: nothing of the tree outside them, no Django."""
    found = [
        f"{modules()[name].relative_to(PROJECT)}:{line} imports {target}"
        for name, targets in graph().items()
        if name.startswith("evaluations.grading.parsers")
        for target, line in targets.items()
        if not target.startswith("evaluations.grading.parsers") and target != "evaluations.grading"
    ] + third_party("evaluations.grading.parsers", ("django", "rest_framework"))
    assert not found, "grading/parsers/ must import nothing of the tree but each other:\n" + "\n".join(found)


def test_the_grading_package_imports_nothing():
    """Importing grading/parsers/ or tbparsers (the task readers do, before Django's apps are loaded)
    runs evaluations/grading/__init__.py: it imports nothing."""
    assert not graph()["evaluations.grading"]
