"""Task archive extraction (SPEC sections 4 and 7) with real hostile archives."""

from __future__ import annotations

import gzip
import io
import os
import stat
import subprocess
import tarfile
import zipfile
import zlib

import pytest

from evaluations.pipeline.archive import ArchiveError, extract_archive, find_task_root, list_archive
from tests.helpers.archives import (
    FORMATS,
    Exec,
    minimal_task,
    tar_member,
    write_archive,
    write_lying_zip_bomb,
    write_tar,
    write_zip,
    zip_member,
)

CAPS = {"max_members": 1000, "max_bytes": 10 * 1024 * 1024}


def extract(archive, dest, **caps):
    """Extract; list_archive, which writes nothing, lists exactly what was extracted."""
    extracted = extract_archive(archive, dest, **{**CAPS, **caps})
    listed = list_archive(archive, **{**CAPS, **caps})
    assert listed == extracted
    assert sorted(listed.files | listed.folders) == all_files(dest)
    return dest


def refusal(archive, dest, *, listed=True, **caps) -> str:
    """extract_archive's refusal; list_archive refuses alike, unless only writing tells (``listed=False``)."""
    with pytest.raises(ArchiveError) as info:
        extract_archive(archive, dest, **{**CAPS, **caps})
    if listed:
        with pytest.raises(ArchiveError) as without_writing:
            list_archive(archive, **{**CAPS, **caps})
        assert str(without_writing.value) == str(info.value)
    return str(info.value)


def all_files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


# -- good archives ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_extracts_each_format_with_safe_modes(tmp_path, fmt):
    files = minimal_task({"tests/helper.py": "x = 1\n", "tests/data/": b"", "bin/run": Exec("#!/bin/sh\n")})
    archive = write_archive(tmp_path / "task.bin", files, fmt)  # the name says nothing
    dest = extract(archive, tmp_path / "out")
    assert find_task_root(dest) == dest
    assert (dest / "prompt.md").read_text() == "Fix the bug.\n"
    assert all_files(dest) == [
        "bin",
        "bin/run",
        "prompt.md",
        "tests",
        "tests/data",
        "tests/fail_to_pass_1.sh",
        "tests/helper.py",
        "workspace.yaml",
    ]
    assert stat.S_IMODE((dest / "bin/run").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "tests/fail_to_pass_1.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "prompt.md").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "tests/data").stat().st_mode) == 0o755


@pytest.mark.parametrize("fmt", FORMATS)
def test_single_top_level_folder_is_the_task_root(tmp_path, fmt):
    archive = write_archive(tmp_path / "task", minimal_task(), fmt, top="my-task")
    dest = extract(archive, tmp_path / "out")
    assert find_task_root(dest) == dest / "my-task"


def test_macos_litter_beside_the_top_folder_is_ignored(tmp_path):
    files = {f"t/{k}": v for k, v in minimal_task().items()} | {"__MACOSX/t/._prompt.md": b"junk"}
    dest = extract(write_archive(tmp_path / "a.zip", files, "zip"), tmp_path / "out")
    assert find_task_root(dest) == dest / "t"


def test_special_mode_bits_are_dropped(tmp_path):
    members = [(tar_member("workspace.yaml", mode=0o6777), b"x"), (tar_member("d", tarfile.DIRTYPE, mode=0o1777), None)]
    dest = extract(write_tar(tmp_path / "a.tar", members, gzip=False), tmp_path / "out")
    assert stat.S_IMODE((dest / "workspace.yaml").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "d").stat().st_mode) == 0o755


def test_dot_slash_names_are_fine(tmp_path):
    members = [(tar_member("./", tarfile.DIRTYPE), None), (tar_member("./workspace.yaml"), b"a: 1\n")]
    dest = extract(write_tar(tmp_path / "a.tgz", members), tmp_path / "out")
    assert find_task_root(dest) == dest


# -- finding the root ----------------------------------------------------------------


def test_missing_workspace_yaml_is_named(tmp_path):
    dest = extract(write_archive(tmp_path / "a", {"prompt.md": "p"}, "zip"), tmp_path / "out")
    with pytest.raises(ArchiveError) as info:
        find_task_root(dest)
    assert str(info.value) == (
        "task archive has no workspace.yaml, task.toml (Harbor) or task.yaml (Terminal-Bench) "
        "at its root or in its single top-level folder"
    )


@pytest.mark.parametrize("name", ["task.toml", "task.yaml"])
def test_harbor_and_terminal_bench_roots_are_found(tmp_path, name):
    at_root = extract(write_archive(tmp_path / "a", {name: "x", "instruction.md": "p"}), tmp_path / "a-out")
    assert find_task_root(at_root) == at_root
    nested = extract(write_archive(tmp_path / "b", {name: "x"}, top="t"), tmp_path / "b-out")
    assert find_task_root(nested) == nested / "t"


def test_two_top_level_folders_are_not_a_task_root(tmp_path):
    files = {f"a/{k}": v for k, v in minimal_task().items()} | {"b/x": "y"}
    dest = extract(write_archive(tmp_path / "a", files), tmp_path / "out")
    with pytest.raises(ArchiveError, match="no workspace.yaml"):
        find_task_root(dest)


# -- not an archive -----------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"", b"just some text, not an archive\n" * 40, b"BZh91AY&SY" + b"\0" * 600, gzip.compress(b"not a tar" * 100)],
    ids=["empty", "text", "bzip2", "gzip-of-text"],
)
def test_unrecognised_content(tmp_path, content):
    archive = tmp_path / "task.tar.gz"
    archive.write_bytes(content)
    assert refusal(archive, tmp_path / "out") == "task archive is not a .tar.gz, .tar or .zip file"


def test_truncated_archive_is_corrupt(tmp_path):
    archive = write_archive(tmp_path / "a.tgz", {"big": os.urandom(200_000)})
    archive.write_bytes(archive.read_bytes()[:50_000])
    assert "corrupt" in refusal(archive, tmp_path / "out")


# -- unsafe names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../x", "task archive member '../x' has a '..' component"),
        ("a/../../x", "task archive member 'a/../../x' has a '..' component"),
        ("a/..", "has a '..' component"),
        ("/etc/cron.d/x", "task archive member '/etc/cron.d/x' has an absolute name"),
        ("a\nb", "has a NUL or newline in its name"),
        ("a\rb", "has a NUL or newline in its name"),
    ],
)
@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_unsafe_names_are_refused(tmp_path, fmt, name, message):
    if fmt == "zip":
        archive = write_zip(tmp_path / "a.zip", [(zip_member("ok"), b"1"), (zip_member(name), b"evil")])
    else:
        archive = write_tar(tmp_path / "a.tar", [(tar_member("ok"), b"1"), (tar_member(name), b"evil")])
    dest = tmp_path / "sub" / "out"
    assert message in refusal(archive, dest)
    assert all_files(tmp_path / "sub") == ["out"]  # refused before anything was written
    assert not (tmp_path / "x").exists() and not (tmp_path / "sub" / "x").exists()


def test_nul_in_a_tar_name_is_refused(tmp_path):
    long_name = "d/" + "n" * 120 + "\0/../../escape"  # long: stored in a pax header, NUL and all
    archive = write_tar(tmp_path / "a.tar", [(tar_member(long_name), b"evil")], gzip=False)
    assert "has a NUL or newline in its name" in refusal(archive, tmp_path / "out")


def test_nul_in_a_zip_name_is_refused(tmp_path):
    # zipfile cuts names at NUL when writing, so patch the bytes afterwards.
    archive = write_zip(tmp_path / "a.zip", [(zip_member("evilXname"), b"x")])
    archive.write_bytes(archive.read_bytes().replace(b"evilXname", b"evil\0name"))
    assert "'evil\\x00name' has a NUL or newline in its name" in refusal(archive, tmp_path / "out")


# -- links, devices, FIFOs -------------------------------------------------------------


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (tar_member("link", tarfile.SYMTYPE, linkname="/etc/passwd"), "'link' is a symbolic link (to '/etc/passwd')"),
        (
            tar_member("hard", tarfile.LNKTYPE, linkname="../../etc/passwd"),
            "'hard' is a hard link (to '../../etc/passwd')",
        ),
        (tar_member("null", tarfile.CHRTYPE), "'null' is a device"),
        (tar_member("sda", tarfile.BLKTYPE), "'sda' is a device"),
        (tar_member("pipe", tarfile.FIFOTYPE), "'pipe' is a FIFO"),
    ],
    ids=["symlink", "hardlink", "chardev", "blockdev", "fifo"],
)
def test_tar_links_devices_and_fifos_are_refused(tmp_path, member, message):
    archive = write_tar(tmp_path / "a.tgz", [(tar_member("workspace.yaml"), b"a: 1"), (member, None)])
    assert message in refusal(archive, tmp_path / "out")
    assert not (tmp_path / "out" / "workspace.yaml").exists()


def test_symlink_then_a_file_through_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    members = [
        (tar_member("escape", tarfile.SYMTYPE, linkname=str(outside)), None),
        (tar_member("escape/planted.sh"), b"evil"),
    ]
    assert "'escape' is a symbolic link" in refusal(write_tar(tmp_path / "a.tgz", members), tmp_path / "out")
    assert list(outside.iterdir()) == []


def test_planted_symlink_in_the_destination_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    archive = write_archive(tmp_path / "a.tgz", {"sub/file": "evil"})
    assert "sub is a symbolic link" in refusal(archive, dest, listed=False)  # the destination's, not the archive's
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("file_type", "message"),
    [
        (stat.S_IFLNK, "is a symbolic link"),
        (stat.S_IFCHR, "is a device, FIFO or socket"),
        (stat.S_IFIFO, "is a device, FIFO or socket"),
    ],
)
def test_zip_links_devices_and_fifos_are_refused(tmp_path, file_type, message):
    archive = write_zip(tmp_path / "a.zip", [(zip_member("thing", file_type=file_type), b"/etc/passwd")])
    assert f"task archive member 'thing' {message}" in refusal(archive, tmp_path / "out")


def test_duplicate_members_are_refused(tmp_path):
    archive = write_tar(tmp_path / "a.tgz", [(tar_member("f"), b"1"), (tar_member("f"), b"2")])
    assert "'f' appears twice" in refusal(archive, tmp_path / "out")


# -- caps -------------------------------------------------------------------------------


def cut_gzip(path, data: bytes) -> None:
    """A gzip stream of ``data`` that stops there, with no end: reading past ``data`` is an EOFError."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: gzip framing
    path.write_bytes(compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH))


def test_too_many_tar_members_fails_fast(tmp_path):
    # The stream is cut 100 headers after the cap: a walk that read on (counting
    # only after listing every member) would reach the cut and call the archive
    # corrupt. Naming the cap shows it stopped within a few headers of it.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(10_100):
            tf.addfile(tar_member(f"f{i}", mode=0o644))
    archive = tmp_path / "many.tgz"
    cut_gzip(archive, buf.getvalue()[: 10_100 * 512])  # the headers only, no end-of-archive blocks
    assert refusal(archive, tmp_path / "out", max_members=10_000) == "task archive has more than 10000 members"
    assert not any((tmp_path / "out").iterdir())


def test_too_many_zip_members_fails_fast(tmp_path):
    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for i in range(20_000):  # under 65 535: the count is in the classic end record, not zip64's
            zf.writestr(zipfile.ZipInfo(f"f{i}"), b"")
    # Damage the central directory's first entry: parsing the entries (zipfile
    # does all of them on open) would call the archive corrupt. The refusal
    # quotes the end record's count, read before any entry was parsed.
    raw = bytearray(archive.read_bytes())
    raw[raw.find(b"PK\x01\x02") : raw.find(b"PK\x01\x02") + 4] = b"XXXX"
    archive.write_bytes(bytes(raw))
    assert refusal(archive, tmp_path / "out", max_members=10_000) == "task archive has more than 10000 members (20000)"
    assert not any((tmp_path / "out").iterdir())


def test_member_count_at_the_cap_is_fine(tmp_path):
    archive = write_archive(tmp_path / "a.zip", {f"f{i}": "x" for i in range(10)}, "zip")
    extract(archive, tmp_path / "out", max_members=10)
    assert "more than 9 members" in refusal(archive, tmp_path / "out2", max_members=9)


@pytest.mark.parametrize("fmt", FORMATS)
def test_declared_size_over_the_cap_is_refused_before_writing(tmp_path, fmt):
    archive = write_archive(tmp_path / "a", {"a": b"x" * 600, "b": b"y" * 600}, fmt)
    message = refusal(archive, tmp_path / "out", max_bytes=1000)
    assert message == "task archive would extract to more than 1000 bytes (declared sizes, at member 'b')"
    assert not any((tmp_path / "out").iterdir())
    extract(archive, tmp_path / "ok", max_bytes=1200)  # exactly at the cap is fine


def test_zip_bomb_with_lying_sizes_stops_early(tmp_path):
    archive = write_lying_zip_bomb(tmp_path / "bomb.zip", real_size=200 * 1024 * 1024, declared_size=1000)
    assert archive.stat().st_size < 1024 * 1024
    list_archive(archive, **{**CAPS, "max_bytes": 1024 * 1024})  # its headers lie: only writing tells
    # Replace its deflate data by 16 MiB of zeros then a block of the reserved
    # type: reading on past the cap would report that damage ("invalid block
    # type") instead of stopping where it does.
    raw = bytearray(archive.read_bytes())
    local = raw.find(b"PK\x03\x04")
    data = local + 30 + int.from_bytes(raw[local + 26 : local + 28], "little")
    data += int.from_bytes(raw[local + 28 : local + 30], "little")
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate, as in a zip
    damaged = compressor.compress(b"\0" * (16 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH) + b"\x07"
    raw[data : data + len(damaged)] = damaged  # the rest of the old data follows, never reached
    archive.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError) as info:
        extract(archive, tmp_path / "out", max_bytes=1024 * 1024)
    # zipfile stops at the declared size (its CRC then fails); our running count stops at the cap.
    assert str(info.value) in (
        "task archive is corrupt (Bad CRC-32 for file 'bomb.bin')",
        "task archive extracts to more than 1048576 bytes (at member 'bomb.bin')",
    )
    written = sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert written <= 1024 * 1024


def test_actual_bytes_are_counted_across_members(tmp_path):
    # Sizes are honest here, so the declared check fires; the archive with one
    # byte less fits, proving the running count allows exactly max_bytes.
    archive = write_archive(tmp_path / "a.zip", {f"f{i}": b"z" * 100 for i in range(10)}, "zip")
    extract(archive, tmp_path / "out", max_bytes=1000)
    assert "more than 999 bytes" in refusal(archive, tmp_path / "out2", max_bytes=999)


def test_encrypted_zip_member_is_refused(tmp_path):
    archive = write_zip(tmp_path / "a.zip", [(zip_member("secret"), b"x")])
    raw = bytearray(archive.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.find(signature)
        raw[at + offset] |= 0x1  # general purpose flag: encrypted
    archive.write_bytes(bytes(raw))
    assert "'secret' is encrypted" in refusal(archive, tmp_path / "out")


def test_empty_zip_extracts_to_nothing(tmp_path):
    archive = tmp_path / "empty.zip"
    with zipfile.ZipFile(archive, "w"):
        pass
    dest = extract(archive, tmp_path / "out")
    assert list(dest.iterdir()) == []


def test_plain_tar_without_ustar_magic_is_recognised(tmp_path):
    archive = tmp_path / "v7.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tar_member("workspace.yaml")
        info.size = 5
        tf.addfile(info, io.BytesIO(b"a: 1\n"))
    raw = bytearray(buf.getvalue())
    raw[257:265] = b"\0" * 8  # drop the magic: an old v7 header, checksum recomputed
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw[:512])
    archive.write_bytes(bytes(raw))
    dest = extract(archive, tmp_path / "out")
    assert (dest / "workspace.yaml").read_bytes() == b"a: 1\n"


def test_damaged_header_after_the_first_is_not_a_quiet_end(tmp_path):
    # tarfile itself stops listing at a bad header after the first one.
    archive = write_archive(tmp_path / "a.tar", {"f": b"x" * 1000, "g": b"y" * 10}, "tar")
    archive.write_bytes(archive.read_bytes()[: 2048 + 300])  # cut inside the second header
    assert "corrupt" in refusal(archive, tmp_path / "out")
    garbage = write_archive(tmp_path / "b.tar", {"f": b"x"}, "tar")
    garbage.write_bytes(garbage.read_bytes() + b"garbage after the end")
    assert refusal(garbage, tmp_path / "out2") == (
        "task archive is corrupt (unreadable data where a member header should be)"
    )


def test_compressed_zeros_after_the_end_are_bounded(tmp_path):
    # 8 MiB of zeros after the end, then the stream is cut: reading the padding
    # to its end (not stopping at the 1 MiB bound) would reach the cut and say
    # so, instead of naming the padding.
    write_tar(tmp_path / "inner.tar", [(tar_member("workspace.yaml"), b"a: 1\n")], gzip=False)
    archive = tmp_path / "padded.tgz"
    cut_gzip(archive, (tmp_path / "inner.tar").read_bytes() + b"\0" * (8 << 20))
    assert refusal(archive, tmp_path / "out") == "task archive is corrupt (too much padding after the last member)"


def test_a_full_disk_is_ours_not_the_archives_whatever_the_subject(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs takes root")
    archive = write_archive(tmp_path / "a.tgz", {"agent.py": "", "weights.bin": b"\0" * (1 << 20)})
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        with pytest.raises(ArchiveError) as info:
            extract_archive(archive, small / "code", **CAPS, subject="agent archive")
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert info.value.transient, info.value
    assert str(info.value).startswith("agent archive cannot be extracted (")
