"""Writing, measuring and deleting in folders an agent controlled, without following links."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from evaluations.safefs import (
    SafeFSError,
    clear_way,
    read_file_at,
    remove_tree_nofollow,
    tree_size,
    write_file_nofollow,
)


@pytest.fixture
def repo(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    return folder


@pytest.fixture
def outside(tmp_path):
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret").write_text("keep me")
    return folder


def make_deep_tree(top, depth: int, name: str = "d") -> None:
    """A chain of ``depth`` folders, far deeper than PATH_MAX allows to name."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
            f.write(b"x" * 10_000)
    finally:
        os.close(fd)


# -- write_file_nofollow ----------------------------------------------------------


def test_write_creates_parents_and_sets_mode(repo):
    write_file_nofollow(repo, "a/b/test_x.py", b"print(1)\n", mode=0o755)
    assert (repo / "a/b/test_x.py").read_bytes() == b"print(1)\n"
    assert stat.S_IMODE((repo / "a/b/test_x.py").stat().st_mode) == 0o755
    assert stat.S_IMODE((repo / "a").stat().st_mode) == 0o755


def test_write_replaces_an_existing_file_and_leaves_no_temporary(repo):
    (repo / "f.txt").write_text("old")
    write_file_nofollow(repo, "./f.txt", b"new")
    assert (repo / "f.txt").read_text() == "new"
    assert sorted(os.listdir(repo)) == ["f.txt"]


def test_write_replaces_a_symlink_at_the_final_name(repo, outside):
    (repo / "conftest.py").symlink_to(outside / "secret")
    write_file_nofollow(repo, "conftest.py", b"safe")
    assert not (repo / "conftest.py").is_symlink()
    assert (repo / "conftest.py").read_bytes() == b"safe"
    assert (outside / "secret").read_text() == "keep me"


def test_write_replaces_a_dangling_symlink_at_the_final_name(repo, outside):
    (repo / "new.py").symlink_to(outside / "would-be-created")
    write_file_nofollow(repo, "new.py", b"safe")
    assert not (outside / "would-be-created").exists()
    assert (repo / "new.py").read_bytes() == b"safe"


def test_write_refuses_a_symlink_in_a_parent(repo, outside):
    (repo / "tests").symlink_to(outside)
    with pytest.raises(SafeFSError, match="cannot write tests/x.py: tests is a symbolic link"):
        write_file_nofollow(repo, "tests/x.py", b"evil")
    assert sorted(os.listdir(outside)) == ["secret"]


def test_write_refuses_a_deeper_symlink_in_a_parent(repo, outside):
    (repo / "a").mkdir()
    (repo / "a/b").symlink_to(outside)
    with pytest.raises(SafeFSError, match="a/b is a symbolic link"):
        write_file_nofollow(repo, "a/b/c/x.py", b"evil")
    assert sorted(os.listdir(outside)) == ["secret"]


def test_write_refuses_a_file_where_a_folder_is_needed(repo):
    (repo / "a").write_text("file")
    with pytest.raises(SafeFSError, match="a is not a folder"):
        write_file_nofollow(repo, "a/x.py", b"")


def test_write_refuses_a_folder_at_the_final_name(repo):
    (repo / "x").mkdir()
    with pytest.raises(SafeFSError, match="it is a folder"):
        write_file_nofollow(repo, "x", b"")


@pytest.mark.parametrize("relpath", ["../escape", "a/../../escape", "/etc/passwd", "", ".", "a\0b"])
def test_write_refuses_bad_relative_paths(repo, relpath):
    with pytest.raises(SafeFSError):
        write_file_nofollow(repo, relpath, b"")
    assert not (repo.parent / "escape").exists()


def test_write_refuses_a_root_that_is_a_symlink(tmp_path, outside):
    (tmp_path / "link").symlink_to(outside)
    with pytest.raises(SafeFSError, match="cannot open folder"):
        write_file_nofollow(tmp_path / "link", "x", b"")


# -- remove_tree_nofollow --------------------------------------------------------------


def test_clear_way_removes_what_stands_where_a_file_goes_without_following_links(repo, outside):
    (repo / "a").symlink_to(outside)  # a link where a parent folder goes
    (repo / "b").write_text("a file where a folder goes")
    (repo / "c" / "name" / "locked").mkdir(parents=True)  # a folder at the file's name
    (repo / "c" / "name" / "locked" / "f").write_text("x")
    os.chmod(repo / "c" / "name" / "locked", 0)
    os.mkfifo(repo / "fifo")
    for relpath in ("a/x.txt", "b/y/z.txt", "c/name", "fifo", "missing/deeper/file"):
        clear_way(repo, relpath)
        write_file_nofollow(repo, relpath, b"task\n")
        assert (repo / relpath).read_bytes() == b"task\n" and not (repo / relpath).is_symlink()
    assert not (repo / "a").is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["secret"] and (outside / "secret").read_text() == "keep me"


def test_remove_does_not_follow_symlinks(tmp_path, outside):
    tree = tmp_path / "session"
    (tree / "repo/sub").mkdir(parents=True)
    (tree / "repo/sub/file").write_text("x")
    (tree / "repo/dirlink").symlink_to(outside)
    (tree / "repo/filelink").symlink_to(outside / "secret")
    (tree / "repo/dangling").symlink_to(tmp_path / "nowhere")
    remove_tree_nofollow(tree)
    assert not tree.exists()
    assert (outside / "secret").read_text() == "keep me"


def test_remove_a_symlink_path_removes_only_the_link(tmp_path, outside):
    (tmp_path / "link").symlink_to(outside)
    remove_tree_nofollow(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink()
    assert (outside / "secret").exists()


def test_remove_missing_path_and_plain_file(tmp_path):
    remove_tree_nofollow(tmp_path / "absent")
    (tmp_path / "f").write_text("x")
    remove_tree_nofollow(tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_remove_a_tree_deeper_than_path_max(tmp_path):
    tree = tmp_path / "deep"
    tree.mkdir()
    make_deep_tree(tree, 3000)  # 3000 * len("d/") > PATH_MAX (4096)
    remove_tree_nofollow(tree)
    assert not tree.exists()


def test_remove_folders_made_unreadable(tmp_path):
    tree = tmp_path / "t"
    (tree / "locked/inner").mkdir(parents=True)
    (tree / "locked/inner/f").write_text("x")
    os.chmod(tree / "locked/inner", 0o000)
    os.chmod(tree / "locked", 0o500)
    remove_tree_nofollow(tree)
    assert not tree.exists()


# -- tree_size --------------------------------------------------------------------------


def test_tree_size_counts_blocks_without_following_links(tmp_path, outside):
    (outside / "big").write_bytes(os.urandom(4 * 1024 * 1024))
    tree = tmp_path / "t"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub/data").write_bytes(os.urandom(100_000))
    (tree / "link").symlink_to(outside / "big")
    (tree / "dirlink").symlink_to(outside)
    os.link(tree / "sub/data", tree / "hardlink")
    size = tree_size(tree)
    assert 100_000 <= size < 200_000  # the data once, folders, not the 4 MiB behind the links


def test_tree_size_sees_files_deeper_than_path_max(tmp_path):
    tree = tmp_path / "deep"
    tree.mkdir()
    make_deep_tree(tree, 2500)
    try:
        assert tree_size(tree) >= 10_000 + 2500 * 4096 // 2  # the leaf and (most) folder blocks
    finally:
        remove_tree_nofollow(tree)  # pytest's own cleanup (shutil.rmtree) overflows on it


def test_tree_size_of_missing_and_of_a_file(tmp_path):
    assert tree_size(tmp_path / "absent") == 0
    (tmp_path / "f").write_bytes(b"x" * 8192)
    assert tree_size(tmp_path / "f") >= 8192


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to switch to an unprivileged uid"
)
def test_remove_folders_made_unreadable_by_their_unprivileged_owner():
    """As root every mode is ignored, so run the removal as the owner (nobody) itself."""
    top = Path(tempfile.mkdtemp(prefix="safefs-"))
    try:
        os.chmod(top, 0o777)
        script = (
            "import os, sys\n"
            "from evaluations.safefs import remove_tree_nofollow, tree_size\n"
            "t = sys.argv[1] + '/tree'\n"
            "os.makedirs(t + '/locked/inner/x')\n"
            "open(t + '/locked/inner/x/f', 'w').write('x')\n"
            "for d, mode in (('/locked/inner/x', 0), ('/locked/inner', 0), ('/locked', 0o500)):\n"
            "    os.chmod(t + d, mode)\n"
            "assert tree_size(t) > 0\n"
            "remove_tree_nofollow(t)\n"
            "print(os.path.exists(t))\n"
        )
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script, str(top)],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "False"
    finally:
        shutil.rmtree(top)


# -- read_file_at (more in tests/grading/test_graders.py, its first user) ---------------------


def test_read_file_at_reads_a_file_and_says_none_for_a_missing_name(repo):
    (repo / "f").write_bytes(b"abc")
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_file_at(fd, "f", max_bytes=3, shown="F") == b"abc"
        assert read_file_at(fd, "missing", max_bytes=3, shown="F") is None
        with pytest.raises(SafeFSError, match=r"^F is 3 bytes, over the cap of 2 bytes$"):
            read_file_at(fd, "f", max_bytes=2, shown="F")
    finally:
        os.close(fd)


def test_read_file_at_refuses_a_file_larger_than_its_size_said():
    # /proc files say 0 bytes and hold more: what a file growing while it is read looks like.
    fd = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SafeFSError, match=r"^status grew over the cap of 16 bytes while it was read$"):
            read_file_at(fd, "status", max_bytes=16, shown="status")
    finally:
        os.close(fd)
