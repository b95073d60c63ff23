"""The per-evaluation uid pool (evaluations/runtime/uids.py), on a range of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from evaluations.runtime import uids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="uid switching needs root")

FIRST = 61_000  # away from the service's pool (60000..), so concurrent runs do not meet


def test_each_lease_is_a_different_uid_until_released(tmp_path):
    with uids.acquire(FIRST, 2, tmp_path) as one, uids.acquire(FIRST, 2, tmp_path) as two:
        assert {one.uid, two.uid} == {FIRST, FIRST + 1}
        with pytest.raises(uids.UidPoolExhausted, match="all 2 sandbox uids"):
            uids.acquire(FIRST, 2, tmp_path)
        one.release()
        with uids.acquire(FIRST, 2, tmp_path) as again:
            assert again.uid == FIRST


def test_a_dead_holder_frees_its_uid(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from evaluations.runtime import uids; from pathlib import Path; "
            f"l = uids.acquire({FIRST}, 1, Path({str(tmp_path)!r})); print('held', flush=True); "
            "import time; time.sleep(60)",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(uids.UidPoolExhausted):
        uids.acquire(FIRST, 1, tmp_path)
    holder.kill()
    holder.wait()
    with uids.acquire(FIRST, 1, tmp_path) as lease:
        assert lease.uid == FIRST


def test_taking_a_uid_scrubs_what_a_previous_holder_left(tmp_path):
    uid = FIRST + 5
    token = uuid.uuid4().hex[:8]
    stray = subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[], start_new_session=True)
    leftovers = [f"/tmp/te-scrub-{token}", f"/dev/shm/te-scrub-{token}"]
    for path in leftovers:
        os.makedirs(f"{path}/deep")
        open(f"{path}/deep/file", "w").close()
        for item in (path, f"{path}/deep", f"{path}/deep/file"):
            os.chown(item, uid, uid)
    theirs = f"/tmp/te-scrub-{token}-root"  # not the uid's: left alone
    open(theirs, "w").close()
    try:
        with uids.acquire(uid, 1, tmp_path):
            stray.wait(timeout=5)
            assert not any(os.path.exists(p) for p in leftovers)
            assert os.path.exists(theirs)
            assert not [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and uid in p.info["uids"]]
    finally:
        os.unlink(theirs)
        if stray.poll() is None:
            stray.kill()
        stray.wait()


def _stray(uid: int) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[], start_new_session=True)


def test_only_a_uid_released_clean_is_taken_without_a_scrub(tmp_path):
    """The scrub scans every process on the host: it is skipped only for a uid whose last holder
    let go of it saying it holds nothing. A plain release, or a holder that dies, leaves it dirty."""
    uid = FIRST + 6
    strays = []
    try:
        with uids.acquire(uid, 1, tmp_path) as lease:
            lease.release(clean=True)
        strays.append(_stray(uid))  # as if something of the uid had outlived a clean release
        with uids.acquire(uid, 1, tmp_path):
            assert strays[-1].poll() is None  # no scrub: the release said clean
        strays.append(_stray(uid))
        with uids.acquire(uid, 1, tmp_path):  # the last release was not clean: scrubbed
            strays[-1].wait(timeout=5)  # a 60 s sleep that ends within 5 s was killed
            strays[0].wait(timeout=5)
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from evaluations.runtime import uids; from pathlib import Path; "
                f"l = uids.acquire({uid}, 1, Path({str(tmp_path)!r})); print('held', flush=True); "
                "import time; time.sleep(60)",
            ],  # fmt: skip
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout.readline().strip() == "held"  # taken after a clean release...
        holder.kill()  # ...and its holder dies: the mark it erased stays erased
        holder.wait()
        strays.append(_stray(uid))
        with uids.acquire(uid, 1, tmp_path):
            strays[-1].wait(timeout=5)
    finally:
        for stray in strays:
            if stray.poll() is None:
                stray.kill()
            stray.wait()


def test_the_lock_folder_is_root_only(tmp_path):
    folder = uids.lock_dir(tmp_path)
    st = os.stat(folder)
    assert st.st_uid == 0 and st.st_mode & 0o077 == 0


def test_a_link_planted_as_the_lock_folder_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    planted = tmp_path / "link"
    planted.symlink_to(target)
    with pytest.raises(PermissionError):
        uids._root_only_dir(planted)


def test_the_pool_must_hold_a_uid_per_concurrent_evaluation():
    from executor_project.config import ConfigError
    from executor_project.settings_loader import load

    assert load({"SANDBOX_UID_COUNT": "4", "MAX_CONCURRENT_EVALS": "4"}).sandbox_uid_count == 4
    with pytest.raises(ConfigError, match="SANDBOX_UID_COUNT: must be at least MAX_CONCURRENT_EVALS"):
        load({"SANDBOX_UID_COUNT": "3", "MAX_CONCURRENT_EVALS": "4"})
    with pytest.raises(ConfigError, match="SANDBOX_UID_COUNT"):
        load({"SANDBOX_UID": str(2**32 - 10), "SANDBOX_UID_COUNT": "64"})


def test_the_scrub_finds_what_the_uid_left_at_any_depth_without_following_links(tmp_path):
    """Issue 23: the scrub looked at the top level of /tmp and /dev/shm only. What the uid owns
    deep inside folders of others (root's 1777 folders, as /tmp/.X11-unix) goes; the folders of
    others, what a link of the uid's points at, and the folders it is told to keep stay."""
    uid = FIRST + 6
    token = uuid.uuid4().hex[:8]
    roots = [f"/tmp/te-nested-{token}", f"/dev/shm/te-nested-{token}"]
    target = f"/tmp/te-nested-{token}-target"  # root's, outside: what the uid's link points at
    with open(target, "w") as handle:
        handle.write("root's\n")

    def as_uid(script: str) -> None:
        subprocess.run(["sh", "-c", script], user=uid, group=uid, extra_groups=[], check=True)

    try:
        for root in roots:
            os.makedirs(f"{root}/shared/deeper")  # root's folders anyone may write in
            os.makedirs(f"{root}/kept")
            for folder in (root, f"{root}/shared", f"{root}/shared/deeper", f"{root}/kept"):
                os.chmod(folder, 0o1777)
            as_uid(
                f"echo x > {root}/shared/deeper/file && mkdir {root}/shared/own && echo y > {root}/shared/own/f "
                f"&& ln -s {target} {root}/shared/deeper/link && echo z > {root}/kept/file"
            )
        keep = tuple(Path(f"{root}/kept") for root in roots)
        uids.scrub(uid, keep=keep)
        for root in roots:
            left = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))
            assert left == ["kept", "kept/file", "shared", "shared/deeper"], left
        assert open(target).read() == "root's\n"
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
        os.unlink(target)


def test_the_scrub_walks_no_mount_point(tmp_path):
    """A folder bind-mounted below /tmp (a test's environment binds /usr there; an operator's bind
    of anything) is another tree: the scrub walked a bind of /usr on the same disk whole, 1.7 s on
    every release here. The uid's files beside the mount point go; the mounted tree is not entered."""
    uid = FIRST + 7
    token = uuid.uuid4().hex[:8]
    root, source = f"/tmp/te-mounted-{token}", f"/tmp/te-mounted-{token}-source"
    os.makedirs(f"{root}/mnt")
    os.makedirs(source)
    for folder in (root, source):
        os.chmod(folder, 0o1777)
    subprocess.run(["sh", "-c", f"echo x > {root}/left && echo y > {source}/inside"], user=uid, group=uid,
                   extra_groups=[], check=True)  # fmt: skip
    subprocess.run(["mount", "--bind", source, f"{root}/mnt"], check=True)
    try:
        uids.remove_owned(uid, root)
        assert sorted(os.listdir(root)) == ["mnt"]
        assert os.listdir(f"{root}/mnt") == ["inside"]  # not entered: a mount point is another tree
    finally:
        subprocess.run(["umount", f"{root}/mnt"], check=False)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(source, ignore_errors=True)
