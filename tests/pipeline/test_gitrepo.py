"""clone_at and repo_patch against real repositories, over file:// and dumb HTTP."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluations.pipeline import gitrepo
from evaluations.pipeline.gitrepo import GitError, clone_at, git_env
from evaluations.pipeline.patch import keep_base_objects, read_base, repo_patch
from tests.helpers.gitrepos import (
    FORGE_BASE_TREE,
    GIT_TEST_ENV,
    RunResult,
    git,
    make_bare,
    make_repo,
    serve_dumb_http,
    subprocess_runner,
)

BINARY_BASE = bytes(range(256)) * 4
BINARY_NEW = b"\x00\x01PNG\x00" + bytes(range(255, -1, -1)) * 8


@dataclasses.dataclass
class History:
    src: Path
    initial: str
    base: str
    fix: str
    feature: str
    fix_blob: str
    file_url: str
    http_url: str
    http_loose_url: str


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory):
    """initial -> base (tag v1.0, branch release-1) -> fix (main, tag v2.0) -> feature (branch)."""
    root = tmp_path_factory.mktemp("remote")
    src = root / "src"
    initial, base, fix, feature = make_repo(
        src,
        [
            {"app.py": "VERSION = 0\n", "README": "readme\n", ":message": "initial"},
            {
                "app.py": "VERSION = 1\n",
                "tool.sh": "echo tool\n",
                ".gitignore": "*.log\n",
                "lib/util.py": "def util():\n    return 1\n",
                ":message": "base",
                ":tag": "v1.0",
            },
            {"app.py": "VERSION = 2  # THE FIX\n", ":message": "the fix", ":tag": "v2.0"},
            {":branch": "feature", "secret.txt": "future feature\n", ":message": "feature work"},
        ],
    )
    git(src, "checkout", "--quiet", "main")
    git(src, "branch", "release-1", base)
    git(src, "tag", "light-fix", fix)
    fix_blob = git(src, "rev-parse", f"{fix}:app.py")
    bare = make_bare(src, root / "served" / "repo.git")
    make_bare(src, root / "served" / "loose.git", loose=True)
    with serve_dumb_http(root / "served") as server:
        yield History(
            src=src,
            initial=initial,
            base=base,
            fix=fix,
            feature=feature,
            fix_blob=fix_blob,
            file_url=bare.as_uri(),
            http_url=f"{server.url}/repo.git",
            http_loose_url=f"{server.url}/loose.git",
        )


def _env(tmp_path: Path, allow: str = "http:https:file") -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    return git_env(home, allow)


def _clone(history: History, tmp_path: Path, base_commit: str | None = None, *, via: str = "file") -> Path:
    dest = tmp_path / "session" / "repo"
    url = {"file": history.file_url, "http": history.http_url, "http-loose": history.http_loose_url}[via]
    sha = clone_at(
        subprocess_runner,
        repo_url=url,
        base_commit=base_commit or history.base,
        dest=dest,
        env=_env(tmp_path),
        timeout_secs=60,
    )
    assert sha == history.base
    return dest


def _never_run(argv, **kwargs):
    raise AssertionError(f"git must not run: {argv}")


# --- clone_at: checkout ----------------------------------------------------


@pytest.mark.parametrize("via", ["file", "http", "http-loose"])
def test_clone_checks_out_base_detached(history, tmp_path, via):
    dest = _clone(history, tmp_path, via=via)

    assert (dest / "app.py").read_text() == "VERSION = 1\n"
    assert not (dest / "secret.txt").exists()
    assert git(dest, "rev-parse", "HEAD") == history.base
    assert git(dest, "symbolic-ref", "-q", "HEAD", check=False) == ""
    assert git(dest, "status", "--porcelain") == ""
    assert sorted(p.name for p in dest.parent.iterdir()) == ["repo"], "scratch clone left behind"


@pytest.mark.parametrize("form", ["sha", "short sha", "branch", "tag", "expression"])
def test_base_commit_forms(history, tmp_path, form):
    base_commit = {
        "sha": history.base,
        "short sha": history.base[:8],
        "branch": "release-1",
        "tag": "v1.0",
        "expression": "main~1",
    }[form]
    dest = _clone(history, tmp_path, base_commit)
    assert (dest / "app.py").read_text() == "VERSION = 1\n"


@pytest.mark.parametrize("via", ["file", "http"])
@pytest.mark.parametrize("missing", ["0123456789abcdef0123456789abcdef01234567", "no-such-branch"])
def test_missing_commit_names_it(history, tmp_path, via, missing):
    url = history.file_url if via == "file" else history.http_url
    with pytest.raises(GitError) as excinfo:
        clone_at(
            subprocess_runner,
            repo_url=url,
            base_commit=missing,
            dest=tmp_path / "repo",
            env=_env(tmp_path),
            timeout_secs=60,
        )
    assert str(excinfo.value) == f"base_commit {missing} not found in {url}"
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


# --- clone_at: the future is hidden ----------------------------------------


@pytest.mark.parametrize("via", ["file", "http"])
def test_a_base_at_the_tip_with_a_dangling_future_in_the_pack_keeps_no_future(tmp_path, via):
    """The repack is skipped only when the clone stores exactly what the base reaches: a dumb
    HTTP server hands over its whole pack, whatever the refs, so a dangling object comes too."""
    src = tmp_path / "src"
    (base,) = make_repo(src, [{"app.py": "VERSION = 1\n", ":message": "base"}])
    (src / "app.py").write_text("VERSION = 2  # THE FIX\n")
    git(src, "add", "app.py")
    future_tree = git(src, "write-tree")
    future = git(src, "commit-tree", future_tree, "-p", base, "-m", "the fix, never referenced")
    served = tmp_path / "served" / "repo.git"
    make_bare(src, served)
    # Put the dangling commit (and its tree and blob) into the served repository's only pack.
    objects = f"{future}\n{future_tree}\n{git(src, 'rev-parse', future + ':app.py')}\n"
    pack = subprocess.run(
        ["git", "pack-objects", "--quiet", str(served / "objects" / "pack" / "pack")],
        cwd=src,
        input=objects,
        text=True,
        check=True,
        capture_output=True,
    )
    assert pack.stdout.strip()
    git(served, "repack", "-a", "-d", "--keep-unreachable", "--quiet")
    assert git(served, "cat-file", "-t", future) == "commit"
    with serve_dumb_http(tmp_path / "served") as server:
        url = served.as_uri() if via == "file" else f"{server.url}/repo.git"
        dest = tmp_path / "session" / "repo"
        clone_at(subprocess_runner, repo_url=url, base_commit=base, dest=dest, env=_env(tmp_path), timeout_secs=60)
    stored = set(git(dest, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split())
    reachable = set(line.split()[0] for line in git(dest, "rev-list", "--objects", base).splitlines())
    assert stored == reachable
    assert future not in stored


@pytest.mark.parametrize("via", ["file", "http", "http-loose"])
def test_future_is_unreachable(history, tmp_path, via):
    dest = _clone(history, tmp_path, via=via)
    past = [history.base, history.initial]

    assert git(dest, "rev-list", "--all").split() == past
    assert git(dest, "rev-list", "--all", "--reflog").split() == past
    assert [line.split()[0] for line in git(dest, "log", "--all", "--format=%H").splitlines()] == past
    for future in (history.fix, history.feature, history.fix_blob):
        assert subprocess.run(["git", "cat-file", "-e", future], cwd=dest).returncode != 0
    # The base's own tag stays (SPEC §19), the fix's tags (v2.0, light-fix) do not.
    v1 = git(history.src, "rev-parse", "v1.0")
    assert git(dest, "for-each-ref") == f"{v1} tag\trefs/tags/v1.0"
    assert git(dest, "tag") == "v1.0"
    assert git(dest, "remote") == ""
    assert git(dest, "branch", "--all") == "* (no branch)"
    assert git(dest, "reflog", "--all", check=False) == ""
    assert git(dest, "fsck", "--unreachable", "--dangling", "--no-progress") == ""
    # Every object stored is reachable from base, or is the tag object of v1.0.
    stored = set(git(dest, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split())
    reachable = set(line.split()[0] for line in git(dest, "rev-list", "--objects", history.base).splitlines())
    assert stored == reachable | {v1}
    git_dir = dest / ".git"
    for leftover in ("FETCH_HEAD", "ORIG_HEAD", "logs", "hooks", "shallow"):
        assert not (git_dir / leftover).exists(), leftover
    assert (git_dir / "packed-refs").read_text() == f"{v1} refs/tags/v1.0\n"
    config = (git_dir / "config").read_text()
    assert "remote" not in config and "url" not in config
    assert history.fix not in "".join(p.read_text(errors="replace") for p in git_dir.rglob("*") if p.is_file())


# --- clone_at: refusals and hardening --------------------------------------


@pytest.mark.parametrize("base_commit", ["-u", "--upload-pack=touch /tmp/x", "main\n", "a b", "", "x\x00y"])
def test_option_like_base_commit_refused_before_git(tmp_path, base_commit):
    with pytest.raises(GitError, match="base_commit"):
        clone_at(
            _never_run,
            repo_url="https://example.com/r.git",
            base_commit=base_commit,
            dest=tmp_path / "repo",
            env=_env(tmp_path),
            timeout_secs=5,
        )


@pytest.mark.parametrize(
    "repo_url",
    [
        "-u",
        "--upload-pack=touch /tmp/x",
        "https://example.com/a b",
        "ext::sh",
        "fd::3",
        "ext::http://example.com/",
        "/srv/repos/local.git",
        "example.com:repo.git",
        "",
    ],
)
def test_option_like_repo_refused_before_git(tmp_path, repo_url):
    with pytest.raises(GitError, match="repo"):
        clone_at(
            _never_run,
            repo_url=repo_url,
            base_commit="main",
            dest=tmp_path / "repo",
            env=_env(tmp_path),
            timeout_secs=5,
        )


def test_ext_transport_refused_by_git_itself(tmp_path, monkeypatch):
    """With the pre-check bypassed, GIT_ALLOW_PROTOCOL alone stops ext::."""
    marker = tmp_path / "pwned"
    url = f"ext::sh -c touch% {marker}"
    monkeypatch.setattr(gitrepo, "check_repo_url", lambda url: None)

    with pytest.raises(GitError, match="git clone of ext::"):
        clone_at(
            subprocess_runner,
            repo_url=url,
            base_commit="main",
            dest=tmp_path / "repo",
            env=_env(tmp_path, "http:https"),
            timeout_secs=30,
        )
    assert not marker.exists()

    # Control: the same URL does run its command when ext is allowed, so the
    # refusal above is git's protocol guard, not a malformed URL.
    with pytest.raises(GitError):
        clone_at(
            subprocess_runner,
            repo_url=url,
            base_commit="main",
            dest=tmp_path / "repo2",
            env=_env(tmp_path, "ext"),
            timeout_secs=30,
        )
    assert marker.exists()


def test_file_protocol_refused_unless_allowed(history, tmp_path):
    url = history.file_url
    with pytest.raises(GitError, match=r"^git clone of .* failed: .*transport 'file' not allowed"):
        clone_at(
            subprocess_runner,
            repo_url=url,
            base_commit=history.base,
            dest=tmp_path / "repo",
            env=_env(tmp_path, "http:https"),
            timeout_secs=30,
        )


def test_template_hooks_are_not_run(history, tmp_path):
    marker = tmp_path / "hook-ran"
    hooks = tmp_path / "template" / "hooks"
    hooks.mkdir(parents=True)
    for name in ("post-checkout", "reference-transaction", "post-index-change"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        hook.chmod(0o755)
    env = {**_env(tmp_path), "GIT_TEMPLATE_DIR": str(tmp_path / "template")}

    dest = tmp_path / "repo"
    clone_at(
        subprocess_runner,
        repo_url=history.file_url,
        base_commit=history.base,
        dest=dest,
        env=env,
        timeout_secs=60,
    )
    assert not marker.exists()
    assert not (dest / ".git" / "hooks").exists()


def test_dest_must_be_empty(history, tmp_path):
    dest = tmp_path / "repo"
    dest.mkdir()
    (dest / "something").write_text("x")
    with pytest.raises(GitError, match="not an empty folder"):
        clone_at(
            _never_run,
            repo_url=history.file_url,
            base_commit=history.base,
            dest=dest,
            env=_env(tmp_path),
            timeout_secs=5,
        )


def test_clone_failure_hides_credentials(tmp_path):
    url = "http://user:s3cret-token@127.0.0.1:1/repo.git"
    with pytest.raises(GitError) as excinfo:
        clone_at(
            subprocess_runner,
            repo_url=url,
            base_commit="main",
            dest=tmp_path / "repo",
            env=_env(tmp_path),
            timeout_secs=30,
        )
    message = str(excinfo.value)
    assert message.startswith("git clone of http://***@127.0.0.1:1/repo.git failed: ")
    assert "s3cret" not in message


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (RunResult(None, "Cloning...", timed_out=True), "git clone of https://example.com/r.git timed out after 120 s"),
        (
            RunResult(None, "", limit_detail="memory limit exceeded (5000 MiB > 4096 MiB)"),
            "git clone of https://example.com/r.git was stopped: memory limit exceeded (5000 MiB > 4096 MiB)",
        ),
        (
            RunResult(128, "Cloning into bare repository...\nfatal: repository 'x' not found\n"),
            "git clone of https://example.com/r.git failed: repository 'x' not found",
        ),
    ],
)
def test_runner_failures_become_sentences(tmp_path, result, message):
    calls = []

    def runner(argv, *, cwd, env, timeout_secs):
        calls.append((argv, timeout_secs))
        return result

    with pytest.raises(GitError) as excinfo:
        clone_at(
            runner,
            repo_url="https://example.com/r.git",
            base_commit="main",
            dest=tmp_path / "repo",
            env=_env(tmp_path),
            timeout_secs=120,
        )
    assert str(excinfo.value) == message
    ((argv, timeout),) = calls  # the whole clone is one command (one sandbox)
    assert 119 < timeout <= 120
    assert argv[:2] == ["sh", "-c"] and "core.hooksPath=/dev/null" in argv[2]
    assert argv[3:] == ["sh", "https://example.com/r.git", "main", "resolve", ""]  # data, never script text
    assert not (tmp_path / "repo" / ".git").exists(), "failed clone left behind"


def test_resolve_pin_is_where_git_connects(history, tmp_path):
    """git.invalid never resolves: the clone works only through the pin."""
    port = history.http_url.split(":")[2].split("/")[0]
    url = f"http://git.invalid:{port}/repo.git"
    sha = clone_at(
        subprocess_runner,
        repo_url=url,
        base_commit="v1.0",
        dest=tmp_path / "repo",
        env=_env(tmp_path),
        timeout_secs=60,
        resolve_pin=f"git.invalid:{port}:127.0.0.1",
    )
    assert sha == history.base
    with pytest.raises(GitError, match="^git clone of http://git.invalid"):
        clone_at(
            subprocess_runner,
            repo_url=url,
            base_commit="v1.0",
            dest=tmp_path / "repo2",
            env=_env(tmp_path),
            timeout_secs=60,
        )


def test_git_env_is_clean(tmp_path):
    env = git_env(tmp_path, "http:https")
    assert env["HOME"] == str(tmp_path)
    assert env["GIT_ALLOW_PROTOCOL"] == "http:https"
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert "SSH_ASKPASS" not in env
    assert not set(env) & {"USER", "PWD", "PYTHONPATH", "DJANGO_SETTINGS_MODULE", "SECRET_KEY"}
    with pytest.raises(ValueError):
        git_env(tmp_path, "http https")


# --- repo_patch --------------------------------------------------------------


@pytest.fixture
def worked_repo(history, tmp_path):
    """A clone at base, then the agent's work: every kind of change."""
    dest = _clone(history, tmp_path)
    (dest / "app.py").write_text("VERSION = 1\nFIXED = True\n")
    (dest / "README").unlink()
    (dest / "new" / "pkg").mkdir(parents=True)
    (dest / "new" / "pkg" / "module.py").write_text("def new():\n    return 'new'\n")
    (dest / "image.png").write_bytes(BINARY_NEW)
    (dest / "tool.sh").chmod(0o755)
    (dest / "link").symlink_to("app.py")
    (dest / "debug.log").write_text("ignored by base .gitignore\n")
    (dest / "static" / "corpus").mkdir(parents=True)
    (dest / "static" / "corpus" / "big.txt").write_text("asset\n")
    (dest / "spec[v1].yaml").write_text("asset with glob characters\n")
    (dest / "lib" / "util.py").write_text("asset overwriting a tracked file\n")
    return dest


EXCLUDED = ["static/corpus", "spec[v1].yaml", "lib/util.py"]


def _kept(repo: Path) -> Path:
    """The base's objects as keep_base_objects copies them at clone time (once per repository)."""
    kept = repo.parent / f"{repo.name}-base-objects"
    if not kept.exists():
        keep_base_objects(repo, kept)
    return kept


def _patch(repo: Path, base: str, tmp_path: Path, **kwargs) -> str:
    return repo_patch(
        subprocess_runner, repo=repo, base_sha=base, base_objects=_kept(repo), env=_env(tmp_path), exclude=EXCLUDED,
        **kwargs,
    )  # fmt: skip


def _files(patch: str) -> list[str]:
    """The paths of ``diff --git a/<path> b/<path>`` lines (no renames: both halves are equal)."""
    pairs = [line.removeprefix("diff --git a/") for line in patch.splitlines() if line.startswith("diff --git a/")]
    return sorted(pair[: (len(pair) - 3) // 2] for pair in pairs)


def test_patch_holds_every_kind_of_change(history, worked_repo, tmp_path):
    patch = _patch(worked_repo, history.base, tmp_path)

    assert _files(patch) == ["README", "app.py", "image.png", "link", "new/pkg/module.py", "tool.sh"]
    assert "+FIXED = True" in patch
    assert "deleted file mode 100644" in patch
    assert "new file mode 100644" in patch
    assert "old mode 100644\nnew mode 100755" in patch
    assert "GIT binary patch" in patch
    assert "new file mode 120000" in patch
    assert "debug.log" not in patch and "asset" not in patch


def test_patch_applies_to_a_fresh_base_checkout(history, worked_repo, tmp_path):
    patch = _patch(worked_repo, history.base, tmp_path)
    fresh = tmp_path / "fresh"
    clone_at(
        subprocess_runner,
        repo_url=history.file_url,
        base_commit=history.base,
        dest=fresh,
        env=_env(tmp_path),
        timeout_secs=60,
    )
    (tmp_path / "agent.patch").write_text(patch)
    git(fresh, "apply", "--check", str(tmp_path / "agent.patch"))
    git(fresh, "apply", str(tmp_path / "agent.patch"))

    assert (fresh / "image.png").read_bytes() == BINARY_NEW
    assert (fresh / "app.py").read_text() == "VERSION = 1\nFIXED = True\n"
    assert (fresh / "new" / "pkg" / "module.py").read_text() == "def new():\n    return 'new'\n"
    assert not (fresh / "README").exists()
    assert os.access(fresh / "tool.sh", os.X_OK)
    assert os.readlink(fresh / "link") == "app.py"
    assert (fresh / "lib" / "util.py").read_text() == "def util():\n    return 1\n"


def test_patch_of_modified_binary_and_agent_commits(history, tmp_path):
    """Agent commits on top of base still diff against base; binary edits round-trip."""
    dest = _clone(history, tmp_path)
    (dest / "data.bin").write_bytes(BINARY_BASE)
    git(dest, "add", "data.bin")
    git(dest, "commit", "--quiet", "-m", "agent commit")
    (dest / "data.bin").write_bytes(BINARY_BASE[::-1])
    git(dest, "add", "data.bin")

    patch = repo_patch(
        subprocess_runner, repo=dest, base_sha=history.base, base_objects=_kept(dest), env=_env(tmp_path), exclude=[]
    )
    assert _files(patch) == ["data.bin"]
    fresh = _clone(history, tmp_path / "other")
    (tmp_path / "p.patch").write_text(patch)
    git(fresh, "apply", str(tmp_path / "p.patch"))
    assert (fresh / "data.bin").read_bytes() == BINARY_BASE[::-1]


def test_patch_is_empty_without_changes(history, tmp_path):
    dest = _clone(history, tmp_path)
    assert _patch(dest, history.base, tmp_path) == ""


def test_patch_in_a_path_with_a_colon(history, tmp_path):
    dest = _clone(history, tmp_path / "odd:dir")
    (dest / "app.py").write_text("changed\n")
    assert _files(_patch(dest, history.base, tmp_path)) == ["app.py"]


def test_patch_leaves_the_agents_git_alone(history, worked_repo, tmp_path):
    """Config, hooks and excludes the agent planted in .git are not used."""
    marker = tmp_path / "agent-config-ran"
    git_dir = worked_repo / ".git"
    git(worked_repo, "add", "app.py")  # the agent's own index, staged
    with (git_dir / "config").open("a") as config:
        config.write(
            f'[core]\n\tfsmonitor = "touch {marker}.fsmonitor"\n'
            f'[filter "evil"]\n\tclean = "touch {marker}.filter; cat"\n\trequired = true\n'
            f'[diff]\n\texternal = "touch {marker}.diff"\n'
        )
    (worked_repo / ".gitattributes").write_text("* filter=evil\n")
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "exclude").write_text("new/\n")
    index_before = (git_dir / "index").read_bytes()
    objects_before = sorted(p.name for p in (git_dir / "objects").rglob("*"))

    patch = _patch(worked_repo, history.base, tmp_path)

    assert not list(tmp_path.glob("agent-config-ran*"))
    assert "new/pkg/module.py" in _files(patch)
    assert (git_dir / "index").read_bytes() == index_before
    assert sorted(p.name for p in (git_dir / "objects").rglob("*")) == objects_before
    assert not list(worked_repo.parent.glob(".agent-patch-*"))
    # Control: git run the ordinary way would have run the agent's filter.
    git(worked_repo, "add", "--all", check=False)
    assert list(tmp_path.glob("agent-config-ran*"))


def test_patch_ignore_rules_come_from_the_base_tree_only(history, tmp_path):
    """A .gitignore the agent adds or edits, its repository's info/exclude and a global excludes
    file in HOME hide nothing (issue 23); what the base's .gitignore ignores stays out."""
    dest = _clone(history, tmp_path)
    (dest / "conftest.py").write_text("import pytest\n")
    (dest / "hidden").mkdir()
    (dest / "hidden" / "x.py").write_text("x\n")
    (dest / "hidden" / ".gitignore").write_text("*\n")  # ignores itself too
    (dest / "pkg").mkdir()
    (dest / "pkg" / "__init__.py").write_text("shadow = True\n")
    (dest / ".gitignore").write_text("*.log\nhidden/\nconftest.py\n.gitignore\n")
    (dest / ".git" / "info").mkdir(exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text("pkg/\n")
    (dest / "debug.log").write_text("the base ignores *.log\n")
    env = _env(tmp_path)
    global_ignore = Path(env["HOME"]) / ".config" / "git" / "ignore"
    global_ignore.parent.mkdir(parents=True)
    global_ignore.write_text("*.py\n")
    patch = _patch(dest, history.base, tmp_path)
    assert _files(patch) == [".gitignore", "conftest.py", "hidden/.gitignore", "hidden/x.py", "pkg/__init__.py"]
    assert "+hidden/" in patch and "+import pytest" in patch


def _rules_repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose base has .gitignore and .gitattributes files at several depths."""
    repo = tmp_path / "rules"
    (base,) = make_repo(
        repo,
        [
            {
                "tracked.log": "tracked despite the rule\n",  # added before the rule that ignores it
                ".gitignore": "*.log\n!keep.log\n/build/\ndocs/*.tmp\n# comment\n\n  \ntrailing.txt   \n",
                "sub/.gitignore": "*.o\n!important.o\n/local.txt\ndeep/x?.txt\n**/gen/\n",
                "sub/a b/.gitignore": "*\n!*.py\n!.gitignore\n",
                "sub/[x]/.gitignore": "*.c\n",
                ".gitattributes": "*.dat -diff\n",
                "sub/.gitattributes": '*.bin binary\n"q x/*.txt" -diff\n',
                "README": "readme\n",
            }
        ],
    )
    return repo, base


_RULES_WORK = [
    "a.log", "keep.log", "tracked.log", "build/out.txt", "sub/build/out.txt", "docs/x.tmp", "docs/d/x.tmp",
    "trailing.txt", "sub/m.o", "sub/important.o", "sub/n/m.o", "m.o", "sub/local.txt", "sub/n/local.txt",
    "local.txt", "sub/deep/x1.txt", "sub/n/deep/x1.txt", "sub/gen/g.txt", "sub/n/gen/g.txt", "gen/g.txt",
    "sub/a b/f.txt", "sub/a b/f.py", "sub/[x]/c.c", "sub/[x]/c.h", "sub/x/c.c", "a.dat", "sub/b.bin",
    "sub/q x/t.txt", "plain.txt",
]  # fmt: skip


def test_patch_base_rules_in_subfolders_match_git_add_all(tmp_path):
    """The base's rules, read from its tree, select exactly what `git add --all` selects with them
    in the work tree: patterns anchored to their folder, negations, deeper files winning."""
    repo, base = _rules_repo(tmp_path)
    for name in _RULES_WORK:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(f"{name}\n")
    git(repo, "add", "--all")
    expected = sorted(git(repo, "diff", "--cached", "--name-only", "--no-renames", base).splitlines())
    git(repo, "reset", "--quiet")
    patch = repo_patch(
        subprocess_runner, repo=repo, base_sha=base, base_objects=_kept(repo), env=_env(tmp_path), exclude=[]
    )
    assert _files(patch) == expected
    assert "sub/m.o" not in expected and "sub/important.o" in expected  # the rules did bite


def test_a_base_read_before_the_agent_changed_the_work_tree_makes_the_same_patch(tmp_path):
    """read_base runs while the agent runs (steps.running_agent): it reads only the kept objects,
    so the patch made with it is the one made after the agent's end, the base's rules included;
    its scratch folder goes with the patch."""
    repo, base_sha = _rules_repo(tmp_path)
    env = _env(tmp_path)
    ahead = read_base(subprocess_runner, repo=repo, base_sha=base_sha, base_objects=_kept(repo), env=env)
    assert ahead.scratch.is_dir() and ahead.scratch.parent == repo.parent
    for name in _RULES_WORK:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(f"{name}\n")
    (repo / "README").write_text("changed\n")
    (repo / ".gitignore").write_text("*\n")  # the agent's edit of a rule file hides nothing
    kwargs = {"repo": repo, "base_sha": base_sha, "base_objects": _kept(repo), "env": env, "exclude": []}
    with_ahead = repo_patch(subprocess_runner, base=ahead, **kwargs)
    assert not ahead.scratch.exists()
    assert with_ahead == repo_patch(subprocess_runner, **kwargs)
    assert "+changed" in with_ahead and "+*" in with_ahead and "keep.log" in with_ahead and "a.log" not in with_ahead
    assert not list(repo.parent.glob(".agent-patch-*"))


def test_a_base_read_for_another_commit_is_not_used(history, tmp_path):
    dest = _clone(history, tmp_path)
    env = _env(tmp_path)
    other = read_base(subprocess_runner, repo=dest, base_sha=history.initial, base_objects=_kept(dest), env=env)
    (dest / "README").write_text("changed\n")
    patch = repo_patch(
        subprocess_runner, repo=dest, base_sha=history.base, base_objects=_kept(dest), env=env, exclude=[], base=other
    )
    assert patch == repo_patch(
        subprocess_runner, repo=dest, base_sha=history.base, base_objects=_kept(dest), env=env, exclude=[]
    )
    assert not other.scratch.exists() and not list(dest.parent.glob(".agent-patch-*"))


def test_read_base_refuses_a_bad_sha_and_leaves_no_scratch(history, tmp_path):
    dest = _clone(history, tmp_path)
    with pytest.raises(GitError, match="is not a sha"):
        read_base(subprocess_runner, repo=dest, base_sha="HEAD", base_objects=_kept(dest), env=_env(tmp_path))
    with pytest.raises(GitError, match="git read-tree of the base commit failed"):
        read_base(subprocess_runner, repo=dest, base_sha="0" * 40, base_objects=_kept(dest), env=_env(tmp_path))
    assert not list(dest.parent.glob(".agent-patch-*"))


def test_patch_attributes_come_from_the_base_tree_only(tmp_path):
    """A .gitattributes the agent writes (-diff, binary, filter, eol, encoding) changes nothing in
    the patch; the base's own attributes still apply."""
    repo, base = _rules_repo(tmp_path)
    (repo / "conftest.py").write_text("import pytest\n")
    (repo / "a.dat").write_text("data\n")
    (repo / "sub" / "q x").mkdir(parents=True)
    (repo / "sub" / "q x" / "t.txt").write_text("quoted\n")
    (repo / ".gitattributes").write_text(
        "conftest.py -diff\n* filter=hide ident working-tree-encoding=UTF-16 eol=crlf\n*.dat diff\n"
    )
    git(repo, "config", "filter.hide.clean", "true")  # the agent's own config: never read
    env = _env(tmp_path)
    (Path(env["HOME"]) / ".config" / "git").mkdir(parents=True, exist_ok=True)
    (Path(env["HOME"]) / ".config" / "git" / "attributes").write_text("* -diff\n")
    patch = repo_patch(subprocess_runner, repo=repo, base_sha=base, base_objects=_kept(repo), env=env, exclude=[])
    assert "+import pytest" in patch  # text, as it is on disk
    assert "Binary files" not in patch.split("b/conftest.py", 1)[1].split("diff --git", 1)[0]
    dat = patch.split("b/a.dat", 1)[1].split("diff --git", 1)[0]
    assert "GIT binary patch" in dat  # the base says *.dat -diff
    quoted = patch.split("b/sub/q x/t.txt", 1)[1].split("diff --git", 1)[0]
    assert "GIT binary patch" in quoted  # a quoted pattern of a subfolder's file, anchored there


def test_patch_shows_the_files_of_repositories_the_agent_made_as_plain_files(history, tmp_path):
    """A folder with a .git of its own (committed, empty, a .git file, or where a tracked file was)
    is no gitlink: its files
    are in the patch, its .git is not, and the base's rules still apply inside it. Names git
    refuses (a .git in any case, a link named .gitmodules) are left out, never fail the patch."""
    dest = _clone(history, tmp_path)
    committed, empty, linked = dest / "committed", dest / "lib" / "empty", dest / "linked"
    for folder in (committed, empty, linked):
        folder.mkdir(parents=True, exist_ok=True)
    (committed / "a.py").write_text("a\n")
    (committed / "debug.log").write_text("the base ignores *.log, here too\n")
    git(committed, "init", "--quiet")
    git(committed, "add", "a.py", "debug.log")
    git(committed, "commit", "--quiet", "-m", "hidden")
    (committed / "inner").mkdir()
    git(committed / "inner", "init", "--quiet")
    (committed / "inner" / "deeper.py").write_text("deeper\n")
    git(empty, "init", "--quiet")
    (empty / "b.py").write_text("b\n")
    (dest / "lib" / "util.py").write_text("tracked, in a folder that is now a repository\n")
    (linked / ".git").write_text("gitdir: ../.git\n")
    (linked / "c.py").write_text("c\n")
    (linked / ".GIT").mkdir()
    (linked / ".GIT" / "d.py").write_text("git cannot store this\n")
    (dest / "odd\\name.py").write_text("a backslash: refused by git only with core.protectNTFS\n")
    (dest / "top.GIT").mkdir()
    (dest / "top.GIT" / "e.py").write_text("not a .git: stored\n")
    (linked / ".gitmodules").symlink_to("c.py")
    (dest / "tool.sh").unlink()  # a tracked file becomes a repository with a commit
    (dest / "tool.sh").mkdir()
    (dest / "tool.sh" / "inner.sh").write_text("inner\n")
    git(dest / "tool.sh", "init", "--quiet")
    git(dest / "tool.sh", "add", "inner.sh")
    git(dest / "tool.sh", "commit", "--quiet", "-m", "hidden")
    patch = _patch(dest, history.base, tmp_path)
    assert _files(patch) == [
        "committed/a.py", "committed/inner/deeper.py", "lib/empty/b.py", "linked/c.py", "tool.sh", "tool.sh/inner.sh",
        "top.GIT/e.py",
    ]  # fmt: skip
    assert "deleted file mode 100644" in patch.split("b/tool.sh\n", 1)[1].split("diff --git", 1)[0]
    assert 'diff --git "a/odd\\\\name.py" "b/odd\\\\name.py"' in patch  # git quotes the name
    assert "lib/util.py" not in patch  # an asset path (EXCLUDED), even inside the repository
    assert "Subproject commit" not in patch and "160000" not in patch


def _repository(folder: Path, *files: str) -> None:
    """``folder`` a repository of its own, ``files`` (written there) committed."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        (folder / name).write_text(f"{name}\n")
    git(folder, "init", "--quiet")
    if files:
        git(folder, "add", *files)
        git(folder, "commit", "--quiet", "-m", "hidden")


def _gitmodules_link(dest: Path) -> None:
    (dest / "c.py").write_text("c\n")
    (dest / ".gitmodules").symlink_to("c.py")


@pytest.mark.parametrize(
    "make, files",
    [
        (lambda dest: (dest / "tool.sh").unlink() or _repository(dest / "tool.sh", "inner.sh"), ["tool.sh", "tool.sh/inner.sh"]),
        (lambda dest: _repository(dest / "sub", "a.py"), ["sub/a.py"]),
        (lambda dest: _repository(dest / "sub"), []),  # an empty repository: nothing to store
        (lambda dest: (dest / "x" / ".GIT").mkdir(parents=True) or (dest / "x" / ".GIT" / "d.py").write_text("d\n"), []),
        (_gitmodules_link, ["c.py"]),
        (lambda dest: (dest / "lib2").mkdir() or (dest / "lib2" / ".gitmodules").write_text("[x]\n"), ["lib2/.gitmodules"]),
    ],
    ids=["tracked-file-made-a-repository", "new-repository", "empty-repository", "dot-GIT", "gitmodules-link", "gitmodules-file"],
)  # fmt: skip
def test_each_reason_to_list_the_new_files_alone_gives_the_listed_patch(history, tmp_path, make, files):
    """The list script's diff stands only when none of these is there (patch._needs_listing: the
    gitlinks and the new paths read in Python, or git refusing a name); each alone sends the patch
    through the listing, whose diff is made again from the base."""
    dest = _clone(history, tmp_path)
    make(dest)
    patch = _patch(dest, history.base, tmp_path)
    assert _files(patch) == files, patch
    assert "Subproject commit" not in patch and "160000" not in patch


def test_patch_reads_the_base_from_the_kept_objects_not_the_agents(tmp_path):
    """Objects the agent writes into its .git under the base's ids (a forged tree) hide nothing:
    on the agent's object store the change vanishes, on the kept copy it is there."""
    repo = tmp_path / "forged"
    (base,) = make_repo(repo, [{"calc.py": "X = 0\n", "pkg/util.py": "X = 1\n"}])
    git(repo, "repack", "-a", "-d", "-q")
    kept = _kept(repo)
    (repo / "pkg" / "util.py").write_text("X = 2  # HIDDEN\n")
    forger = FORGE_BASE_TREE + "\nforge('pkg/util.py')\n"
    forged = subprocess.run([sys.executable, "-c", forger], cwd=repo, env=GIT_TEST_ENV, capture_output=True, text=True)
    assert forged.stdout.startswith("forged"), forged.stderr
    agents = repo_patch(subprocess_runner, repo=repo, base_sha=base, base_objects=repo / ".git" / "objects",
                        env=_env(tmp_path), exclude=[])  # fmt: skip
    assert agents == ""  # the trick works on the agent's own objects
    patch = repo_patch(subprocess_runner, repo=repo, base_sha=base, base_objects=kept, env=_env(tmp_path), exclude=[])
    assert _files(patch) == ["pkg/util.py"] and "+X = 2  # HIDDEN" in patch


def test_patch_without_the_agents_git_dir_is_made_from_the_kept_objects(history, tmp_path):
    """The agent's .git is never read: replaced by a link, the patch is the same."""
    dest = _clone(history, tmp_path)
    kept = _kept(dest)
    import shutil

    shutil.rmtree(dest / ".git")
    (dest / ".git").symlink_to(tmp_path)
    (dest / "app.py").write_text("changed\n")
    assert _files(_patch(dest, history.base, tmp_path)) == ["app.py"]
    shutil.rmtree(kept)
    with pytest.raises(GitError, match=r"the base's objects .* are missing"):
        repo_patch(
            subprocess_runner, repo=dest, base_sha=history.base, base_objects=kept, env=_env(tmp_path), exclude=[]
        )


def test_patch_over_limit_fails(history, worked_repo, tmp_path):
    with pytest.raises(GitError, match=r"^agent patch is \d+ bytes, over the limit of 100 bytes$"):
        _patch(worked_repo, history.base, tmp_path, max_bytes=100)


@pytest.mark.parametrize("bad", ["../x", "/etc", "a/../../b", ""])
def test_patch_refuses_escaping_excludes(history, tmp_path, bad):
    dest = _clone(history, tmp_path)
    with pytest.raises(GitError, match="excluded path"):
        repo_patch(
            _never_run, repo=dest, base_sha=history.base, base_objects=_kept(dest), env=_env(tmp_path), exclude=[bad]
        )


# --- git as the sandbox uid, as the spawner runs it ---------------------------

SANDBOX_UID = 65534


@pytest.fixture
def sandbox_session():
    """A session laid out like session.py's: root-owned 0711 folders, repo/ and home/ owned by the sandbox uid."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run git as another uid")
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gitrepo-uid-"))  # /tmp/pytest-of-root is 0700
    try:
        os.chmod(base, 0o711)
        root = base / "session"
        root.mkdir(mode=0o711)
        for name in ("repo", "home"):
            (root / name).mkdir(mode=0o700)
            os.chown(root / name, SANDBOX_UID, SANDBOX_UID)
        yield root
    finally:
        shutil.rmtree(base)


def _as_sandbox_uid(argv, *, cwd, env, timeout_secs):
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout_secs,
        user=SANDBOX_UID,
        group=SANDBOX_UID,
        extra_groups=[],
    )
    return RunResult(proc.returncode, proc.stdout.decode("utf-8", "replace"))


def test_git_as_the_sandbox_uid(history, sandbox_session):
    repo, home = sandbox_session / "repo", sandbox_session / "home"
    env = git_env(home, "http:https")
    sha = clone_at(_as_sandbox_uid, repo_url=history.http_url, base_commit="v1.0", dest=repo, env=env, timeout_secs=60)
    assert sha == history.base
    keep_base_objects(repo, sandbox_session / "base-objects")  # root's, as the clone step keeps them
    not_theirs = [p for p in [repo, *repo.rglob("*")] if p.lstat().st_uid != SANDBOX_UID]
    assert not_theirs == [], "the agent could not change these"

    identity = {
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@x",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@x",
    }

    def agent(script: str) -> RunResult:
        result = _as_sandbox_uid(["sh", "-c", script], cwd=repo, env={**env, **identity}, timeout_secs=30)
        assert result.exit_code == 0, result.output
        return result

    agent("git checkout -q -b work && echo one > one.txt && git add one.txt && git commit -qm one && git tag t1")
    agent("echo two > two.txt && echo changed > app.py")

    agent("mkdir nested && cd nested && git init -q && echo three > three.txt")
    kept = sandbox_session / "base-objects"
    patch = repo_patch(_as_sandbox_uid, repo=repo, base_sha=sha, base_objects=kept, env=env, exclude=[])
    assert _files(patch) == ["app.py", "nested/three.txt", "one.txt", "two.txt"]
    assert sorted(p.name for p in sandbox_session.iterdir()) == ["base-objects", "home", "repo"]
