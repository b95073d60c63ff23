"""One layer tar into a layer tree: the refusals, whiteouts read through a real overlay, links, owners."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import threading

import pytest

from evaluations.images.errors import ImageError, ImageUnavailable
from evaluations.images.unpack import unpack_layer
from tests.helpers.images import layer, member, sha256, uncompressed

LAYER = "sha256:" + "1" * 64


@pytest.fixture
def tree(tmp_path, store):  # store: skips without root, as every test here needs it
    path = tmp_path / "tree"
    path.mkdir()
    return path


def unpack(blob: bytes, tree, *, diff_id: str | None = None):
    return unpack_layer(io.BytesIO(blob), tree, layer=LAYER, diff_id=diff_id)


def threads_named(prefix: str) -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith(prefix)]


@pytest.mark.parametrize(
    ("members", "name", "why"),
    [
        ([member("dev/null", type="char", devmajor=1, devminor=3)], "dev/null", "is a device node"),
        ([member("dev/sda", type="block", devmajor=8)], "dev/sda", "is a device node"),
        ([member("/etc/passwd", b"x")], "/etc/passwd", "has an absolute path"),
        ([member("a/../../etc/passwd", b"x")], "a/../../etc/passwd", "has a '..' component in its path"),
        ([member("../x", b"x")], "../x", "has a '..' component in its path"),
        (
            [member("ok", b"x"), member("link", type="hardlink", target="/etc/shadow")],
            "link",
            "has an absolute hard link target",
        ),
        (
            [member("link", type="hardlink", target="../outside")],
            "link",
            "has a '..' component in its hard link target",
        ),
        (
            [member("link", type="hardlink", target="etc/shadow")],
            "link",
            "is a hard link to 'etc/shadow', which is not a file of this layer",
        ),
        (
            [member("a/b/up", type="symlink", target="../../../etc")],
            "a/b/up",
            "is a symbolic link to '../../../etc', which climbs above the root",
        ),
        (
            [member("up", type="symlink", target="x/../..")],
            "up",
            "is a symbolic link to 'x/../..', which climbs above the root",
        ),
        (
            [member("etc", type="symlink", target="/etc"), member("etc/cron.d/evil", b"x")],
            "etc/cron.d/evil",
            "lies below etc, which is a symbolic link",
        ),
        (
            [member("d", type="symlink", target="real"), member("real/"), member("d/x", b"x")],
            "d/x",
            "lies below d, which is a symbolic link",
        ),
        ([member("f", b"x"), member("f/g", b"x")], "f/g", "lies below f, which is not a folder"),
        ([member("big-uid", b"x", uid=65536)], "big-uid", "is owned by 65536:0, outside 0..65535"),
        ([member("big-gid", b"x", gid=100000)], "big-gid", "is owned by 0:100000, outside 0..65535"),
    ],
)
def test_hostile_members_are_refused_naming_the_layer_and_the_member(tree, members, name, why):
    with pytest.raises(ImageError) as caught:
        unpack(layer(*members), tree)
    assert str(caught.value) == f"Layer {LAYER} is refused: member {name!r} {why}."
    assert caught.value.kind == "task_invalid"
    assert threads_named("unpack-") == []
    assert not os.path.exists("/etc/cron.d/evil")


def test_symlinks_are_made_as_they_are_and_never_followed(tree):
    unpack(
        layer(
            member("etc/"),
            member("etc/motd", type="symlink", target="/etc/shadow"),  # resolves inside the evaluation's root
            member("usr/lib/x", type="symlink", target="../../usr/share"),  # down to the root, not above
            member("lib", type="symlink", target="usr/lib"),
            member("etc/motd-copy", b"mine"),
        ),
        tree,
    )
    assert os.readlink(tree / "etc/motd") == "/etc/shadow"
    assert os.readlink(tree / "usr/lib/x") == "../../usr/share"
    assert os.readlink(tree / "lib") == "usr/lib"
    assert (tree / "etc/motd-copy").read_bytes() == b"mine"


def test_modes_owners_fifos_and_hard_links(tree):
    counts = unpack(
        layer(
            member("usr/bin/"),
            member("usr/bin/su", b"#!/bin/su\n", mode=0o4755, uid=0, gid=0),
            member("home/me/", mode=0o700, uid=1000, gid=1000),
            member("home/me/notes", b"hello", mode=0o600, uid=1000, gid=1001),
            member("tmp/", mode=0o1777),
            member("run/pipe", type="fifo", mode=0o620, uid=5, gid=6),
            member("home/me/again", type="hardlink", target="home/me/notes"),
            member(
                "srv/ping",
                b"elf",
                mode=0o755,
                pax={
                    "SCHILY.xattr.security.capability": "\x01\x00\x00\x02 \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                },
            ),
            member("srv/trusted", b"x", pax={"SCHILY.xattr.trusted.overlay.opaque": "y"}),
        ),
        tree,
    )
    su = (tree / "usr/bin/su").stat()
    assert stat.S_IMODE(su.st_mode) == 0o4755 and (su.st_uid, su.st_gid) == (0, 0)
    home = (tree / "home/me").stat()
    assert stat.S_IMODE(home.st_mode) == 0o700 and (home.st_uid, home.st_gid) == (1000, 1000)
    notes = (tree / "home/me/notes").stat()
    assert (stat.S_IMODE(notes.st_mode), notes.st_uid, notes.st_gid) == (0o600, 1000, 1001)
    assert stat.S_IMODE((tree / "tmp").stat().st_mode) == 0o1777
    pipe = (tree / "run/pipe").lstat()
    assert stat.S_ISFIFO(pipe.st_mode) and (stat.S_IMODE(pipe.st_mode), pipe.st_uid, pipe.st_gid) == (0o620, 5, 6)
    again = (tree / "home/me/again").stat()
    assert again.st_ino == notes.st_ino and again.st_nlink == 2
    assert os.getxattr(tree / "srv/ping", "security.capability")[:4] == b"\x01\x00\x00\x02"
    assert "trusted.overlay.opaque" not in os.listxattr(tree / "srv/trusted")  # never from a tar
    assert (tree / "usr/bin/su").stat().st_mtime == 1700000000
    assert counts.size_bytes == len(b"#!/bin/su\n") + len(b"hello") + len(b"elf") + 1
    assert counts.files == 13  # 5 folders made for members + 8 entries


def test_a_later_member_replaces_an_earlier_one(tree):
    unpack(
        layer(
            member("x/", mode=0o755),
            member("x/inner", b"1"),
            member("x", b"now a file"),
            member("y", b"a"),
            member("y", b"b"),
        ),
        tree,
    )
    assert (tree / "x").read_bytes() == b"now a file"
    assert (tree / "y").read_bytes() == b"b"


@pytest.mark.parametrize("compression", ["gzip", "zstd", None])
def test_every_compression_gives_the_same_tree_and_the_diff_id_is_checked(tmp_path, tree, compression):
    members = (member("etc/"), member("etc/os-release", b"ID=test\n"))
    blob = layer(*members, compression=compression)
    diff_id = sha256(uncompressed(blob))
    assert diff_id == sha256(uncompressed(layer(*members, compression=None)))
    counts = unpack(blob, tree, diff_id=diff_id)
    assert counts.diff_id == diff_id
    assert (tree / "etc/os-release").read_bytes() == b"ID=test\n"
    other = tmp_path / "other"
    other.mkdir()
    wrong = "sha256:" + "2" * 64
    with pytest.raises(ImageError) as caught:
        unpack(blob, other, diff_id=wrong)
    assert str(caught.value) == (
        f"Layer {LAYER} unpacks to content with digest {diff_id}, not the diff_id {wrong} its image config names."
    )


def test_a_broken_stream_is_refused(tree):
    blob = layer(member("a", b"x" * 100000))
    with pytest.raises(ImageError, match=f"Layer {LAYER} is not a valid"):
        unpack(blob[: len(blob) // 2], tree)


def test_whiteouts_and_opaque_folders_through_a_real_overlay(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting an overlay needs root")
    lower, upper = tmp_path / "l1", tmp_path / "l2"
    lower.mkdir(), upper.mkdir()
    unpack(
        layer(
            member("etc/"),
            member("etc/keep", b"kept"),
            member("etc/gone", b"deleted above"),
            member("var/cache/"),
            member("var/cache/old1", b"1"),
            member("var/cache/old2", b"2"),
        ),
        lower,
    )
    unpack(
        layer(
            member("etc/.wh.gone"),
            member("var/cache/.wh..wh..opq"),
            member("var/cache/new", b"n"),
        ),
        upper,
    )
    gone = (upper / "etc/gone").lstat()
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == 0
    assert os.getxattr(upper / "var/cache", "trusted.overlay.opaque") == b"y"
    merged = tmp_path / "merged"
    merged.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={upper}:{lower}", str(merged)], check=True)
    try:
        assert sorted(os.listdir(merged / "etc")) == ["keep"]
        assert (merged / "etc/keep").read_bytes() == b"kept"
        assert sorted(os.listdir(merged / "var/cache")) == ["new"]
    finally:
        subprocess.run(["umount", str(merged)], check=True)


@pytest.mark.parametrize("name", [".wh.", ".wh.."])
def test_a_whiteout_that_names_nothing_is_refused(tree, name):
    with pytest.raises(ImageError, match="is a whiteout naming no file"):
        unpack(layer(member(f"etc/{name}")), tree)


def test_a_later_member_never_writes_through_an_earlier_link(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"untouched")
    unpack(
        layer(
            member("a", b"first"),
            member("b", type="hardlink", target="a"),
            member("b", b"second"),  # replaces the link; "a" keeps its bytes
            member("x", type="symlink", target=str(outside)),
            member("x", b"a file now"),  # replaces the symlink, never follows it
        ),
        tree,
    )
    assert (tree / "a").read_bytes() == b"first" and (tree / "b").read_bytes() == b"second"
    assert (tree / "a").stat().st_nlink == 1
    assert not (tree / "x").is_symlink() and (tree / "x").read_bytes() == b"a file now"
    assert outside.read_bytes() == b"untouched"


# -- the stream's thread and the tar's (images/pipe.py) ------------------------------------------


class CountingStream(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.served = 0

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        self.served += len(data)
        return data


def test_a_refused_layer_is_read_no_further_and_leaves_no_thread(tree):
    """The tar's thread refuses the first member; the thread reading the stream stops soon after
    (a few chunks ahead at most), not at the end of the 64 MiB behind it."""
    blob = layer(member("dev/null", type="char", devmajor=1, devminor=3), member("rest", os.urandom(64 << 20)))
    stream = CountingStream(blob)
    with pytest.raises(ImageError, match="member 'dev/null' is a device node"):
        unpack_layer(stream, tree, layer=LAYER, diff_id=None)
    assert stream.served < len(blob) // 4
    assert threads_named("unpack-") == []


def test_a_stream_that_fails_midway_is_met_where_it_failed(tree):
    """An error of the stream reaches the tar's thread after the members before it were made."""

    class Failing(io.BytesIO):
        def read(self, size: int = -1) -> bytes:
            if self.tell() > len(blob) // 2:
                raise ImageUnavailable("Downloading blob x failed (ConnectionResetError: reset).")
            return super().read(min(size, 4096) if size and size > 0 else 4096)

    blob = layer(member("first", b"made"), member("big", os.urandom(4 << 20)), compression=None)
    with pytest.raises(ImageUnavailable, match="reset"):
        unpack_layer(Failing(blob), tree, layer=LAYER, diff_id=None)
    assert (tree / "first").read_bytes() == b"made"
    assert threads_named("unpack-") == []
