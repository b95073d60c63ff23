"""The agent against its own patch (issue 23): files it plants cannot be hidden from
``agent_patch`` (by git's rules, by a repository of its own inside the work tree, or by objects
it forges under the base's ids), and nothing it leaves in its /tmp steers where the sandbox
mounts things."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers.gitrepos import FORGE_BASE_TREE
from tests.helpers.tasks import BUGGY, SOLVER
from tests.security.support import evaluate, still_works

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# calc.py stays wrong; a package `calc` beside it shadows it (Python prefers the package), so the
# test passes. Each planted file is hidden from git a different way; the patch must show them all.
HIDER = r"""
import os, pathlib, subprocess
home = pathlib.Path(os.environ["HOME"])
def put(path, text):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
put("calc/__init__.py", "def add(a, b):\n    return a + b  # SHADOW\n")
put("calc/.gitignore", "*\n")                                   # ignores itself and the package
put("conftest.py", "import pytest  # PLANTED-CONFTEST\n")
put(".gitignore", ".gitignore\nconftest.py\n.gitattributes\n")  # ignores itself too
put(home / ".config/git/ignore", "global_hidden/\n")            # the global excludes file in HOME
put("global_hidden/mod.py", "GLOBAL = 'PLANTED-GLOBAL'\n")
put(".git/info/exclude", "exclude_hidden/\n")
put("exclude_hidden/mod.py", "EXCLUDE = 'PLANTED-EXCLUDE'\n")
put(".git/info/attributes", "*.py -diff\n")
put(home / ".config/git/attributes", "*.py binary\n")
put(".gitattributes", "attr_hidden.py -diff\nencoded.py working-tree-encoding=UTF-16\n* filter=hide\n")
put("attr_hidden.py", "ATTR = 'PLANTED-ATTR'\n")
put("encoded.py", "ENCODED = 'PLANTED-ENCODED'\n")
subprocess.run(["git", "config", "filter.hide.clean", "true"], check=False)  # its own repo's config
print("planted")
"""

PLANTED = [
    ("calc/__init__.py", "+    return a + b  # SHADOW"),
    ("calc/.gitignore", "+*"),
    ("conftest.py", "+import pytest  # PLANTED-CONFTEST"),
    (".gitignore", "+conftest.py"),
    ("global_hidden/mod.py", "+GLOBAL = 'PLANTED-GLOBAL'"),
    ("exclude_hidden/mod.py", "+EXCLUDE = 'PLANTED-EXCLUDE'"),
    ("attr_hidden.py", "+ATTR = 'PLANTED-ATTR'"),
    ("encoded.py", "+ENCODED = 'PLANTED-ENCODED'"),
    (".gitattributes", "+attr_hidden.py -diff"),
]


def _section(patch: str, path: str) -> str:
    """The part of ``patch`` for ``path`` ("" when it is not there)."""
    head = f"diff --git a/{path} b/{path}\n"
    if head not in patch:
        return ""
    return patch.split(head, 1)[1].split("\ndiff --git ", 1)[0]


def test_files_hidden_by_git_rules_the_agent_wrote_are_in_the_patch(tasks, e2e_config, sandbox):
    evaluation = evaluate(tasks.task(), HIDER, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert "planted" in evaluation.agent_output, evaluation.agent_output
    patch = evaluation.agent_patch
    missing = [path for path, line in PLANTED if line not in _section(patch, path).splitlines()]
    assert missing == [], f"hidden from the patch: {missing}\n{patch[:3000]}"
    assert "GIT binary patch" not in patch
    still_works(tasks, e2e_config, sandbox)


# The agent (or a hostile install step) moves the folders bubblewrap mounts the session on out of
# its /tmp and puts a link in their place, to a host folder anyone may write (as /tmp/.X11-unix).
# Without the sandbox it writes there directly. Nothing may be left there afterwards.
REDIRECT = r"""
import os, pathlib
shared = os.environ["SHARED"]
top = os.environ["REPO_DIR"].split("/")[2]          # the session path's first folder below /tmp
if os.path.realpath("/tmp") == "/tmp" and os.path.isdir(f"/tmp/{top}") and "{mode}" == "link":
    os.rename(f"/tmp/{top}", f"/tmp/{top}.moved")
    os.symlink(f"/oldroot{shared}", f"/tmp/{top}")  # bwrap's view of the host while it mounts
    print("linked", top)
else:
    os.makedirs(f"{shared}/deep/er", exist_ok=True)
    pathlib.Path(f"{shared}/deep/er/left").write_text("left by the agent\n")
    pathlib.Path(f"{shared}/left").write_text("left by the agent\n")
    print("wrote", shared)
"""


@pytest.fixture
def shared_folder():
    """A root-owned 1777 folder in the host's /tmp, like /tmp/.X11-unix: any uid may write in it."""
    folder = Path(tempfile.mkdtemp(prefix="te-shared-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _left_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_link_in_the_agents_tmp_steers_no_mount_and_leaves_nothing_on_the_host(
    tasks, e2e_config, sandbox, shared_folder
):
    agent = SOLVER + REDIRECT.replace("{mode}", "link" if sandbox == "bwrap" else "write")
    evaluation = evaluate(tasks.task(), agent, config=e2e_config, sandbox=sandbox, env={"SHARED": str(shared_folder)})
    assert ("linked" if sandbox == "bwrap" else "wrote") in evaluation.agent_output, evaluation.agent_output
    assert _left_in(shared_folder) == [], "created or left on the host, outside the session"
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert "+    return a + b" in evaluation.agent_patch, evaluation.agent_patch
    still_works(tasks, e2e_config, sandbox)


@pytest.mark.parametrize("sandbox", ["bwrap"], indirect=True)  # bubblewrap's mount points: none without it
def test_a_link_an_install_step_plants_steers_no_later_command(tasks, e2e_config, sandbox, shared_folder):
    """The same link, planted by the task's install step before the agent's command starts."""
    plant = (
        "top=$(pwd | cut -d/ -f3) && mv /tmp/$top /tmp/$top.moved && "
        f"ln -s /oldroot{shared_folder} /tmp/$top && echo linked $top"
    )
    task = tasks.task(install=[plant])
    evaluation = evaluate(task, SOLVER, config=e2e_config, sandbox=sandbox)
    assert _left_in(shared_folder) == [], "created or left on the host, outside the session"
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.agent_output)
    assert "fixed:" in evaluation.agent_output
    assert "+    return a + b" in evaluation.agent_patch, evaluation.agent_patch
    still_works(tasks, e2e_config, sandbox)


# Repositories of the agent's own inside the work tree: one with a commit (git would show only a
# "Subproject commit" line), one without (git add fails, and there was no patch at all), one made
# by a `.git` file; and a folder git cannot store (`.GIT`). The package `calc` shadows calc.py.
NESTER = r"""
import pathlib, subprocess
def put(path, text):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
def git(folder, *args):
    subprocess.run(["git", "-c", "user.name=a", "-c", "user.email=a@x", *args], cwd=folder, check=True)
put("calc/__init__.py", "def add(a, b):\n    return a + b  # SHADOW\n")
git("calc", "init", "-q")
git("calc", "add", "-A")
git("calc", "commit", "-qm", "hidden")
put("uncommitted/helper.py", "HELPER = 'PLANTED-UNCOMMITTED'\n")
git("uncommitted", "init", "-q")
put("linked/mod.py", "LINKED = 'PLANTED-LINKED'\n")
put("linked/.git", "gitdir: ../.git\n")
put("deep/er/.GIT/junk", "git cannot store this path\n")
put("deep/er/kept.py", "KEPT = 'PLANTED-DEEP'\n")
print("nested")
"""

NESTED = [
    ("calc/__init__.py", "+    return a + b  # SHADOW"),
    ("uncommitted/helper.py", "+HELPER = 'PLANTED-UNCOMMITTED'"),
    ("linked/mod.py", "+LINKED = 'PLANTED-LINKED'"),
    ("deep/er/kept.py", "+KEPT = 'PLANTED-DEEP'"),
]


def test_files_in_a_repository_the_agent_made_inside_the_work_tree_are_in_the_patch(tasks, e2e_config, sandbox):
    evaluation = evaluate(tasks.task(), NESTER, config=e2e_config, sandbox=sandbox)
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    assert "nested" in evaluation.agent_output, evaluation.agent_output
    patch = evaluation.agent_patch
    assert not patch.startswith("(no patch"), patch
    missing = [path for path, line in NESTED if line not in _section(patch, path).splitlines()]
    assert missing == [], f"hidden from the patch: {missing}\n{patch[:3000]}"
    assert "Subproject commit" not in patch and "160000" not in patch, patch[:3000]
    assert "/.git/" not in patch and "/.GIT/" not in patch and "b/linked/.git" not in patch, patch[:3000]
    still_works(tasks, e2e_config, sandbox)


# The agent fixes calc.py in plain sight and changes pkg/util.py, then forges the base's tree of
# pkg/ in its repository's object store so that the change looks like none. Twice: the first run
# clones (and builds the workspace cache's snapshot), the second starts from the snapshot.
FORGER = (
    SOLVER
    + FORGE_BASE_TREE
    + r"""
pathlib.Path("pkg/util.py").write_text("X = 2  # HIDDEN-CHANGE\n")
forge("pkg/util.py")
"""
)


def test_objects_the_agent_forges_under_the_bases_ids_hide_nothing(tasks, e2e_config, sandbox):
    url = tasks.task(base_files={"calc.py": BUGGY, "pkg/util.py": "X = 1\n"}, install=["true"])
    for _ in range(2):
        evaluation = evaluate(url, FORGER, config=e2e_config, sandbox=sandbox)
        assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.log)
        assert "forged" in evaluation.agent_output, evaluation.agent_output
        patch = evaluation.agent_patch
        assert "+X = 2  # HIDDEN-CHANGE" in _section(patch, "pkg/util.py").splitlines(), patch[:3000]
        assert "+    return a + b" in _section(patch, "calc.py").splitlines(), patch[:3000]
    if sandbox == "bwrap":
        assert evaluation.cache == "hit", evaluation.cache  # the second started from the snapshot
    still_works(tasks, e2e_config, sandbox)
