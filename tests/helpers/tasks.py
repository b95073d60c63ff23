"""Real tasks for end-to-end tests: a git repository whose later commit holds the fix,
served as a bare repository over dumb HTTP, and a task archive beside it."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.helpers.archives import Exec, write_archive
from tests.helpers.gitrepos import make_bare, make_repo

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
ADD_TEST = Exec("#!/bin/bash\npython3 -c 'from calc import add; assert add(2, 3) == 5, add(2, 3)' && echo add-ok\n")

SOLVER = (
    "import argparse, pathlib\n"
    "p = argparse.ArgumentParser(); p.add_argument('--instruction'); a = p.parse_args()\n"
    "f = pathlib.Path('calc.py'); f.write_text(f.read_text().replace('a - b', 'a + b'))\n"
    "print('fixed:', a.instruction.splitlines()[0])\n"
)
NOOP = "print('looking around')\n"


class TaskFactory:
    """Build tasks under `www`, the folder an HTTP server on 127.0.0.1 serves at `base_url`."""

    def __init__(self, www: Path, base_url: str):
        self.www = www
        self.base_url = base_url.rstrip("/")

    def repo(self, commits: list[dict]) -> tuple[str, list[str]]:
        """A served repository; returns (clone URL, commit shas)."""
        name = f"r{uuid.uuid4().hex[:8]}"
        work = self.www.parent / "work" / name
        shas = make_repo(work, commits)
        make_bare(work, self.www / f"{name}.git")
        return f"{self.base_url}/{name}.git", shas

    def task(
        self,
        *,
        tests: dict | None = None,
        install: list[str] | None = None,
        checks: str | None = None,
        extra: dict | None = None,
        base_files: dict | None = None,
        future: dict | None = None,
        workspace: str | None = None,
        environment: str | None = None,
        fmt: str = "tar.gz",
    ) -> str:
        """The URL of a task whose repository's base holds the bug and whose next commit the fix."""
        commits = [base_files or {"calc.py": BUGGY}, {**(future or {"calc.py": FIXED}), ":tag": "v-fixed"}]
        repo_url, shas = self.repo(commits)
        yaml = workspace or f"repo: {repo_url}\nbase_commit: {shas[0]}\n"
        if environment:
            yaml += f"environment: {environment}\n"
        if install:
            yaml += "install:\n" + "".join(f"  - {command!r}\n" for command in install)
        files = {"workspace.yaml": yaml, "prompt.md": "Make add() add.\n"}
        files.update({f"tests/{name}": body for name, body in (tests or {"fail_to_pass_add.sh": ADD_TEST}).items()})
        if checks is not None:
            files["checks.txt"] = checks
        files.update(extra or {})
        name = f"task-{uuid.uuid4().hex[:8]}.{fmt}"
        write_archive(self.www / name, files, fmt, top="task")
        self.last_shas = shas
        return f"{self.base_url}/{name}"
