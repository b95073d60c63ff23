"""Keeping what the agent left under /logs/agent (evaluations/artifacts.py) from folders it shaped to hurt us.

Each test builds a real folder in tmp_path as an agent could have (links to secrets, FIFOs, hard
links, names with control characters, trees too deep or too large) and calls ``keep`` on it; the
store is a real folder too. Tests that give files to another uid need root, as the service has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from evaluations import artifacts
from evaluations.artifacts import UnsafeName, check_path, keep, open_artifact

ME = os.getuid()
OTHER_UID = 61234 if ME != 61234 else 61235


@pytest.fixture
def config(settings, tmp_path):
    return dataclasses.replace(settings.EXECUTOR, data_dir=tmp_path / "data", max_artifact_bytes=1024 * 1024)


@pytest.fixture
def agent(tmp_path):
    """The folder the agent wrote (its /logs/agent), owned by us as the lease would own it."""
    folder = tmp_path / "session" / "logs-agent"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("the service's secret\n")
    path.chmod(0o600)
    return path


def needs_root():
    if os.geteuid() != 0:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail("REQUIRE_SANDBOX=1 but this test gives files to another uid, which needs root")
        pytest.skip("giving a file to another uid needs root")


def write(folder: Path, relpath: str, data: bytes | str) -> Path:
    path = folder / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored(config, eval_id) -> dict[str, bytes]:
    """Every file under the evaluation's store folder, by relative path (links would show as links)."""
    root = artifacts.store_root(config) / str(eval_id)
    found = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            assert not path.is_symlink() and stat.S_ISREG(path.lstat().st_mode), path
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def reasons(kept) -> dict[str, str]:
    return {o.path: o.reason for o in kept.omitted}


# -- what is kept ---------------------------------------------------------------------------------


def test_regular_files_are_kept_sorted_by_path_with_size_and_sha256(config, agent):
    files = {
        "trajectory.json": b'{"steps": 3}',
        "sub/dir/notes.md": b"# notes\n",
        "empty": b"",
        "été/résumé.txt": "déjà vu".encode(),
        "a.txt": b"a" * 70000,
    }
    for relpath, data in files.items():
        write(agent, relpath, data)
    eval_id = uuid.uuid4()
    kept = keep(eval_id, agent, config, owner_uid=ME)
    assert kept.artifacts == [
        {"path": path, "size_bytes": len(files[path]), "sha256": sha(files[path])} for path in sorted(files)
    ]
    assert kept.omitted == [] and kept.error == ""
    assert stored(config, eval_id) == files
    store = artifacts.store_root(config)
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert stat.S_IMODE((store / str(eval_id) / "trajectory.json").stat().st_mode) == 0o600
    assert [f.name for f in store.iterdir()] == [str(eval_id)]  # no copy left half-made
    assert kept.summary() == f"artifacts: kept 5 files ({sum(map(len, files.values()))} bytes) from /logs/agent"


def test_nothing_to_keep_makes_no_folder(config, agent, tmp_path):
    (agent / "only" / "folders").mkdir(parents=True)
    assert keep(uuid.uuid4(), agent, config, owner_uid=ME).artifacts == []
    assert keep(uuid.uuid4(), tmp_path / "never-made", config, owner_uid=ME).artifacts == []
    assert not artifacts.store_root(config).exists() or not list(artifacts.store_root(config).iterdir())


def test_max_artifact_bytes_zero_keeps_nothing(config, agent):
    write(agent, "a", "x")
    kept = keep(uuid.uuid4(), agent, dataclasses.replace(config, max_artifact_bytes=0), owner_uid=ME)
    assert kept.artifacts == [] and kept.omitted == []


# -- links, special files, hard links, owners --------------------------------------------------------


def test_symbolic_links_are_never_followed(config, agent, secret, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "inner-secret").write_text("also secret")
    os.symlink("/etc/passwd", agent / "passwd")
    os.symlink(secret, agent / "secret")
    os.symlink(outside, agent / "outside-dir")
    (agent / "d").mkdir()
    os.symlink("../../secret.txt", agent / "d" / "relative")
    os.symlink("dangling-target", agent / "dangling")
    write(agent, "real.txt", "mine")
    eval_id = uuid.uuid4()
    kept = keep(eval_id, agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["real.txt"]
    assert reasons(kept) == {
        name: "a symbolic link" for name in ("passwd", "secret", "outside-dir", "d/relative", "dangling")
    }
    assert stored(config, eval_id) == {"real.txt": b"mine"}


def test_the_folder_itself_as_a_link_is_not_followed(config, tmp_path, secret):
    link = tmp_path / "logs-agent"
    os.symlink(secret.parent, link)
    kept = keep(uuid.uuid4(), link, config, owner_uid=ME)
    assert kept.artifacts == []
    assert kept.omitted[0].path == "/logs/agent" and "cannot be opened" in kept.omitted[0].reason


def test_fifos_sockets_and_devices_are_skipped_without_hanging(config, agent):
    os.mkfifo(agent / "fifo")  # opening it for reading would block forever without a writer
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(agent / "sock"))
    listener.close()
    expected = {"fifo": "a FIFO", "sock": "a socket"}
    if os.geteuid() == 0:
        os.mknod(agent / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        expected["null"] = "a device"
    write(agent, "ok", "fine")
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["ok"]
    assert reasons(kept) == expected


def test_hard_linked_files_are_skipped(config, agent, tmp_path, secret):
    """A second name for a file is how an agent would list one it could not read itself."""
    (tmp_path / "session" / "other").mkdir()
    outside = tmp_path / "session" / "other" / "private"
    outside.write_text("not the agent's to give")
    os.link(outside, agent / "linked-in")
    write(agent, "twice-a", "same inode")
    os.link(agent / "twice-a", agent / "twice-b")
    write(agent, "single", "one name")
    eval_id = uuid.uuid4()
    kept = keep(eval_id, agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["single"]
    assert reasons(kept) == {name: "a file with 2 hard links" for name in ("linked-in", "twice-a", "twice-b")}
    assert stored(config, eval_id) == {"single": b"one name"}


def test_files_and_folders_of_another_uid_are_skipped(config, agent):
    needs_root()
    write(agent, "mine.txt", "mine")
    theirs = write(agent, "theirs.txt", "planted")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    write(agent, "their-dir/inside.txt", "planted too")
    os.chown(agent / "their-dir", OTHER_UID, OTHER_UID)
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["mine.txt"]
    assert reasons(kept) == {
        "theirs.txt": f"owned by uid {OTHER_UID}, not the evaluation's",
        "their-dir": f"owned by uid {OTHER_UID}, not the evaluation's",
    }
    # Without an owner to check (no sandbox), both are kept.
    unchecked = keep(uuid.uuid4(), agent, config, owner_uid=None)
    assert [a["path"] for a in unchecked.artifacts] == ["mine.txt", "their-dir/inside.txt", "theirs.txt"]


def test_unreadable_modes_set_by_the_agent_do_not_stop_the_copy(config, agent):
    needs_root()  # root reads whatever mode; a service without root notes the file instead
    write(agent, "locked/file", "chmod 000 does not hide it from the executor")
    (agent / "locked" / "file").chmod(0)
    (agent / "locked").chmod(0)
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["locked/file"]


# -- bounds -------------------------------------------------------------------------------------------


def test_files_past_the_byte_cap_are_left_out_whole_and_smaller_later_ones_still_fit(config, agent):
    write(agent, "a", b"a" * 10)
    write(agent, "b", b"b" * 100)
    write(agent, "c", b"c" * 10)
    write(agent, "d", b"d" * 1)
    eval_id = uuid.uuid4()
    kept = keep(eval_id, agent, dataclasses.replace(config, max_artifact_bytes=21), owner_uid=ME)
    assert [(a["path"], a["size_bytes"]) for a in kept.artifacts] == [("a", 10), ("c", 10), ("d", 1)]
    assert reasons(kept) == {"b": "100 bytes: over MAX_ARTIFACT_BYTES, 11 bytes were left"}
    assert stored(config, eval_id) == {"a": b"a" * 10, "c": b"c" * 10, "d": b"d"}
    assert "left out 1: b (100 bytes: over MAX_ARTIFACT_BYTES" in kept.summary()


def test_a_file_larger_than_stat_said_is_counted_while_copied(config, agent, monkeypatch):
    """The size is counted on the bytes read: a file that grew after its stat is dropped whole, not cut."""
    write(agent, "grows", b"g" * 5000)
    write(agent, "small", b"s" * 10)
    real_fstat = os.fstat

    def stale_fstat(fd):
        st = real_fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_size == 5000:
            return os.stat_result((*st[:6], 100, *st[7:]))  # what stat said before the file grew
        return st

    monkeypatch.setattr(artifacts.os, "fstat", stale_fstat)
    eval_id = uuid.uuid4()
    kept = keep(eval_id, agent, dataclasses.replace(config, max_artifact_bytes=1000), owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["small"]
    assert reasons(kept) == {"grows": "grew while copied: over MAX_ARTIFACT_BYTES, 1000 bytes were left"}
    assert stored(config, eval_id) == {"small": b"s" * 10}


def test_a_huge_sparse_file_is_not_read(config, agent):
    with open(agent / "sparse", "wb") as handle:
        handle.truncate(1 << 40)  # 1 TiB of nothing: refused on its size, never read
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert kept.artifacts == [] and reasons(kept)["sparse"].startswith(f"{1 << 40} bytes: over MAX_ARTIFACT_BYTES")


def test_deep_trees_are_cut_at_max_parts(config, agent):
    deepest_kept = "/".join(["d"] * (artifacts.MAX_PARTS - 1) + ["ok"])
    write(agent, deepest_kept, "just deep enough")
    too_deep = "/".join(["d"] * artifacts.MAX_PARTS + ["lost"])
    write(agent, too_deep, "one level too deep")
    # Far deeper than PATH_MAX: the walk stops at MAX_PARTS and never builds the long path.
    fd = os.open(agent, os.O_RDONLY)
    for _ in range(600):
        os.mkdir("deeper-than-path-max-" + "x" * 20, dir_fd=fd)
        fd2 = os.open("deeper-than-path-max-" + "x" * 20, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = fd2
    os.close(fd)
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == [deepest_kept]
    assert reasons(kept) == {
        "/".join(["d"] * artifacts.MAX_PARTS): f"a folder more than {artifacts.MAX_PARTS - 1} levels deep",
        # A path shown in a log line is cut at 200 characters.
        "/".join(["deeper-than-path-max-" + "x" * 20] * artifacts.MAX_PARTS)[:200] + "...": (
            f"a folder more than {artifacts.MAX_PARTS - 1} levels deep"
        ),
    }


def test_paths_over_max_path_bytes_are_skipped(config, agent):
    long_path = "/".join(["n" * 250] * 5)  # 1254 bytes, each name legal
    write(agent, long_path, "long")
    write(agent, "short", "short")
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["short"]
    assert list(reasons(kept).values()) == [f"a path longer than {artifacts.MAX_PATH_BYTES} bytes"]


def test_the_file_count_is_bounded_in_path_order(config, agent, monkeypatch):
    monkeypatch.setattr(artifacts, "MAX_FILES", 3)
    for name in ("e", "d", "c", "b", "a"):
        write(agent, name, name)
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["a", "b", "c"]
    assert reasons(kept) == {"d": "over 3 files", "e": "over 3 files"}


def test_the_walk_is_bounded_and_says_so(config, agent, monkeypatch):
    monkeypatch.setattr(artifacts, "MAX_ENTRIES", 10)
    for n in range(30):
        write(agent, f"f{n:02}", "x")
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert len(kept.artifacts) == 10
    assert reasons(kept) == {"/logs/agent": "holds over 10 entries: the rest were not looked at"}


def test_the_summary_names_at_most_twenty_omissions(config, agent):
    for n in range(25):
        os.mkfifo(agent / f"fifo{n:02}")
    summary = keep(uuid.uuid4(), agent, config, owner_uid=ME).summary()
    assert summary.startswith("artifacts: kept 0 files (0 bytes) from /logs/agent; left out 25: fifo00 (a FIFO); ")
    assert "fifo19 (a FIFO); and 5 more" in summary and "fifo20" not in summary


# -- names -------------------------------------------------------------------------------------------


WEIRD_NAMES = {
    b"new\nline": "U+000A",
    b"esc\x1b[31mred": "U+001B",
    b"del\x7f": "U+007F",
    "rtl\u202eexe.txt".encode(): "U+202E",
    "zero\u200bwidth".encode(): "U+200B",
    b"not-utf8-\xff\xfe": "not valid UTF-8",
    b"back\\slash": "backslash",
}


def test_unsafe_names_are_skipped_and_shown_escaped(config, agent):
    for raw in WEIRD_NAMES:
        with open(os.path.join(os.fsencode(agent), raw), "wb") as handle:
            handle.write(b"x")
    os.mkdir(os.path.join(os.fsencode(agent), b"dir\x01"))
    with open(os.path.join(os.fsencode(agent), b"dir\x01", b"inside"), "wb") as handle:
        handle.write(b"x")
    write(agent, "fine name (1).txt", "ok")
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert [a["path"] for a in kept.artifacts] == ["fine name (1).txt"]
    assert len(kept.omitted) == len(WEIRD_NAMES) + 1  # the folder, not what it holds
    for omission in kept.omitted:
        assert omission.reason.startswith("unsafe name: ")
        assert omission.path.isprintable() and omission.path.isascii(), omission.path
    for raw, why in WEIRD_NAMES.items():
        assert any(why in o.reason and o.path == ascii(os.fsdecode(raw)) for o in kept.omitted), raw
    assert kept.summary().isprintable()


@pytest.mark.parametrize(
    "path",
    ["", "/etc/passwd", "../x", "a/../b", "a/./b", "./a", "a//b", "a/", ".", "..", "a\\b", "a\x00b", "a\nb",
     "\u202e", "x" * 256, "/".join(["d"] * 17), "\udcff"],
)  # fmt: skip
def test_check_path_refuses_unsafe_names(path):
    with pytest.raises(UnsafeName):
        check_path(path)


@pytest.mark.parametrize("path", ["a", "a/b/c.json", ".hidden", "..x", "x..", "été/日本.txt", "a b", "x" * 255])
def test_check_path_accepts_safe_names(path):
    assert check_path(path) == path.split("/")


# -- races with the copy ------------------------------------------------------------------------------


def test_a_folder_swapped_for_a_link_after_the_walk_is_not_followed(config, agent, tmp_path, monkeypatch):
    """Belt and braces (no agent process is alive at keep): the copy reopens every folder without links."""
    write(agent, "sub/file", "listed while it was real")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("secret behind the swapped link")
    walk_files = artifacts._Walk.files

    def swap_after_listing(self):
        found = walk_files(self)
        os.rename(agent / "sub", tmp_path / "moved-away")
        os.symlink(outside, agent / "sub")
        return found

    monkeypatch.setattr(artifacts._Walk, "files", swap_after_listing)
    eval_id = uuid.uuid4()
    kept = keep(eval_id, agent, config, owner_uid=ME)
    assert kept.artifacts == []
    assert reasons(kept) == {"sub/file": "its folder changed after it was listed"}
    assert not (artifacts.store_root(config) / str(eval_id)).exists()


def test_a_file_swapped_for_a_fifo_after_the_walk_does_not_hang(config, agent, monkeypatch):
    write(agent, "file", "listed while it was a file")
    walk_files = artifacts._Walk.files

    def swap_after_listing(self):
        found = walk_files(self)
        os.unlink(agent / "file")
        os.mkfifo(agent / "file")
        return found

    monkeypatch.setattr(artifacts._Walk, "files", swap_after_listing)
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert kept.artifacts == [] and reasons(kept) == {"file": "it changed after it was listed"}


# -- the store ----------------------------------------------------------------------------------------


def test_an_unwritable_store_keeps_nothing_and_says_why(config, agent):
    config.data_dir.parent.mkdir(parents=True, exist_ok=True)
    config.data_dir.write_text("a file where the data folder should be")
    write(agent, "a", "x")
    kept = keep(uuid.uuid4(), agent, config, owner_uid=ME)
    assert kept.artifacts == [] and "cannot be used" in kept.error
    assert "artifacts: kept 0 files (0 bytes) from /logs/agent; the artifact store" in kept.summary()


def test_keeping_again_replaces_and_remove_removes(config, agent, tmp_path):
    eval_id = uuid.uuid4()
    write(agent, "old", "first run")
    keep(eval_id, agent, config, owner_uid=ME)
    os.unlink(agent / "old")
    write(agent, "new", "second run")
    assert [a["path"] for a in keep(eval_id, agent, config, owner_uid=ME).artifacts] == ["new"]
    assert stored(config, eval_id) == {"new": b"second run"}
    other = uuid.uuid4()
    keep(other, agent, config, owner_uid=ME)
    assert {f.eval_id for f in artifacts.stored_folders(config)} == {eval_id, other}
    assert artifacts.remove([eval_id, uuid.uuid4()], config) == 1
    assert [f.eval_id for f in artifacts.stored_folders(config)] == [other]


def test_open_artifact_serves_only_stored_regular_files(config, agent, secret):
    eval_id = uuid.uuid4()
    write(agent, "dir/file.txt", "kept")
    keep(eval_id, agent, config, owner_uid=ME)
    with open_artifact(eval_id, "dir/file.txt", config) as handle:
        assert handle.read() == b"kept"
    with pytest.raises(UnsafeName):
        open_artifact(eval_id, "../../secret.txt", config)
    with pytest.raises(FileNotFoundError):
        open_artifact(eval_id, "dir/absent", config)
    with pytest.raises(FileNotFoundError):
        open_artifact(uuid.uuid4(), "dir/file.txt", config)
    with pytest.raises(FileNotFoundError):
        open_artifact(eval_id, "dir", config)  # a folder is not a file to serve
    # Even a link planted in the store itself is not followed.
    os.symlink(secret, artifacts.store_root(config) / str(eval_id) / "dir" / "link")
    with pytest.raises(FileNotFoundError):
        open_artifact(eval_id, "dir/link", config)
    with pytest.raises(ValueError):
        open_artifact("../../etc", "x", config)  # not an eval id: no path is built from it


AGENT_SCRIPT = r"""
cd "$1"
printf '{"step": 1}\n' > trajectory.jsonl
mkdir -p deep/er && printf notes > deep/er/notes.txt
ln -s /etc/shadow shadow
mkfifo fifo
printf 'two names' > pair-a && ln pair-a pair-b
printf x > "$(printf 'new\nline')"
echo written
"""


def test_what_a_real_process_of_another_uid_wrote(config):
    """The agent as it runs: a process of its own uid writing the folder; the executor (root) keeps it."""
    needs_root()
    import subprocess
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="artifacts-agent-"))
    try:
        base.chmod(0o755)  # pytest's tmp_path is root's 0700: the agent's uid could not reach it
        folder = base / "logs-agent"
        folder.mkdir()
        os.chown(folder, OTHER_UID, OTHER_UID)
        done = subprocess.run(
            ["/bin/sh", "-ec", AGENT_SCRIPT, "agent", str(folder)],
            user=OTHER_UID, group=OTHER_UID, extra_groups=[], capture_output=True, text=True, timeout=60, cwd="/",
        )  # fmt: skip
        assert done.stdout == "written\n", done.stderr
        eval_id = uuid.uuid4()
        kept = keep(eval_id, folder, config, owner_uid=OTHER_UID)
        assert [(a["path"], a["size_bytes"]) for a in kept.artifacts] == [
            ("deep/er/notes.txt", 5),
            ("trajectory.jsonl", 12),
        ]
        assert set(reasons(kept)) == {"fifo", "pair-a", "pair-b", "shadow", ascii("new\nline")}
        assert stored(config, eval_id) == {"deep/er/notes.txt": b"notes", "trajectory.jsonl": b'{"step": 1}\n'}
        # Its files are its uid's: kept for its uid, none of them for another's.
        assert keep(uuid.uuid4(), folder, config, owner_uid=ME).artifacts == []
    finally:
        shutil.rmtree(base)


# -- several sources (SPEC §23: /logs/artifacts and the task's artifacts list) --------------------


def test_sources_are_kept_in_order_under_their_listed_paths_with_their_places(config, agent, tmp_path, secret):
    """/logs/agent's files by their own paths, a folder source under its listed prefix, one file as its
    listed path; a later file whose listed path an earlier one took is left out; a file source that is
    a link, and a missing one, are named; each placed file knows where a separate verifier finds it."""
    write(agent, "artifacts/logs/artifacts/note.txt", "from /logs/agent")  # claims the listed path first
    convention = tmp_path / "session" / "agent-artifacts"
    write(convention, "note.txt", "from /logs/artifacts")
    write(convention, "sub/run.sh", "#!/bin/sh\n").chmod(0o750)
    image = tmp_path / "image"
    write(image, "app/out.txt", "42")
    os.symlink(secret, image / "app" / "link.txt")

    def entry(path):
        return lambda: (os.open(image / "app", os.O_RDONLY | os.O_DIRECTORY), path)

    sources = [
        artifacts.Source.folder(agent, ME),
        artifacts.Source.folder(
            convention, ME, "/logs/artifacts", listed=("artifacts", "logs", "artifacts"), placed_at="/logs/artifacts"
        ),  # fmt: skip
        artifacts.Source("/app/out.txt", ("artifacts", "app", "out.txt"), entry("out.txt"), placed_at="/app/out.txt"),
        artifacts.Source("/app/link.txt", ("artifacts", "app", "link.txt"), entry("link.txt"), placed_at="/x"),
        artifacts.Source("/app/none", ("artifacts", "app", "none"), entry("none"), placed_at="/app/none"),
    ]
    eval_id = uuid.uuid4()
    kept = artifacts.keep_sources(eval_id, sources, config)
    assert [a["path"] for a in kept.artifacts] == [
        "artifacts/app/out.txt", "artifacts/logs/artifacts/note.txt", "artifacts/logs/artifacts/sub/run.sh"]  # fmt: skip
    assert stored(config, eval_id)["artifacts/logs/artifacts/note.txt"] == b"from /logs/agent"
    assert reasons(kept) == {
        "artifacts/logs/artifacts/note.txt": "its listed path is another file's",
        "/app/link.txt": "a symbolic link",
        "/app/none": "not there",
    }
    assert kept.placed == {
        "artifacts/app/out.txt": artifacts.Placement("/app/out.txt", 0o644),
        "artifacts/logs/artifacts/sub/run.sh": artifacts.Placement("/logs/artifacts/sub/run.sh", 0o754),
    }
    assert kept.summary().startswith(
        "artifacts: kept 3 files (28 bytes) from /logs/agent, /logs/artifacts, /app/out.txt, /app/link.txt, /app/none;"
    )


def test_a_folder_claimed_by_a_file_leaves_the_files_below_it_out(config, agent, tmp_path):
    write(agent, "artifacts", "a file where a folder of listed paths goes")
    other = tmp_path / "other"
    write(other, "x.txt", "x")
    source = artifacts.Source.folder(other, ME, "/other", listed=("artifacts", "other"))
    kept = artifacts.keep_sources(uuid.uuid4(), [artifacts.Source.folder(agent, ME), source], config)
    assert [a["path"] for a in kept.artifacts] == ["artifacts"]
    assert reasons(kept) == {"artifacts/other/x.txt": "its listed path is another file's"}


# -- a folder's exclude patterns (Harbor's ArtifactConfig.exclude: tar --exclude) -------------------

TREE = (
    "keep.txt", "cache.pyc", "src/a.py", "src/a.pyc", "src/node_modules/x/y.js", "node_modules/z.js",
    "build/tmp/t.o", "build/out.bin", "deep/build/tmp/u.o", "logs/run 1.log", "logs/run2.log",
)  # fmt: skip
PATTERNS = (
    ("*.pyc",), ("node_modules",), ("build/tmp",), ("src",), ("./keep.txt",), ("src/*",), ("run 1.log",),
    ("*/tmp",), ("logs/*.log", "keep*"), ("b*",), ("nothing",),
)  # fmt: skip


@pytest.mark.parametrize("patterns", PATTERNS, ids=lambda p: "+".join(p))
def test_exclude_leaves_out_what_gnu_tar_leaves_out(config, tmp_path, patterns):
    """The same folder through ``tar -C SOURCE -cf - --exclude=... .`` (Harbor's download of a folder
    artifact) and through the walk: the same files, and nothing named as an omission."""
    folder = tmp_path / "out"
    for path in TREE:
        write(folder, path, path)
    flags = [f"--exclude={pattern}" for pattern in patterns]
    listing = subprocess.run(["tar", "-C", folder, "-cf", "-", *flags, "."], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(listing)) as archive:
        by_tar = sorted(m.name.removeprefix("./") for m in archive.getmembers() if m.isfile())
    source = artifacts.Source.folder(folder, ME, "/out", listed=("artifacts", "out"), exclude=patterns)
    kept = artifacts.keep_sources(uuid.uuid4(), [source], config)
    assert [a["path"].removeprefix("artifacts/out/") for a in kept.artifacts] == by_tar
    assert kept.omitted == []


def test_exclude_is_matched_on_names_the_walk_never_follows(config, tmp_path, secret):
    """A pattern changes what is left out, never what is looked at: a link is still a link."""
    folder = tmp_path / "out"
    write(folder, "a.txt", "a")
    os.symlink(secret, folder / "b.txt")
    source = artifacts.Source.folder(folder, ME, "/out", listed=("artifacts", "out"), exclude=("a.*",))
    kept = artifacts.keep_sources(uuid.uuid4(), [source], config)
    assert kept.artifacts == [] and reasons(kept) == {"artifacts/out/b.txt": "a symbolic link"}
