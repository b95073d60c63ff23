"""The repository mirror (SPEC §13): the evaluation's repository holds the base's past only,
though the mirror it is fetched from holds the whole future (every branch and tag)."""

from __future__ import annotations

import subprocess

import pytest

from evaluations.pipeline.gitrepo import GitError
from evaluations.pipeline.mirror import (
    NotInMirror,
    clone_from_mirror,
    names_a_commit_forever,
    resolve_in_mirror,
    update_mirror,
)
from tests.helpers.gitrepos import git, make_repo, subprocess_runner
from tests.pipeline.test_gitrepo import _env, history  # noqa: F401 (the module's fixture, reused)


@pytest.fixture
def mirror(history, tmp_path):  # noqa: F811
    """A mirror of the history over dumb HTTP: it holds the fix, the feature branch and every tag."""
    path = tmp_path / "cache" / "mirror"
    path.parent.mkdir()
    update_mirror(subprocess_runner, mirror=path, repo_url=history.http_url, env=_env(tmp_path), timeout_secs=60)
    for future in (history.fix, history.feature, history.fix_blob):
        assert subprocess.run(["git", "cat-file", "-e", future], cwd=path).returncode == 0
    return path


def _clone(mirror, tmp_path, base_commit):
    dest = tmp_path / "session" / "repo"
    sha = clone_from_mirror(
        subprocess_runner, mirror=mirror, base_commit=base_commit, dest=dest, env=_env(tmp_path), timeout_secs=60
    )
    return dest, sha


@pytest.mark.parametrize("form", ["sha", "short sha", "branch", "tag", "expression"])
def test_base_commit_forms(history, mirror, tmp_path, form):  # noqa: F811
    base_commit = {
        "sha": history.base,
        "short sha": history.base[:8],
        "branch": "release-1",
        "tag": "v1.0",
        "expression": "main~1",
    }[form]
    dest, sha = _clone(mirror, tmp_path, base_commit)
    assert sha == history.base
    assert (dest / "app.py").read_text() == "VERSION = 1\n"
    assert git(dest, "status", "--porcelain") == ""


def test_the_future_in_the_mirror_stays_out_of_the_repository(history, mirror, tmp_path):  # noqa: F811
    """The same checks as test_gitrepo.test_future_is_unreachable, with the future one fetch away."""
    dest, _ = _clone(mirror, tmp_path, history.base)
    past = [history.base, history.initial]

    assert git(dest, "rev-list", "--all").split() == past
    assert git(dest, "rev-list", "--all", "--reflog").split() == past
    for future in (history.fix, history.feature, history.fix_blob):
        assert subprocess.run(["git", "cat-file", "-e", future], cwd=dest).returncode != 0
    v1 = git(history.src, "rev-parse", "v1.0")
    assert git(dest, "for-each-ref") == f"{v1} tag\trefs/tags/v1.0"  # the base's tag only
    assert git(dest, "remote") == ""
    assert git(dest, "branch", "--all") == "* (no branch)"
    assert git(dest, "reflog", "--all", check=False) == ""
    assert git(dest, "fsck", "--unreachable", "--dangling", "--no-progress") == ""
    stored = set(git(dest, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split())
    reachable = set(line.split()[0] for line in git(dest, "rev-list", "--objects", history.base).splitlines())
    assert stored == reachable | {v1}
    git_dir = dest / ".git"
    for leftover in ("FETCH_HEAD", "ORIG_HEAD", "logs", "hooks", "shallow"):
        assert not (git_dir / leftover).exists(), leftover
    assert (git_dir / "packed-refs").read_text() == f"{v1} refs/tags/v1.0\n"
    assert not (git_dir / "objects" / "info" / "alternates").exists()
    config = (git_dir / "config").read_text()
    assert "remote" not in config and "url" not in config and str(mirror) not in config
    assert history.fix not in "".join(p.read_text(errors="replace") for p in git_dir.rglob("*") if p.is_file())


def test_a_commit_the_mirror_lacks_is_fetched_once_the_remote_has_it(tmp_path):
    src = tmp_path / "src"
    (first,) = make_repo(src, [{"a.py": "A = 1\n", ":message": "first"}])
    mirror = tmp_path / "cache" / "mirror"
    mirror.parent.mkdir()
    url = src.as_uri()
    update_mirror(subprocess_runner, mirror=mirror, repo_url=url, env=_env(tmp_path), timeout_secs=60)
    (src / "a.py").write_text("A = 2\n")
    git(src, "commit", "-qam", "second")
    second = git(src, "rev-parse", "HEAD")

    with pytest.raises(NotInMirror):
        _clone(mirror, tmp_path, second)
    assert list((tmp_path / "session" / "repo").iterdir()) == []  # left empty for the next try
    update_mirror(subprocess_runner, mirror=mirror, repo_url=url, env=_env(tmp_path), timeout_secs=60)
    dest, sha = _clone(mirror, tmp_path, second)
    assert sha == second and (dest / "a.py").read_text() == "A = 2\n"
    assert git(dest, "rev-list", "--all").split() == [second, first]


def test_an_uninitialised_mirror_lacks_everything(tmp_path):
    with pytest.raises(NotInMirror):
        _clone(tmp_path / "nothing", tmp_path, "0123456789abcdef0123456789abcdef01234567")


def test_a_failed_fetch_names_the_url_without_credentials(tmp_path):
    with pytest.raises(GitError) as excinfo:
        update_mirror(
            subprocess_runner,
            mirror=tmp_path / "m",
            repo_url="http://user:hunter2@127.0.0.1:9/repo.git",
            env=_env(tmp_path),
            timeout_secs=30,
        )
    assert "git fetch of http://***@127.0.0.1:9/repo.git failed" in str(excinfo.value)
    assert "hunter2" not in str(excinfo.value)


@pytest.mark.parametrize("bad", ["-u", "--upload-pack=touch /tmp/x", "a b", ""])
def test_option_like_base_commit_refused_before_git(tmp_path, bad):
    def never(argv, **kwargs):
        raise AssertionError(f"git must not run: {argv}")

    with pytest.raises(GitError):
        clone_from_mirror(
            never, mirror=tmp_path, base_commit=bad, dest=tmp_path / "r", env=_env(tmp_path), timeout_secs=5
        )


@pytest.mark.parametrize(
    ("name", "forever"),
    [("a" * 40, True), ("abc1234", True), ("main", False), ("v1.0", False), ("main~1", False), ("ABC1234", False)],
)
def test_which_names_can_be_trusted_without_a_fetch(name, forever):
    assert names_a_commit_forever(name) is forever


@pytest.mark.parametrize("form", ["short sha", "branch", "tag"])
def test_resolving_in_the_mirror_clones_nothing(history, mirror, tmp_path, form):  # noqa: F811
    base_commit = {"short sha": history.base[:8], "branch": "release-1", "tag": "v1.0"}[form]
    sha = resolve_in_mirror(
        subprocess_runner, mirror=mirror, base_commit=base_commit, env=_env(tmp_path), timeout_secs=30
    )
    assert sha == history.base
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "home"]
    with pytest.raises(NotInMirror):
        resolve_in_mirror(subprocess_runner, mirror=mirror, base_commit="no-such", env=_env(tmp_path), timeout_secs=30)
