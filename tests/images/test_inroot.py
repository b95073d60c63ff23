"""The one resolver (evaluations/images/inroot.py), both ways: the kernel's openat2 and the walk
from handles it falls back to without it. Every case runs twice, the walk forced the second time.

Each tree is real, made in a temporary folder with a host folder beside it that the tree's links
name: nothing resolved in the tree may ever reach it."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from evaluations.images import inroot

LONG = "d" * 200  # 25 of them: a path of 5000 characters, past PATH_MAX


@pytest.fixture(params=["openat2", "walk"])
def mode(request, monkeypatch):
    if request.param == "walk":
        monkeypatch.setattr(inroot, "use_openat2", False)
    else:
        monkeypatch.setattr(inroot, "use_openat2", None)
    return request.param


@pytest.fixture
def tree(tmp_path, mode):
    """(root folder, root handle, a host folder outside it holding ``secret``)."""
    root = tmp_path / "root"
    root.mkdir()
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host")
    fd = inroot.open_root(root)
    yield root, fd, host
    os.close(fd)
    if mode == "openat2":
        assert inroot.use_openat2 is True  # this kernel has it: the first case really used it


def read(root_fd: int, relpath: str, **kwargs) -> str:
    fd = inroot.open_in(root_fd, relpath, os.O_RDONLY, **kwargs)
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def test_an_absolute_link_starts_again_at_the_root(tree):
    root, fd, host = tree
    (root / "abs").symlink_to(host)
    with pytest.raises(FileNotFoundError):
        read(fd, "abs/secret")
    mirrored = root / str(host).lstrip("/")
    mirrored.mkdir(parents=True)
    (mirrored / "secret").write_text("inside")
    assert read(fd, "abs/secret") == "inside"
    assert read(fd, "/abs/secret") == "inside"  # a leading slash is the root's


def test_relative_links_and_dotdot_stop_at_the_root(tree):
    root, fd, host = tree
    (root / "a" / "b").mkdir(parents=True)
    (root / "secret").write_text("inside")
    (root / "a" / "b" / "up").symlink_to("../../../../../../secret")
    (root / "a" / "sib").symlink_to("b/../../secret")
    assert read(fd, "a/b/up") == "inside"
    assert read(fd, "a/sib") == "inside"
    assert read(fd, "../../../secret") == "inside"
    assert read(fd, "a/../../../a/b/../../secret") == "inside"


def test_loops_and_over_forty_links_are_eloop(tree):
    root, fd, _ = tree
    (root / "x").symlink_to("y")
    (root / "y").symlink_to("x")
    with pytest.raises(OSError) as caught:
        read(fd, "x")
    assert caught.value.errno == errno.ELOOP
    (root / "f").write_text("end")
    (root / "l0").symlink_to("f")
    for n in range(1, 42):
        (root / f"l{n}").symlink_to(f"l{n - 1}")
    assert read(fd, "l39") == "end"  # 40 links: the kernel's bound
    with pytest.raises(OSError) as caught:
        read(fd, "l40")
    assert caught.value.errno == errno.ELOOP


def test_follow_last_false_never_follows_the_last_link(tree):
    root, fd, host = tree
    (root / "l").symlink_to(host / "secret")
    with pytest.raises(OSError) as caught:
        inroot.open_in(fd, "l", os.O_RDONLY, follow_last=False)
    assert caught.value.errno == errno.ELOOP
    handle = inroot.open_in(fd, "l", os.O_PATH, follow_last=False)
    try:
        assert stat.S_ISLNK(os.fstat(handle).st_mode)
        assert os.readlink("", dir_fd=handle) == str(host / "secret")
    finally:
        os.close(handle)


def test_creating_through_a_dangling_absolute_link_lands_inside(tree):
    root, fd, host = tree
    (root / "etc").mkdir()
    (root / "out").symlink_to(host / "new")
    with pytest.raises(FileNotFoundError):  # the link's folder, resolved in the root, is not there
        inroot.open_in(fd, "out", os.O_WRONLY | os.O_CREAT, 0o600)
    assert not (host / "new").exists()
    os.makedirs(root / str(host).lstrip("/"))
    made = inroot.open_in(fd, "out", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(made)
    assert (root / str(host).lstrip("/") / "new").is_file()
    assert not (host / "new").exists()


def test_a_link_swapped_between_two_calls_is_resolved_again_inside(tree):
    root, fd, host = tree
    (root / "q").mkdir()
    (root / "q" / "secret").write_text("q")
    (root / "p").symlink_to("q")
    assert read(fd, "p/secret") == "q"
    (root / "p").unlink()
    (root / "p").symlink_to(host)  # what an archive's later member, or the agent, does
    with pytest.raises(FileNotFoundError):
        read(fd, "p/secret")
    with pytest.raises(FileNotFoundError):  # "p" resolved in the root: a folder missing there
        inroot.parent_and_name(fd, "p/victim")
    os.makedirs(root / str(host).lstrip("/"))
    parent, name = inroot.parent_and_name(fd, "p/victim")
    os.mkdir(name, dir_fd=parent)
    os.close(parent)
    assert sorted(os.listdir(host)) == ["secret"]
    assert (root / str(host).lstrip("/") / "victim").is_dir()


def test_chains_deeper_than_path_max(tree):
    root, fd, host = tree
    deep = "/".join([LONG] * 25)
    folder = inroot.mkdirs_in(fd, deep)  # made through handles: no 5000-character path is ever built
    os.close(folder)
    parent, name = inroot.parent_and_name(fd, f"{deep}/f")
    made = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=parent)
    os.write(made, b"deep")
    os.close(made)
    # At the bottom, links that climb and that name the host: still inside.
    os.symlink("../" * 60 + "top", "up", dir_fd=parent)
    os.symlink(str(host / "secret"), "abs", dir_fd=parent)
    os.close(parent)
    assert read(fd, f"{deep}/f") == "deep"
    (root / "top").write_text("inside")
    assert read(fd, f"{deep}/up") == "inside"
    with pytest.raises(FileNotFoundError):
        read(fd, f"{deep}/abs")
    # A short path that a chain of short links makes 5000 characters long.
    (root / "k").symlink_to(LONG)
    level = os.open(LONG, os.O_PATH, dir_fd=fd)
    for _ in range(24):
        os.symlink(LONG, "k", dir_fd=level)
        nxt = os.open(LONG, os.O_PATH, dir_fd=level)
        os.close(level)
        level = nxt
    os.close(level)
    assert read(fd, "k/" * 25 + "f") == "deep"
    assert read(fd, "k/" * 25 + "up") == "inside"


def test_mkdirs_in_makes_owned_folders_through_links_inside(tree):
    root, fd, host = tree
    (root / "w").symlink_to("/")
    (root / "file").write_text("")
    made = inroot.mkdirs_in(fd, "/w/w/srv/x", 1234, 5678, 0o750)
    os.close(made)
    listed = inroot.open_dir(fd, "w/srv")  # O_DIRECTORY through a last link: followed, inside
    assert os.listdir(listed) == ["x"]
    os.close(listed)
    for folder in (root / "srv", root / "srv" / "x"):
        st = os.lstat(folder)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o750, 1234, 5678)
    (root / "dangling").symlink_to(host / "made")
    os.close(inroot.mkdirs_in(fd, "dangling/inner"))
    assert sorted(os.listdir(host)) == ["secret"]
    assert (root / str(host).lstrip("/") / "made" / "inner").is_dir()
    with pytest.raises(NotADirectoryError):
        inroot.mkdirs_in(fd, "file/below")


def test_parent_and_name_and_read_in(tree):
    root, fd, host = tree
    (root / "etc").symlink_to(host)
    (root / "real").mkdir()
    (root / "real" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.mkfifo(root / "pipe")
    assert inroot.read_in(fd, "etc/secret", 100) is None
    assert inroot.read_in(fd, "real/passwd", 4) == b"root"
    assert inroot.read_in(fd, "pipe", 100) is None  # a FIFO never blocks the reader
    assert inroot.read_in(fd, "missing", 100) is None
    with pytest.raises(FileNotFoundError):  # the folder "etc" names, resolved in the root, is missing
        inroot.parent_and_name(fd, "/etc/secret")
    parent, name = inroot.parent_and_name(fd, "/real/etc")  # the last name is never followed
    os.close(parent)
    assert name == "etc"
    for bad in ("", "/", "a/.."):
        with pytest.raises(OSError) as caught:
            inroot.parent_and_name(fd, bad)
        assert caught.value.errno == errno.EINVAL
    assert inroot.lstat_at(fd, "etc") is not None and stat.S_ISLNK(inroot.lstat_at(fd, "etc").st_mode)


def test_beneath_refuses_what_in_root_would_clamp(tree):
    root, fd, host = tree
    (root / "a").mkdir()
    (root / "a" / "f").write_text("inside")
    (root / "a" / "rel").symlink_to("../a/f")
    (root / "a" / "abs").symlink_to("/a/f")
    (root / "a" / "up").symlink_to("../../a/f")
    assert read(fd, "a/rel", beneath=True) == "inside"
    for path in ("a/abs", "a/up", "../a/f"):
        assert read(fd, path) == "inside"  # in the root: clamped
        with pytest.raises(OSError) as caught:
            read(fd, path, beneath=True)
        assert caught.value.errno == errno.EXDEV, path


@pytest.fixture
def plain(tmp_path):
    """(root folder, root handle, a host folder outside it): for ``resolve``, which walks from
    handles whatever the kernel offers (no openat2 to choose)."""
    root, host = tmp_path / "root", tmp_path / "host"
    root.mkdir()
    host.mkdir()
    fd = inroot.open_root(root)
    yield root, fd, host
    os.close(fd)


def test_resolve_gives_the_trees_own_path_with_links_resolved_in_it(plain):
    root, fd, host = plain
    (root / "srv/x").mkdir(parents=True)
    os.symlink("/", root / "w")
    os.symlink("../../..", root / "srv/up")
    os.symlink("x", root / "srv/rel")
    os.symlink(str(host), root / "srv/host")  # the host's folder, as an absolute link: the root's
    (root / "srv/file").write_text("f\n")
    os.symlink("file", root / "srv/to-file")
    assert inroot.resolve(fd, "/w/srv/x") == "srv/x"
    assert inroot.resolve(fd, "/srv/up/srv/up/srv/rel") == "srv/x"  # ".." stops at the root
    assert inroot.resolve(fd, "/srv/rel/new/../made") == "srv/x/made"  # missing: kept as written
    assert inroot.resolve(fd, "/w/srv/new/../rel") == "srv/x"  # back into the tree from a missing one
    assert inroot.resolve(fd, "/srv/host/secret") == str(host / "secret").lstrip("/")  # as the tree names it
    assert inroot.resolve(fd, "/") == ""
    with pytest.raises(NotADirectoryError):
        inroot.resolve(fd, "/srv/file/x")
    with pytest.raises(NotADirectoryError):  # a folder is asked for by default
        inroot.resolve(fd, "/srv/to-file")
    assert inroot.resolve(fd, "/w/srv/to-file", folder=False) == "srv/file"  # any entry, the last link followed
    with pytest.raises(FileNotFoundError):
        inroot.resolve(fd, "/srv/rel/new", keep_missing=False)
    os.symlink("missing", root / "dangling")
    with pytest.raises(FileNotFoundError):
        inroot.resolve(fd, "/dangling", keep_missing=False, folder=False)
    os.symlink("loop", root / "loop")
    with pytest.raises(OSError, match="many levels"):
        inroot.resolve(fd, "/loop/x")


def test_resolve_goes_past_path_max(plain):
    root, fd, _ = plain
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(25):  # 5000 characters below the root: no host path could name the bottom
        os.mkdir(LONG, dir_fd=folder)
        nxt = os.open(LONG, os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        os.close(folder)
        folder = nxt
    os.symlink(f"../{LONG}", "same", dir_fd=folder)
    os.symlink("/", "top", dir_fd=folder)
    os.close(folder)
    bottom = "/".join([LONG] * 25)
    assert inroot.resolve(fd, f"/{bottom}/same/same/made") == f"{bottom}/made"
    assert inroot.resolve(fd, f"/{bottom}/top/{LONG}/x/..") == LONG


def test_host_path_resolves_the_hosts_own_paths_as_realpath_did(tmp_path):
    """The host's own paths (settings, interpreters, the executor's folders): every link resolved
    with / as the root, what is missing kept as written, a loop refused."""
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "rel").symlink_to("real/deep")
    (tmp_path / "abs").symlink_to(tmp_path / "rel")
    (tmp_path / "up").symlink_to("real/deep/../..")
    for path in ("rel", "abs", "abs/missing/tail", "up/real", "real/deep/..", "dangling"):
        assert inroot.host_path(tmp_path / path) == os.path.realpath(tmp_path / path), path
    assert inroot.host_path("/") == "/"
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(OSError) as caught:
        inroot.host_path(tmp_path / "loop")
    assert caught.value.errno == errno.ELOOP
