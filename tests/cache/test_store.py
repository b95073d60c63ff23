"""The workspace cache's folder (evaluations/cache/): building, checking, evicting, mounting, clearing.

Real folders, real locks, real mounts and a real killed process; the pipeline's use of it is
tests/pipeline/test_cache_e2e.py.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from evaluations.cache import mounts
from evaluations.cache.store import Store, cache_key
from evaluations.models import Evaluation, Status
from evaluations.worker.reaper import tend_cache

UID = 60999  # outside the sandbox uid pool the other tests lease from


def _session(tmp_path: Path, name: str = "s" * 36) -> Path:
    """A session-like folder with repo/, venv/ and home/ filled as an install step might leave them."""
    root = tmp_path / "sessions" / name
    for folder in ("repo/pkg", "venv/bin", "venv/lib/site-packages", "home/.cache"):
        (root / folder).mkdir(parents=True)
    (root / "repo" / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "venv" / "bin" / "tool").write_text(f"#!{root}/venv/bin/python3\nprint('tool')\n")
    (root / "venv" / "lib" / "site-packages" / "editable.pth").write_text(f"{root}/repo\n")
    (root / "venv" / "lib" / "site-packages" / "mod.pyc").write_bytes(b"\0\0" + os.fsencode(root) + b"\0")
    (root / "venv" / "bin" / "python3").symlink_to("/usr/bin/python3")
    (root / "venv" / "bin" / "back").symlink_to(f"{root}/repo")
    (root / "home" / ".cache" / "note").write_text("cached\n")
    for path in [root, *root.rglob("*")]:
        os.chown(path, UID, UID, follow_symlinks=False)
    return root


def _build(store: Store, tmp_path: Path, key: str, *, name: str = "s" * 36, size_pad: int = 0, empty_files: int = 0):
    session = _session(tmp_path, name)
    if size_pad:
        (session / "home" / "pad").write_bytes(b"x" * size_pad)
    if empty_files:
        many = session / "venv" / "many"
        many.mkdir()
        for i in range(empty_files):
            (many / str(i)).touch()
    build = store.begin_build(key, str(uuid.uuid4()))
    for folder in ("repo", "venv", "home"):
        os.rename(session / folder, build / folder)
    store.seal(build, key=key, meta={"repo": f"https://example.com/{key}.git", "commit": "a" * 40},
               session_root=str(session))  # fmt: skip
    return store.publish(build, key), session


@pytest.fixture
def store(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("entries are root's")
    store = Store(tmp_path / "cache")
    store.ensure()
    return store


def test_a_sealed_entry_is_roots_and_knows_which_files_hold_the_session_path(store, tmp_path):
    entry, session = _build(store, tmp_path, "k1")
    assert store.entry("k1") == entry and store.verify(entry) is None
    owners = {p.lstat().st_uid for p in entry.path.rglob("*")}
    assert owners == {0}
    manifest = store.manifest(entry)
    assert sorted(manifest["rewrite"]) == ["venv/bin/tool", "venv/lib/site-packages/editable.pth"]  # not the .pyc
    assert manifest["links"] == ["venv/bin/back"]
    assert entry.meta["session_root"] == str(session) and entry.size_bytes > 0
    assert oct(entry.path.stat().st_mode & 0o777) == "0o755" and oct(store.root.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("damage", ["removed", "added", "renamed", "folder removed"])
def test_a_damaged_entry_is_detected(store, tmp_path, damage):
    entry, _ = _build(store, tmp_path, "k1")
    site = entry.path / "venv" / "lib" / "site-packages"
    if damage == "removed":
        (site / "editable.pth").unlink()
    elif damage == "added":
        (entry.path / "home" / ".cache" / "planted").write_text("x")
    elif damage == "renamed":
        (entry.path / "repo" / "pkg" / "mod.py").rename(entry.path / "repo" / "pkg" / "other.py")
    else:
        (entry.path / "home" / ".cache" / "note").unlink()
        (entry.path / "home" / ".cache").rmdir()
    assert store.verify(entry) is not None


def test_an_unreadable_manifest_is_damage_too(store, tmp_path):
    entry, _ = _build(store, tmp_path, "k1")
    (entry.path / "manifest.json").write_text("{not json")
    assert "unreadable manifest" in store.verify(entry)


def test_the_key_changes_with_every_part_of_the_material():
    base = {"repo": "r", "commit": "c", "install": ["i"], "env": {}, "environment": None}
    keys = {cache_key(base)}
    for part, value in (("repo", "r2"), ("commit", "c2"), ("install", ["i", "j"]), ("env", {"A": "1"}),
                        ("environment", ["debian", "id2"])):  # fmt: skip
        keys.add(cache_key({**base, part: value}))
    assert len(keys) == 6
    assert cache_key(dict(reversed(list(base.items())))) == cache_key(base)  # order of the keys does not matter


def test_eviction_takes_old_entries_then_the_least_recently_used(store, tmp_path):
    a, _ = _build(store, tmp_path, "a", name="a" * 36, size_pad=64 * 1024)
    b, _ = _build(store, tmp_path, "b", name="b" * 36, size_pad=64 * 1024)
    c, _ = _build(store, tmp_path, "c", name="c" * 36, size_pad=64 * 1024)
    store.record_hit(b)
    os.utime(b.path / "hits", (time.time() - 100, time.time() - 100))  # b used long ago, a and c never: by creation
    store.record_hit(c)
    fits_two = a.size_bytes + c.size_bytes + 1
    assert store.evict(max_bytes=fits_two, max_files=10**9, max_age_secs=3600) == ["b"]
    assert [e.key for e in store.all_entries()] == ["a", "c"]
    meta = json.loads((c.path / "meta.json").read_text())
    # An entry older than the age limit goes whatever room is left.
    os.chmod(c.path, 0o755)
    (c.path / "meta.json").unlink()
    (c.path / "meta.json").write_text(json.dumps({**meta, "created_at": time.time() - 7200}))
    assert store.evict(max_bytes=10**12, max_files=10**9, max_age_secs=3600) == ["c"]
    assert [e.key for e in store.all_entries()] == ["a"]


def test_an_entry_records_its_files_and_eviction_counts_them_as_bytes(store, tmp_path):
    # 3000 empty files: a few dozen KiB of blocks, 3000 inodes. Bytes alone would keep them all.
    a, _ = _build(store, tmp_path, "a", name="a" * 36)
    b, _ = _build(store, tmp_path, "b", name="b" * 36, empty_files=3000)
    c, _ = _build(store, tmp_path, "c", name="c" * 36)
    assert b.files > 3000 and a.files < 30 and b.size_bytes < 1024 * 1024
    assert store.usage().files == a.files + b.files + c.files
    store.record_hit(a)
    os.utime(a.path / "hits", (time.time() - 100, time.time() - 100))  # a used long ago, b and c never
    store.record_hit(c)
    room = store.size_bytes()
    assert store.evict(max_bytes=room, max_files=10**9, max_age_secs=3600) == []
    # Over the files cap the least recently used go until it fits: a (not enough alone), then b.
    assert store.evict(max_bytes=room, max_files=a.files + c.files, max_age_secs=3600) == ["a", "b"]
    assert [e.key for e in store.all_entries()] == ["c"]


def test_an_entry_built_before_files_were_counted_is_evicted(store, tmp_path):
    a, _ = _build(store, tmp_path, "a", name="a" * 36)
    meta = json.loads((a.path / "meta.json").read_text())
    del meta["files"]
    (a.path / "meta.json").unlink()
    (a.path / "meta.json").write_text(json.dumps(meta))
    assert store.entry("a").files is None
    assert store.evict(max_bytes=10**12, max_files=10**9, max_age_secs=3600) == ["a"]


def test_an_entry_in_use_is_moved_aside_and_removed_once_free(store, tmp_path):
    entry, _ = _build(store, tmp_path, "k1")
    held = store.hold_in_use(entry)
    assert store.evict(max_bytes=0, max_files=10**9, max_age_secs=3600) == ["k1"]
    assert store.entry("k1") is None  # never served again
    (trash,) = [p for p in store.entries.iterdir() if p.name.startswith(".trash-k1.")]
    assert (trash / "repo" / "pkg" / "mod.py").exists()  # still there for the evaluation reading it
    os.close(held)
    store.evict(max_bytes=0, max_files=10**9, max_age_secs=3600)
    assert not trash.exists()


def test_one_build_lock_per_key(store):
    first = store.try_build_lock("k1")
    assert first is not None
    assert store.try_build_lock("k1") is None
    other = store.try_build_lock("k2")
    assert other is not None
    os.close(first)
    again = store.try_build_lock("k1")
    assert again is not None
    os.close(again)
    os.close(other)


@pytest.mark.django_db
def test_a_build_killed_halfway_leaves_no_entry_and_the_reaper_removes_it(store, tmp_path, settings):
    evaluation = Evaluation.objects.create(task_url="http://x/t.tgz", agent_code="", status=Status.RUNNING)
    session = _session(tmp_path)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker building the key, killed between moving folders in and the rename
        try:
            lock = store.try_build_lock("k1")
            build = store.begin_build("k1", str(evaluation.id))
            os.rename(session / "repo", build / "repo")
            os.write(ready_w, b"1" if lock is not None else b"0")
            time.sleep(60)
        finally:
            os._exit(1)
    assert os.read(ready_r, 1) == b"1"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert store.entry("k1") is None and store.all_entries() == []
    lock = store.try_build_lock("k1")  # the kernel released the dead builder's lock
    assert lock is not None
    os.close(lock)
    config = settings.EXECUTOR.__class__(**{**settings.EXECUTOR.__dict__, "cache_dir": store.root})
    assert tend_cache(config) == 0  # its evaluation still runs (as far as the database knows)
    Evaluation.objects.filter(id=evaluation.id).update(status=Status.FAILED)
    assert tend_cache(config) == 1
    assert store.builds() == []


def test_an_unwritable_or_misplaced_cache_folder_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(OSError):
        Store(tmp_path / "file").ensure()
    other = tmp_path / "theirs"
    other.mkdir()
    os.chown(other, UID, UID)
    with pytest.raises(OSError) as excinfo:
        Store(other).ensure()
    assert "not a folder of uid 0" in str(excinfo.value)


def test_an_overlay_of_an_entry_is_the_uids_and_private(store, tmp_path):
    entry, _ = _build(store, tmp_path, "k1")
    work = Path(tempfile.mkdtemp(prefix="te-cache-mnt-", dir="/tmp"))  # the uid must reach it (tmp_path is 0700)
    os.chmod(work, 0o755)
    lower, upper, scratch, merged = (work / n for n in ("lower", "upper", "work", "merged"))
    for folder in (lower, upper, scratch, merged):
        folder.mkdir(parents=True)
    os.chown(upper, UID, UID)
    try:
        mounts.bind_idmapped(entry.folder("venv"), lower, mounts.userns_fd(UID))
        mounts.mount_overlay(lower, upper, scratch, merged)
        mounts.unmount(lower)
        assert {p.lstat().st_uid for p in merged.rglob("*")} == {UID}
        pid = os.fork()
        if pid == 0:  # the evaluation's uid writes, deletes and plants
            code = 1
            try:
                os.setgroups([])
                os.setgid(UID)
                os.setuid(UID)
                (merged / "lib" / "site-packages" / "editable.pth").write_text("planted\n")
                (merged / "bin" / "tool").unlink()
                (merged / "new").write_text("new\n")
                code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
        assert (merged / "new").exists() and not (merged / "bin" / "tool").exists()
    finally:
        assert mounts.unmount_below(work) >= 1
    assert mounts.mount_points_below(work) == []
    assert store.verify(entry) is None  # the entry itself never saw any of it
    assert not (entry.path / "venv" / "new").exists() and (entry.path / "venv" / "bin" / "tool").exists()
    assert "planted" not in (entry.path / "venv" / "lib" / "site-packages" / "editable.pth").read_text()
    assert (upper / "new").exists()
    shutil.rmtree(work)


@pytest.mark.django_db
def test_manage_py_cache_lists_and_clears(store, tmp_path, executor_config):
    executor_config(cache_dir=store.root)
    a, _ = _build(store, tmp_path, "a", name="a" * 36)
    _build(store, tmp_path, "b", name="b" * 36)
    store.record_hit(a)
    store.record_hit(a)
    out = io.StringIO()
    call_command("cache", "list", "--json", stdout=out)
    listing = json.loads(out.getvalue())
    rows = {row["key"]: row for row in listing["entries"]}
    assert rows["a"]["hits"] == 2 and rows["b"]["hits"] == 0
    assert rows["a"]["repository"] == "https://example.com/a.git" and rows["a"]["base_commit"] == "a" * 40
    assert rows["a"]["size_bytes"] == a.size_bytes and listing["total_bytes"] >= a.size_bytes
    assert rows["a"]["files"] == a.files and listing["total_files"] >= a.files + rows["b"]["files"]
    out = io.StringIO()
    call_command("cache", "list", stdout=out)
    assert "https://example.com/b.git" in out.getvalue() and "2 snapshots" in out.getvalue()
    assert "FILES" in out.getvalue() and f"{listing['total_files']} files with the mirrors" in out.getvalue()
    with pytest.raises(CommandError, match="no such cache entry: nope"):
        call_command("cache", "clear", "a", "nope", stdout=io.StringIO())
    assert [e.key for e in store.all_entries()] == ["b"]
    out = io.StringIO()
    call_command("cache", "clear", stdout=out)
    assert store.all_entries() == [] and "cleared 1 snapshots" in out.getvalue()
