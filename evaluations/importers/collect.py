"""`manage.py verify_tasks ARCHIVE|DIR...`: the arguments as tasks to check (SPEC §17).

1. An argument is a task folder (its root holds task.toml, task.yaml or
   workspace.yaml), a task archive, or a folder of those (one level: its
   task folders and its .tar.gz/.tgz/.tar/.zip files; names starting with
   ``.`` and everything else are passed over). A task folder beside an
   archive of the same name (``x/`` and ``x.tar.gz``, as import_tasks and
   import_swebench write them) is checked once, as the archive: that is what
   gets published. A path given twice is checked once.
2. Each task is then read as the pipeline reads it: a folder is packed into
   a .tar.gz in the scratch folder (localrun.pack_folder, as `manage.py
   evaluate` packs one); the archive is extracted by the pipeline's own
   ``extract_archive`` and ``find_task_root``, and the task loaded with
   ``load_task``, under the operator's caps. So the runs get the archive the
   reader accepted, and the solution is read from what they will run.
3. A path that is no task (missing, not a folder of tasks, an archive the
   executor cannot read) raises ``NotATask``: the command's exit 2, before
   anything runs. A task that the reader refuses, or that has no reference
   solution, is still a task: its check carries the reason and is not run.
4. The solution is what the reader found (TaskSpec ``solution``,
   ``solution_files``): Harbor's ``solution/solve.sh`` and every file beside
   it (solve.sh may read its neighbours, as under Harbor's oracle, which
   uploads the folder); Terminal-Bench's ``solution.sh`` (or its
   ``solution.yaml`` as one script); a workspace task's ``patch`` (SWE-Forge's,
   and what import_swebench writes: the row's gold patch), applied by
   ``verify.gold_agent`` as ``import_swebench --verify`` applies it. A task of
   ``[[steps]]`` (SPEC §23): each step's own ``steps/<name>/solution/``, else
   the task's, as Harbor's oracle takes them, in one agent run once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from evaluations.pipeline import archive
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import TaskError, TaskSpec
from evaluations.worker.localrun import pack_folder

from . import verify

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
NO_SOLUTION = {
    "harbor": "the task has no reference solution (solution/solve.sh)",
    "terminal-bench": "the task has no reference solution (solution.sh)",
    "workspace": "the task has no reference solution (workspace.yaml 'patch')",
}


class NotATask(Exception):
    """An argument is not a task, a task archive or a folder of them; the sentence names it."""


@dataclass(frozen=True)
class Given:
    name: str  # the path as given (a folder's task: DIR/name): the task's name in the table and the JSON
    path: Path


def find(arguments: list[str]) -> list[Given]:
    """Every task the arguments name, in their order (a folder's tasks by name); raises NotATask."""
    found: list[Given] = []
    seen: set[Path] = set()
    for argument in arguments:
        path = Path(argument)
        if path.is_dir() and not archive.is_task_root(path):
            inside = _folder_of_tasks(path)
            if not inside:
                raise NotATask(
                    f"{argument}: not a task folder (no {', '.join(archive.TASK_FILES)} at its root) "
                    f"and no task folder or archive ({', '.join(ARCHIVE_SUFFIXES)}) in it"
                )
        elif path.is_dir() or path.is_file():
            inside = [path]
        else:
            raise NotATask(f"{argument}: no such file or folder")
        for item in inside:
            key = item.resolve()
            if key not in seen:
                seen.add(key)
                found.append(Given(str(item), item))
    return found


def _folder_of_tasks(folder: Path) -> list[Path]:
    entries = sorted(entry for entry in folder.iterdir() if not entry.name.startswith("."))
    archives = [entry for entry in entries if entry.is_file() and entry.name.lower().endswith(ARCHIVE_SUFFIXES)]
    archived = {_stem(entry.name) for entry in archives}
    folders = [
        entry for entry in entries if entry.is_dir() and archive.is_task_root(entry) and entry.name not in archived
    ]
    return sorted(archives + folders, key=lambda entry: (_stem(entry.name), entry.name))


def _stem(name: str) -> str:
    lowered = name.lower()
    for suffix in ARCHIVE_SUFFIXES:
        if lowered.endswith(suffix):
            return name[: -len(suffix)]
    return name


def prepare(given: Given, scratch: Path, config) -> verify.Check:
    """The check of one task: its archive (a folder packed into ``scratch``) and its solution agent,
    or the reason it cannot be checked. Raises NotATask when the executor cannot read it as a task."""
    scratch.mkdir(parents=True)
    task_archive = given.path.resolve()
    if given.path.is_dir():
        task_archive = scratch / f"{given.path.resolve().name}.tar.gz"
        try:
            pack_folder(given.path.resolve(), task_archive)
        except OSError as exc:
            raise NotATask(f"{given.name}: cannot pack the folder: {exc}") from None
    extracted = scratch / "task"
    try:
        archive.extract_archive(
            task_archive,
            extracted,
            max_members=config.max_archive_members,
            max_bytes=config.max_extracted_bytes,
        )
        root = archive.find_task_root(extracted)
    except archive.ArchiveError as exc:
        raise NotATask(f"{given.name}: {exc}") from None
    try:
        task = load_task(
            root, allow_file_urls=True, max_prompt_bytes=config.max_prompt_bytes, max_tests=config.max_tests
        )
    except TaskError as exc:
        return verify.Check(given.name, task_archive, None, f"the task is invalid (task_invalid): {exc}")
    if task.steps:  # SPEC §23: each step's own solution/, else the task's
        return _steps_check(given, task_archive, task, config)
    if task.solution is None and task.patch is None:
        problem = NO_SOLUTION[task.format]
        why_not = (task.metadata or {}).get("solution_not_converted")  # Terminal-Bench's solution.yaml
        if why_not:
            problem += f": {why_not}"
        return verify.Check(given.name, task_archive, None, problem, task.format)
    if task.solution is None:  # SPEC §19: a workspace task's patch, applied as SWE-bench applies the gold patch
        agent = verify.gold_agent(given.name, task.patch)
    else:
        files, executables, script = solution_files(task)
        agent = verify.solution_agent(given.name, files, script, executables=executables, env=task.solution_env)
    return _sized(given, task_archive, agent, task, config)


def _sized(given: Given, task_archive: Path, agent: str, task: TaskSpec, config) -> verify.Check:
    """The check with ``agent``, or why not: an agent over MAX_AGENT_CODE_BYTES cannot be sent."""
    size = len(agent.encode("utf-8"))
    if size > config.max_agent_code_bytes:
        problem = (
            f"the reference solution as an agent is {size} bytes, over MAX_AGENT_CODE_BYTES "
            f"({config.max_agent_code_bytes})"
        )
        return verify.Check(given.name, task_archive, None, problem, task.format)
    return verify.Check(given.name, task_archive, agent, None, task.format)


def _steps_check(given: Given, task_archive: Path, task: TaskSpec, config) -> verify.Check:
    """A multi-step task's check: one agent running each step's reference solution (verify.steps_agent)."""
    agents = {}
    for step in task.steps:
        if step.solution is None:
            problem = f"step {step.name!r} has no reference solution (steps/{step.name}/solution/solve.sh or solution/solve.sh)"
            return verify.Check(given.name, task_archive, None, problem, task.format)
        files, executables, script = solution_files(
            replace(task, solution=step.solution, solution_files=step.solution_files)
        )
        agents[step.name] = verify.solution_agent(
            f"{given.name} (step {step.name})", files, script, executables=executables, env=task.solution_env
        )
    return _sized(given, task_archive, verify.steps_agent(given.name, agents), task, config)


def solution_files(task: TaskSpec) -> tuple[dict[str, bytes], frozenset[str], str]:
    """(relative path -> bytes, the executable ones, the script to run) of a task's reference solution:
    the script (Terminal-Bench: solution.sh, else solve.sh) and the files beside it (Harbor's solution/)."""
    script = "solution.sh" if task.format == "terminal-bench" else "solve.sh"
    files = {script: task.solution.encode("utf-8")}
    executables = set()
    for file in task.solution_files:
        files[file.relpath] = file.data
        if file.mode & 0o111:
            executables.add(file.relpath)
    return files, frozenset(executables), script
