"""The image store: LRU eviction that never takes a pinned image, pins of dead processes, remove,
prune, and a full disk reported as ours."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from evaluations.images.errors import ImageError, ImageUnavailable
from evaluations.images.pull import pull
from evaluations.images.store import ImageStore
from tests.helpers.images import image_config, layer, member, push_image
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow


@pytest.fixture
def three(registry, store, pull_config):
    """Three images pulled in the order a, b, c; each has its own layer and shares a base one."""
    base = layer(member("etc/"), member("etc/base", b"base"))
    records = {}
    for name in "abc":
        pushed = push_image(registry, f"store/{name}:v1", layers=[base, layer(member(name, name.encode() * 5000))])
        records[name] = pull(pushed.ref, store=store, config=pull_config).record
    return records


def test_eviction_takes_the_least_recently_used_first(store, three):
    store.touch(three["a"].digest)  # a is now the most recently used; b the least
    removed = store.evict(store.total_bytes() - 1)
    assert [record.digest for record in removed] == [three["b"].digest]
    assert store.image(three["b"].digest) is None
    assert not store.has_layer(three["b"].layers[1]) and store.has_layer(three["b"].layers[0])  # the base stays


def test_eviction_never_removes_a_pinned_image(store, three):
    with store.pin(three["a"].digest, "eval-1"):
        assert store.pinned(three["a"].digest)
        removed = store.evict(0)
        assert {record.digest for record in removed} == {three["b"].digest, three["c"].digest}
        assert store.image(three["a"].digest) is not None
        for layer_id in three["a"].layers:
            assert (store.layer_tree(layer_id)).is_dir()
        with pytest.raises(ImageError, match="is in use by an evaluation or a build"):
            store.remove(three["a"].digest)
    assert not store.pinned(three["a"].digest)
    assert [record.digest for record in store.evict(0)] == [three["a"].digest]
    assert store.total_bytes() == 0


PINNER = """
import sys, time
from evaluations.images.store import ImageStore
with ImageStore(sys.argv[1]).pin(sys.argv[2], "eval-dead"):
    print("pinned", flush=True)
    time.sleep(600)
"""


def test_a_dead_holders_pin_is_free(store, three):
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PINNER), str(store.root), three["a"].digest],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "pinned\n"
        assert store.pinned(three["a"].digest)
        assert three["a"].digest not in {record.digest for record in store.evict(0)}
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert (store.root / "pins" / three["a"].digest.split(":")[1] / "eval-dead").exists()  # left by the dead
    assert not store.pinned(three["a"].digest)
    assert [record.digest for record in store.evict(0)] == [three["a"].digest]


def test_remove_by_reference_or_digest_then_prune(store, three):
    ref_b = three["b"].refs[0]
    removed = store.remove(ref_b)
    assert removed.digest == three["b"].digest and store.image(three["b"].digest) is None
    assert store.resolve_tag(ref_b) is None
    store.remove(three["c"].digest)
    with pytest.raises(ImageError, match="There is no image"):
        store.remove(ref_b)
    assert store.has_layer(three["b"].layers[1])  # layers stay until prune
    freed = store.prune()
    assert freed > 10000
    assert not store.has_layer(three["b"].layers[1]) and not store.has_layer(three["c"].layers[1])
    assert store.has_layer(three["a"].layers[0]) and store.has_layer(three["a"].layers[1])
    assert {path.name for path in (store.root / "blobs" / "sha256").iterdir()} == {
        blob.split(":")[1] for blob in store.used_blobs(three["a"])
    }


def test_a_full_disk_is_reported_as_ours(registry, pull_config, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        store = ImageStore(small)
        pushed = push_image(registry, "store/big:v1", layers=[layer(member("big", os.urandom(3 * 1024 * 1024)))])
        with pytest.raises(ImageUnavailable) as caught:
            pull(pushed.ref, store=store, config=pull_config)
        assert str(caught.value).startswith("The host's disk is full while storing ")
        assert caught.value.kind == "infrastructure"
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_a_pull_evicts_older_images_beyond_the_limit_but_never_itself(registry, store):
    config = image_config(registry, IMAGES_MAX_BYTES="1", IMAGES_DIR=str(store.root))
    store = ImageStore.of(config)
    old = push_image(registry, "store/old:v1", layers=[layer(member("old", b"o" * 10000))])
    new = push_image(registry, "store/new:v1", layers=[layer(member("new", b"n" * 10000))])
    assert pull(old.ref, store=store, config=config).record.digest == old.digest
    assert [record.digest for record in store.images()] == [old.digest]  # alone over the limit: kept
    pull(new.ref, store=store, config=config)
    assert [record.digest for record in store.images()] == [new.digest]
    assert not store.has_layer(old.diff_ids[0]) and store.has_layer(new.diff_ids[0])


def test_trees_in_the_making_start_in_block_groups_of_their_own(store):
    """``tmp/`` carries ext4's top-of-hierarchy flag (``chattr +T``, store._spread): each layer tree
    made in it is placed away from the trees removed just before (issue 38)."""
    shown = subprocess.run(["lsattr", "-d", str(store.root / "tmp")], capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"this file system keeps no inode flags: {shown.stderr.strip()}")
    flags = shown.stdout.split()[0]
    assert "T" in flags, flags
    subprocess.run(["chattr", "-T", str(store.root / "tmp")], check=True)
    assert "T" in subprocess.run(["lsattr", "-d", str(ImageStore(store.root).root / "tmp")],
                                 capture_output=True, text=True, check=True).stdout.split()[0]  # fmt: skip
