"""extract_tar against hostile archives (what a sandbox could answer), and pack_folder's tar.

Each hostile case checks the disk outside the folder afterwards, not only the returned refusals."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from term_executor_client.archives import extract_tar, pack_folder


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", linkname: str = "", mode: int = 0o644):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def archive(*members, compress: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if compress else "w") as tar:
        for info, data in members:
            tar.addfile(info, data)
    return buffer.getvalue()


@pytest.fixture
def layout(tmp_path):
    """``dest`` to unpack into, beside ``outside`` holding a file an escape would overwrite."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("untouched")
    return tmp_path / "dest", outside


def untouched(outside) -> bool:
    return sorted(p.name for p in outside.iterdir()) == ["secret"] and (outside / "secret").read_text() == "untouched"


def test_files_folders_and_inner_links_are_written(layout):
    dest, outside = layout
    refused = extract_tar(
        archive(
            member("./", tarfile.DIRTYPE, mode=0o755),
            member("./bin", tarfile.DIRTYPE, mode=0o750),
            member("./bin/run.sh", data=b"#!/bin/sh\n", mode=0o755),
            member("./data.txt", data=b"data"),
            member("./bin/data", tarfile.SYMTYPE, linkname="../data.txt"),
            member("./copy.txt", tarfile.LNKTYPE, linkname="./data.txt"),
            compress=True,
        ),
        dest,
    )
    assert refused == []
    assert (dest / "bin" / "run.sh").read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE((dest / "bin" / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(dest / "bin" / "data") == "../data.txt"
    assert (dest / "bin" / "data").read_text() == "data"
    assert (dest / "copy.txt").read_text() == "data" and not (dest / "copy.txt").is_symlink()


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (member("/abs/file", data=b"x"), "an absolute name"),
        (member("../outside/secret", data=b"pwned"), "a name leaving the folder"),
        (member("a/../../outside/secret", data=b"pwned"), "a name leaving the folder"),
        (member("escape", tarfile.SYMTYPE, linkname="/etc/passwd"), "a link to an absolute path"),
        (member("escape", tarfile.SYMTYPE, linkname="../outside"), "a link leaving the folder"),
        (member("sub/escape", tarfile.SYMTYPE, linkname="../../outside/secret"), "a link leaving the folder"),
        (member("hard", tarfile.LNKTYPE, linkname="/etc/passwd"), "a hard link to a member the archive does not hold"),
        (member("fifo", tarfile.FIFOTYPE), "not a file, folder or link"),
        (member("device", tarfile.CHRTYPE), "not a file, folder or link"),
    ],
)
def test_a_hostile_member_is_refused_and_the_rest_written(layout, bad, why):
    dest, outside = layout
    refused = extract_tar(archive(bad, member("kept.txt", data=b"kept")), dest)
    assert len(refused) == 1 and why in refused[0], refused
    assert (dest / "kept.txt").read_text() == "kept"
    assert untouched(outside)
    assert not (dest / "escape").is_symlink() and not (dest / "hard").exists()


def test_a_chain_of_links_that_leads_out_is_removed(layout):
    """Each link alone looks inside ("." and "b/.."), but b/.. through b is dest's parent."""
    dest, outside = layout
    refused = extract_tar(
        archive(
            member("b", tarfile.SYMTYPE, linkname="."),
            member("a", tarfile.SYMTYPE, linkname="b/.."),
        ),
        dest,
    )
    assert refused == ["a: a link that resolves outside the folder"]
    assert not os.path.lexists(dest / "a") and os.readlink(dest / "b") == "."


def test_nothing_is_written_through_a_link_in_the_archive(layout):
    dest, outside = layout
    refused = extract_tar(
        archive(
            member("inner", tarfile.DIRTYPE, mode=0o755),
            member("via", tarfile.SYMTYPE, linkname="inner"),
            member("via/file", data=b"through a link"),
        ),
        dest,
    )
    assert refused == ["via/file: its parent via is a link or not a folder"]
    assert list((dest / "inner").iterdir()) == []


def test_nothing_is_written_through_a_link_already_in_the_folder(layout):
    """A link left by an earlier download (or anyone) pointing out: neither followed as a parent
    nor written through as the file itself."""
    dest, outside = layout
    dest.mkdir()
    (dest / "logs").symlink_to(outside)
    (dest / "reward.txt").symlink_to(outside / "secret")
    refused = extract_tar(archive(member("logs/secret", data=b"pwned"), member("reward.txt", data=b"1")), dest)
    assert refused == ["logs/secret: its parent logs is a link or not a folder"]
    assert untouched(outside)
    assert (dest / "reward.txt").read_text() == "1" and not (dest / "reward.txt").is_symlink()


def test_existing_files_are_overwritten_and_a_folder_in_the_way_refused(layout):
    dest, outside = layout
    (dest / "dir").mkdir(parents=True)
    (dest / "old.txt").write_text("old")
    refused = extract_tar(archive(member("old.txt", data=b"new"), member("dir", data=b"a file")), dest)
    assert (dest / "old.txt").read_text() == "new"
    assert refused == ["dir: a folder is in its place"] and (dest / "dir").is_dir()


def test_setuid_and_sticky_bits_are_dropped_and_the_owner_can_write(layout):
    dest, _ = layout
    extract_tar(
        archive(
            member("tool", data=b"x", mode=0o4755),
            member("readonly", data=b"x", mode=0o444),
            member("shared", tarfile.DIRTYPE, mode=0o1777),
        ),
        dest,
    )
    assert stat.S_IMODE((dest / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "readonly").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "shared").stat().st_mode) == 0o777


def test_not_a_tar_is_an_error(layout):
    dest, _ = layout
    with pytest.raises(tarfile.ReadError):
        extract_tar(b"this is not a tar archive at all, nor gzip" * 20, dest)


def test_pack_folder_keeps_links_as_links_and_does_not_follow_linked_folders(tmp_path):
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("a")
    (folder / "linked").symlink_to(tmp_path)  # outside: must not be walked into
    (folder / "empty").mkdir()
    data = pack_folder(folder)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["empty", "linked", "sub", "sub/a.txt"]
    assert members["linked"].issym() and members["linked"].linkname == str(tmp_path)
    assert pack_folder(folder) == data  # the same bytes each time: a stable order


def test_pack_then_extract_round_trips(tmp_path):
    source = tmp_path / "source"
    (source / "d").mkdir(parents=True)
    (source / "d" / "x.sh").write_text("echo x\n")
    (source / "d" / "x.sh").chmod(0o755)
    (source / "l").symlink_to("d/x.sh")
    assert extract_tar(pack_folder(source, compress=True), tmp_path / "copy") == []
    assert (tmp_path / "copy" / "l").read_text() == "echo x\n"
    assert stat.S_IMODE((tmp_path / "copy" / "d" / "x.sh").stat().st_mode) == 0o755
