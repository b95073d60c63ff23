"""An Instance -> a task folder of SPEC §4 and its archive, in DIR (SPEC §15).

1. The tests are the instance's own: in a scratch clone of the repository
   (one per URL, reused by every row of that repository), ``test_patch`` is
   applied to ``base_commit`` in a throwaway index (``git apply --cached``:
   no checkout, so a large repository costs one ``read-tree``), and every
   file it adds or changes, as it is after the patch, becomes a support file
   under ``tests/``. The pipeline writes those into the repository after the
   agent, so the agent can neither see nor pre-empt them.
2. A file the test_patch deletes cannot be a support file: it is listed in
   ``swebench: deleted_files`` and removed before the tests run, so they see
   the tree the test_patch leaves. A symbolic link, a submodule or a
   top-level ``*.sh`` in the test_patch makes the row bad.
3. The task is graded as SWE-bench grades (SPEC §19, ``grader: swebench``):
   the test command runs once over the test patch's test files
   (``test_directives``: SWE-bench's ``get_test_directives``), and each
   FAIL_TO_PASS / PASS_TO_PASS id is read from its log by the repository's
   parser (``swebench_logs.parser_for_repo``), the ids kept as the row has them.
4. workspace.yaml's ``install``, ``env`` and ``environment`` and the test
   command are the row's recipe and environment (recipes.py: SWE-bench's
   specifications, --specs, --install/--test-cmd, --environment-for,
   --image-template, a SWE-bench 5.0 row's ``image``); in such an image the
   task has no ``repo``.
5. The folder is written in a scratch folder inside DIR, read back with the
   pipeline's own ``load_task`` (so what is written is what the executor
   accepts), packed, and only then renamed into place: a task is in DIR
   whole or not at all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from evaluations.grading.parsers import swebench_logs
from evaluations.pipeline import gitrepo
from evaluations.tasks.readers import MAX_INSTRUCTION_BYTES
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import TaskError
from evaluations.worker.localrun import pack_folder

from . import recipes
from .recipes import DEFAULT_INSTALL, DEFAULT_REPO_URL, DEFAULT_TEST_CMD, Options  # noqa: F401  (re-exported)
from .rows import BadRow, Instance

CLONE_TIMEOUT_SECS = 3600
GIT_TIMEOUT_SECS = 600
# A transfer slower than 1 KB/s for a minute is a dead one (an unreachable host fails sooner).
_CLONE_SETTINGS = ("http.lowSpeedLimit=1000", "http.lowSpeedTime=60")
_MODES = {"100644": 0o644, "100755": 0o755}


@dataclass(frozen=True)
class Built:
    instance_id: str
    folder: str  # relative to DIR
    archive: str  # relative to DIR
    sha256: str
    repo_url: str


class Git:
    """git in a scratch folder, with the pipeline's hardening and a clean environment."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        home = scratch / "home"
        home.mkdir(exist_ok=True)
        self.env = gitrepo.git_env(home, "http:https:file")

    def run(self, *args: str, cwd: Path, env: dict | None = None, timeout: float = GIT_TIMEOUT_SECS):
        return subprocess.run(
            [*gitrepo.git_argv(), *args],
            cwd=cwd,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )


class Clones:
    """One scratch clone per repository URL, made on first use; a failed clone is remembered too."""

    def __init__(self, git: Git):
        self.git = git
        self.clones: dict[str, Path | str] = {}  # URL -> the clone, or why there is none

    def get(self, url: str, label: str) -> Path:
        if url not in self.clones:
            self.clones[url] = self._clone(url)
        found = self.clones[url]
        if isinstance(found, str):
            raise BadRow(label, found)
        return found

    def _clone(self, url: str) -> Path | str:
        dest = self.git.scratch / f"clone-{len(self.clones) + 1}"
        try:
            settings = [word for setting in _CLONE_SETTINGS for word in ("-c", setting)]
            clone = ["clone", "--quiet", "--bare", "--template=", "--", url, str(dest)]
            done = self.git.run(*settings, *clone, cwd=self.git.scratch, timeout=CLONE_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            return f"cannot clone {url}: not done after {CLONE_TIMEOUT_SECS} s"
        if done.returncode != 0:
            return f"cannot clone {url}: {_last_line(done.stderr) or f'git exited with {done.returncode}'}"
        return dest


def repo_url(template: str, repo: str) -> str:
    return template.replace("{repo}", repo)


@dataclass(frozen=True)
class TestFiles:
    __test__ = False  # not a pytest test class

    changed: list[tuple[str, bytes, int]]  # (path, content after the patch, mode)
    deleted: list[str]


def test_files(git: Git, clone: Path, instance: Instance) -> TestFiles:
    """What ``test_patch`` does at ``base_commit``: the files it adds or changes, and those it deletes."""
    label = instance.instance_id
    base = instance.base_commit
    if base.startswith("-") or not base.strip():
        raise BadRow(label, f"base_commit {base!r} is not a commit id")
    found = git.run("rev-parse", "--verify", "--quiet", "--end-of-options", f"{base}^{{commit}}", cwd=clone)
    if found.returncode != 0:
        raise BadRow(label, f"base_commit {base} is not in the repository")
    sha = found.stdout.decode().strip()
    with tempfile.TemporaryDirectory(dir=git.scratch) as work:
        index = {"GIT_INDEX_FILE": str(Path(work) / "index")}
        _check(git.run("read-tree", sha, cwd=clone, env=index), label, "git read-tree of base_commit")
        patch_file = Path(work) / "test.patch"
        patch_file.write_text(instance.test_patch, encoding="utf-8")
        applied = git.run("apply", "--cached", "--binary", str(patch_file), cwd=clone, env=index)
        if applied.returncode != 0:
            raise BadRow(label, f"test_patch does not apply at base_commit: {_last_line(applied.stderr)}")
        changes = git.run("diff", "--cached", "--name-status", "--no-renames", "-z", sha, cwd=clone, env=index)
        _check(changes, label, "git diff of the test_patch")
        fields = changes.stdout.decode("utf-8", "surrogateescape").split("\0")
        changed, deleted = [], []
        for status, path in zip(fields[0:-1:2], fields[1::2], strict=True):
            if status == "D":
                deleted.append(path)
                continue
            changed.append(_staged_file(git, clone, index, label, path))
    if not changed and not deleted:
        raise BadRow(label, "test_patch changes nothing")
    return TestFiles(changed, deleted)


def _staged_file(git: Git, clone: Path, index: dict, label: str, path: str) -> tuple[str, bytes, int]:
    listed = git.run("ls-files", "--stage", "-z", "--", path, cwd=clone, env=index)
    _check(listed, label, f"git ls-files of {path}")
    mode, blob = listed.stdout.decode().split(" ")[:2]
    if mode not in _MODES:
        kind = "a symbolic link" if mode == "120000" else "a submodule" if mode == "160000" else f"mode {mode}"
        raise BadRow(label, f"test_patch makes {path} {kind}, which a task's tests/ folder cannot hold")
    if "/" not in path and path.endswith(".sh"):
        raise BadRow(label, f"test_patch changes {path}, which in tests/ would be read as a test script")
    content = git.run("cat-file", "blob", blob, cwd=clone)
    _check(content, label, f"git cat-file of {path}")
    return path, content.stdout, _MODES[mode]


def _check(done: subprocess.CompletedProcess, label: str, what: str) -> None:
    if done.returncode != 0:
        raise BadRow(label, f"{what} failed: {_last_line(done.stderr)}")


def _last_line(stderr: bytes) -> str:
    return gitrepo.git_message(stderr.decode("utf-8", "replace"))


# SWE-bench's NON_TEST_EXTS: a test patch's files with these endings are data, not tests to run
# (its "csv" has no dot, so it is kept so).
NON_TEST_ENDINGS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")


def test_directives(repo: str, paths: list[str]) -> list[str]:
    """What the test command is given (SWE-bench's ``get_test_directives``): the test patch's files but
    data files; for Django, as module paths (``tests/admin_views/tests.py`` -> ``admin_views.tests``),
    which its ``runtests.py`` takes."""
    directives = [path for path in paths if not path.endswith(NON_TEST_ENDINGS)]
    if repo.lower() != "django/django":
        return directives
    modules = []
    for path in directives:
        path = path.removesuffix(".py")
        path = path.removeprefix("tests/")
        modules.append(path.replace("/", "."))
    return modules


def swebench_tests(instance: Instance, files: TestFiles, recipe: recipes.Recipe, options: Options) -> dict:
    """workspace.yaml's ``swebench`` mapping of a row (tasks/swebench.py reads it). A SWE-bench
    5.0 row's ``eval_script`` is its test command unless --test-cmd says otherwise, and its
    ``log_parser`` its parser; ``eval_type`` is kept."""
    if instance.eval_script is not None and options.test_cmd is None:
        run = {"eval_script": instance.eval_script}
    else:
        run = {
            "test_cmd": recipe.test_cmd,
            "test_files": test_directives(instance.repo, [path for path, _data, _mode in files.changed]),
        }
    parser = (
        swebench_logs.LOG_PARSERS[instance.log_parser]
        if instance.log_parser
        else swebench_logs.parser_for_repo(instance.repo)
    )
    return {
        **run,
        "parser": parser,
        "fail_to_pass": list(instance.fail_to_pass),
        "pass_to_pass": list(instance.pass_to_pass),
        **({"deleted_files": list(files.deleted)} if files.deleted else {}),
        **({"eval_type": instance.eval_type} if instance.eval_type else {}),
    }


def workspace_yaml(
    instance: Instance, url: str, options: Options, recipe: recipes.Recipe, swebench: dict | None = None
) -> str:
    """The task's workspace.yaml; with --image-template no repo: the image's /testbed is the workspace."""
    environment = recipes.environment_for(instance, recipe, options)
    in_image = recipes.row_image(instance, options) is not None
    workspace = {} if in_image else {"repo": url, "base_commit": instance.base_commit}
    if instance.version:
        workspace["version"] = instance.version
    if instance.language:
        workspace["language"] = instance.language
    workspace["install"] = recipe.install
    if recipe.env:
        workspace["env"] = recipe.env
    if environment:
        workspace["environment"] = environment
    if swebench is not None:
        workspace["grader"] = "swebench"
        workspace["swebench"] = swebench
    elif is_forge(instance):  # SWE-Forge's FAIL_TO_PASS / PASS_TO_PASS are test commands, not ids
        workspace["fail_to_pass"] = list(instance.fail_to_pass)
        workspace["pass_to_pass"] = list(instance.pass_to_pass)
    if instance.difficulty is not None:  # SWE-Forge's and SWE-bench Verified's, kept in task_metadata
        workspace["difficulty"] = instance.difficulty
    if instance.difficulty_score is not None:
        workspace["difficulty_score"] = instance.difficulty_score
    workspace["patch"] = instance.patch  # the gold patch: verify_tasks' reference solution, never the agent's
    return yaml.safe_dump(workspace, sort_keys=False, allow_unicode=True, width=1 << 20)


def is_forge(instance: Instance) -> bool:
    """A SWE-Forge row (SPEC §19, §22): its FAIL_TO_PASS entries are shell commands (``pytest tests/x.py``)
    that the task runs, not test ids; decided from the entries alone (rows.py, testids.py), never from
    the row's other fields (SWE-bench Verified's rows carry ``difficulty`` too)."""
    return instance.forge


def build_task(instance: Instance, files: TestFiles, url: str, options: Options, out: Path) -> Built:
    """Write DIR/<id>/ and DIR/<id>.tar.gz whole, replacing an earlier import of the same id."""
    label = instance.instance_id
    if len(instance.problem_statement.encode()) > MAX_INSTRUCTION_BYTES:
        raise BadRow(
            label, f"problem_statement is over {MAX_INSTRUCTION_BYTES} bytes, more than an agent's --instruction holds"
        )
    recipe = recipes.recipe_for(instance, options)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{label}.", suffix=".tmp") as scratch:
        folder = Path(scratch) / label
        tests = folder / "tests"
        tests.mkdir(parents=True)
        graded = None if is_forge(instance) else swebench_tests(instance, files, recipe, options)
        workspace = workspace_yaml(instance, url, options, recipe, graded)
        (folder / "workspace.yaml").write_text(workspace, encoding="utf-8")
        (folder / "prompt.md").write_text(instance.problem_statement, encoding="utf-8")
        for path, data, mode in files.changed:
            target = tests / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
        try:
            load_task(folder, allow_file_urls=True)
        except TaskError as exc:
            raise BadRow(label, f"the task would be invalid: {exc}") from None
        archive = Path(scratch) / f"{label}.tar.gz"
        pack_folder(folder, archive)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        replace_folder(folder, out / label)
        os.replace(archive, out / f"{label}.tar.gz")
    return Built(label, label, f"{label}.tar.gz", digest, url)


def replace_folder(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``; an earlier folder there is moved aside first, then deleted."""
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old.tmp")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
