"""SWE-bench-style instances from real git repositories made in the test.

``Instances.make`` commits a base (the bug), a test commit (the instance's
tests) and a fix commit, mirrors the repository as ``<www>/<repo>.git`` for
the HTTP server serving ``www``, and returns the row: ``test_patch`` is the
test commit's diff, ``patch`` the fix commit's (it touches no test file, so
both apply at the base, as in SWE-bench).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.gitrepos import git, make_bare, make_repo

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BASE_FILES = {
    "calc.py": BUGGY,
    "tests/__init__.py": "",
    "tests/test_sub.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n",
    "tests/test_old.py": "def test_old():\n    raise AssertionError('the test_patch deletes this file')\n",
}
# Parametrize ids with a space, brackets and quotes: pytest names them test_add[2 + 3] and so on.
ADD_TESTS = (
    "import pytest\n\nfrom calc import add\n\n"
    'CASES = {"2 + 3": (2, 3, 5), "it\'s [x]": (1, 1, 2), \'say "hi"\': (0, 4, 4)}\n\n\n'
    "@pytest.mark.parametrize('name', list(CASES))\n"
    "def test_add(name):\n"
    "    a, b, want = CASES[name]\n"
    "    assert add(a, b) == want\n"
)
ADD_IDS = [
    "tests/test_add.py::test_add[2 + 3]",
    "tests/test_add.py::test_add[it's [x]]",
    'tests/test_add.py::test_add[say "hi"]',
]
# The test patch touches every file its ids are in (SWE-bench runs only those files): test_sub.py too.
TEST_COMMIT = {
    "tests/test_add.py": ADD_TESTS,
    "tests/test_sub.py": BASE_FILES["tests/test_sub.py"] + "\n\ndef test_sub_zero():\n    assert sub(0, 0) == 0\n",
    "tests/data/cases.txt": "support file in a subfolder\n",
    "tests/test_old.py": None,
}
SOLVER = (
    "import os, pathlib\n"
    "f = pathlib.Path(os.environ['REPO_DIR'], 'calc.py')\n"
    "f.write_text(f.read_text().replace('def add(a, b):\\n    return a - b', 'def add(a, b):\\n    return a + b'))\n"
)


class Instances:
    """Rows of instances whose repositories are served from ``www`` (the server's root)."""

    def __init__(self, www: Path, work: Path):
        self.www = www
        self.work = work

    def make(
        self,
        instance_id: str,
        repo: str = "owner/calc",
        *,
        base: dict | None = None,
        tests: dict | None = None,
        fix: dict | None = None,
        fail_to_pass: list[str] | None = None,
        pass_to_pass: list[str] | None = None,
        **fields,
    ) -> dict:
        work = self.work / instance_id
        shas = make_repo(work, [base or BASE_FILES, tests or TEST_COMMIT, fix or {"calc.py": FIXED}])
        target = self.www / f"{repo}.git"
        if not target.exists():  # rows of one repository share it; the first one's history is served
            target.parent.mkdir(parents=True, exist_ok=True)
            make_bare(work, target)
        row = {
            "instance_id": instance_id,
            "repo": repo,
            "base_commit": shas[0],
            "patch": git(work, "diff", shas[1], shas[2]) + "\n",
            "test_patch": git(work, "diff", shas[0], shas[1]) + "\n",
            "problem_statement": "add() subtracts: `add(2, 3)` returns -1, it should return 5.\n",
            "FAIL_TO_PASS": ADD_IDS if fail_to_pass is None else fail_to_pass,
            "PASS_TO_PASS": ["tests/test_sub.py::test_sub"] if pass_to_pass is None else pass_to_pass,
            "version": "1.0",
        }
        row.update(fields)
        self.shas = shas
        return row


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_json_list(path: Path, rows: list, *, encode_lists: bool = True) -> Path:
    """A JSON list, FAIL_TO_PASS/PASS_TO_PASS JSON-encoded as the published SWE-bench datasets have them."""
    if encode_lists:
        rows = [
            {**row, **{k: json.dumps(row[k]) for k in ("FAIL_TO_PASS", "PASS_TO_PASS") if k in row}} for row in rows
        ]
    path.write_text(json.dumps(rows, indent=1))
    return path
