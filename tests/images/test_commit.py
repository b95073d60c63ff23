"""A build step's upper folder becomes a layer (evaluations/images/commit.py): owners mapped back to
the image's ids, overlayfs' bookkeeping removed, and an id that depends on the tree alone.

The id is the store's key for a layer: the same tree must give the same id from one version of
the executor to the next (or every cached build would be rebuilt and stored twice). The fixed
tree below has every kind of entry and every rewrite commit.py does; its id is the one the
path-walking commit of main (b5a3f1f) gave, hard-coded here.
"""

from __future__ import annotations

import os
import stat
import struct

import pytest

from evaluations.images.commit import OPAQUE, to_layer
from evaluations.runtime.idmap import IdMap

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners, devices and trusted.* xattrs: root only")

IDMAP = IdMap(lease=4242, base=3_000_000, user=1000, group=1000)
# The id main's commit gave the tree of fixed_tree (python -c, before the walk from handles).
FIXED_TREE_ID = "sha256:c408593276cce30b66c212f550a926e8179e5aeb5fd97abfdb5086e4fb20e935"
# security.capability v2: cap_net_raw permitted and effective (what setcap cap_net_raw+ep writes).
CAPABILITY = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)
LONG = "n" * 200  # 25 of them: a tree deeper than PATH_MAX


def fixed_tree(upper) -> None:
    """Every kind of entry (folder, file, link, whiteout, FIFO), owned by the lease, the range, root
    and a stranger, with setuid, a capability, overlayfs' xattrs and a user xattr; names whose
    order differs by byte and by case."""
    upper.mkdir(mode=0o755)
    base = IDMAP.base

    def make(relpath, kind, owner, mode, data=b""):
        path = upper / relpath
        if kind == "dir":
            path.mkdir()
        elif kind == "file":
            path.write_bytes(data)
        elif kind == "link":
            os.symlink(data, path)
        elif kind == "whiteout":
            os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        elif kind == "fifo":
            os.mkfifo(path)
        os.chown(path, owner, owner, follow_symlinks=False)
        if kind != "link":
            os.chmod(path, mode)

    make("a", "dir", base, 0o755)
    os.setxattr(upper / "a", OPAQUE, b"y")
    make("a/f.txt", "file", IDMAP.lease, 0o644, b"hello\n")
    make("a/B", "file", base + 7, 0o600, b"\0binary\xff")
    make("a/a.b", "link", IDMAP.lease, 0o777, "../x")
    make("a/sub", "dir", IDMAP.lease, 0o2775)
    make("a/sub/deep", "dir", base + 33, 0o700)
    make("a/sub/deep/g", "file", base + 33, 0o640, b"g" * 70000)
    os.setxattr(upper / "a/sub/deep/g", "user.note", b"kept")
    make("a-", "dir", 0, 0o755)
    make("a-/empty", "file", 0, 0o644)
    make("x", "whiteout", 0, 0o000)
    make("s", "file", base, 0o4755, b"#!/bin/sh\n")
    make("tool", "file", IDMAP.lease, 0o755, b"\x7fELF")
    os.setxattr(upper / "tool", "security.capability", CAPABILITY)
    make("fifo", "fifo", 12345, 0o644)
    make("z", "dir", base, 0o1777)
    os.setxattr(upper / "z", "trusted.overlay.origin", b"\x00\xfb\x21")
    os.setxattr(upper / "z", "trusted.overlay.impure", b"y")
    make("z/Z", "link", base + 5, 0o777, "/etc/passwd")


def listing(upper) -> dict:
    """Every entry below ``upper``: kind, mode, owner, xattrs (what the rewrite leaves)."""
    found = {}
    for folder, dirs, files in os.walk(upper):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            xattrs = {
                key: os.getxattr(path, key, follow_symlinks=False) for key in os.listxattr(path, follow_symlinks=False)
            }
            found[os.path.relpath(path, upper)] = (
                stat.S_IFMT(st.st_mode),
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
                xattrs,
            )
    return found


def test_a_fixed_tree_keeps_its_layer_id_and_is_rewritten_as_a_layer(tmp_path):
    upper = tmp_path / "upper"
    fixed_tree(upper)
    assert to_layer(upper, IDMAP) == FIXED_TREE_ID
    after = listing(upper)
    assert after["a"][2:] == (0, 0, {OPAQUE: b"y"})
    assert after["a/f.txt"][1:4] == (0o644, 1000, 1000)
    assert after["a/B"][2:4] == (7, 7)
    assert after["a/a.b"][2:4] == (1000, 1000)
    assert after["a/sub"][1:4] == (0o2775, 1000, 1000)  # setgid put back after lchown
    assert after["a/sub/deep/g"][4] == {"user.note": b"kept"}
    assert after["s"][1:4] == (0o4755, 0, 0)  # setuid put back
    assert after["tool"][2:] == (1000, 1000, {"security.capability": CAPABILITY})  # the capability too
    assert after["fifo"][2:4] == (65534, 65534)  # no id of the evaluation's: the overflow id
    assert after["x"][2:4] == (0, 0)
    assert after["z"][4] == {}  # overlayfs' bookkeeping goes


def test_the_layer_id_depends_on_the_tree_not_on_when_or_where(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    fixed_tree(first)
    fixed_tree(second)
    os.utime(second / "a/f.txt", (1, 1))
    assert to_layer(first, IDMAP) == to_layer(second, IDMAP)
    third = tmp_path / "three"
    fixed_tree(third)
    (third / "a/f.txt").write_bytes(b"hellO\n")
    assert to_layer(third, IDMAP) != FIXED_TREE_ID


def test_a_tree_deeper_than_path_max_is_committed(tmp_path):
    """A RUN may make a tree no host path can name: it is walked from handles, one name at a time."""
    upper = tmp_path / "upper"
    upper.mkdir()
    folder = os.open(upper, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(25):
        os.mkdir(LONG, dir_fd=folder)
        os.chown(LONG, IDMAP.lease, IDMAP.lease, dir_fd=folder)
        nxt = os.open(LONG, os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        os.close(folder)
        folder = nxt
    fd = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o4755, dir_fd=folder)
    os.write(fd, b"x")
    os.fchown(fd, IDMAP.base + 3, IDMAP.base + 3)
    os.fchmod(fd, 0o4755)
    os.close(fd)
    try:
        assert to_layer(upper, IDMAP).startswith("sha256:")
        st = os.stat("bottom", dir_fd=folder)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (3, 0o4755)
        assert os.stat(LONG, dir_fd=os.open(upper, os.O_PATH)).st_uid == 1000
    finally:
        os.close(folder)
