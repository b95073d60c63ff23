"""Layers pulled at once (images/pull.py, LAYERS_AT_ONCE), each unpacked by two threads
(images/unpack.py): the same store as one layer after another, the same error when a layer is bad,
and nothing of the pull's still running once it has failed or been cancelled."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from evaluations.images import pull as pull_module
from evaluations.images.errors import ImageError
from evaluations.images.pull import pull
from evaluations.images.store import ImageStore
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.images import (
    FakeRegistry,
    image_config,
    layer,
    member,
    push_image,
    sha256,
    tree_listing,
    uncompressed,
)
from tests.helpers.polling import wait_for

pytestmark = pytest.mark.slow

BOUND = 60  # seconds: every wait on an event
PULL_THREADS = ("pull-layer", "pull-clock", "unpack-")  # images/pull.py's, deadline.py's, unpack.py's


def pull_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith(PULL_THREADS)]


def tar_threads() -> list[str]:
    return [name for name in pull_threads() if name.startswith("unpack-")]


@contextlib.contextmanager
def at_once(monkeypatch, layers: int):
    with monkeypatch.context() as patch:
        patch.setattr(pull_module, "LAYERS_AT_ONCE", layers)
        yield


def varied_layers() -> list[bytes]:
    """Layers that build on each other (whiteouts, an opaque folder, a replaced link), in every
    compression, with a repeated layer, a file of several chunks and many small files."""
    base = layer(
        member("etc/"),
        member("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"),
        member("etc/gone", b"whited out above"),
        member("var/cache/"),
        *(member(f"var/cache/c{n}", os.urandom(n * 53 % 3000), uid=n % 7, mode=0o600) for n in range(150)),
        member("usr/bin/"),
        member("usr/bin/tool", b"#!/bin/sh\necho tool\n", mode=0o755),
        member("usr/bin/su", b"#!/bin/su\n", mode=0o4755),
        member("bin", type="symlink", target="usr/bin"),
    )
    above = layer(
        member("etc/.wh.gone"),
        member("var/cache/.wh..wh..opq"),
        member("var/cache/fresh", b"after the opaque marker"),
        member("usr/bin/tool", b"#!/bin/sh\necho replaced\n", mode=0o755),
        compression="zstd",
    )
    links = layer(
        member("opt/"),
        member("opt/data", os.urandom(5000)),
        member("opt/again", type="hardlink", target="opt/data"),
        member("opt/up", type="symlink", target="../etc/passwd"),
        member("run/pipe", type="fifo", mode=0o620),
        compression=None,
    )
    big = layer(member("srv/big", os.urandom(5 * 1024 * 1024 + 7)))
    many = layer(*(member(f"home/u{n}/notes", os.urandom(700), uid=1000 + n, gid=1000 + n) for n in range(120)))
    return [base, above, links, big, links, many]


def test_layers_pulled_at_once_make_the_same_store_as_one_after_another(registry, pull_config, tmp_path, monkeypatch):
    pushed = push_image(registry, "concurrent/same:v1", layers=varied_layers(), config={"Env": ["A=1"]})
    assert pushed.diff_ids[2] == pushed.diff_ids[4]  # the repeat
    pulled = {}
    for name, layers in [("one after another", 1), ("default", pull_module.LAYERS_AT_ONCE), ("wide", 6)]:
        store = ImageStore(tmp_path / name)
        lines = []
        with at_once(monkeypatch, layers):
            record = pull(pushed.ref, store=store, config=pull_config, progress=lines.append).record
        layers = {
            diff_id: (store.layer_meta(diff_id)["files"], store.layer_meta(diff_id)["size_bytes"], tree_listing(tree))
            for diff_id in record.layers
            for tree in [store.layer_tree(diff_id)]
        }
        pulled[name] = (record.layers, record.size_bytes, record.config, lines, layers)
        assert pull_threads() == []
    assert pulled["default"] == pulled["one after another"]
    assert pulled["wide"] == pulled["one after another"]
    layer_ids, _, _, lines, layers = pulled["default"]
    assert layer_ids == pushed.diff_ids and len(layers) == 5
    assert lines[4] == f"layer {pushed.layers[4][:19]}… cached"  # the repeat, in its place
    assert layers[pushed.diff_ids[2]][2]["opt/again"][9] == "opt/again"  # hard link: same inode as opt/data
    assert layers[pushed.diff_ids[2]][2]["opt/data"][9] == "opt/again"


def fake_config(server, **env):
    values = {"ALLOWED_PRIVATE_HOSTS": "127.0.0.1", "IMAGE_INSECURE_REGISTRIES": f"127.0.0.1:{server.port}"}
    return image_config(None, **{**values, **env})


def test_one_bad_layer_among_several_fails_the_pull_as_one_after_another_would(tmp_path, monkeypatch):
    blobs = [layer(*(member(f"l{n}/f{m}", os.urandom(20_000)) for m in range(15))) for n in range(6)]
    errors = {}
    with TestHTTPServer() as server:
        fake = FakeRegistry(server, "concurrent/bad", "v1", blobs, corrupt=3)
        for name, layers in [("one after another", 1), ("at once", 3)]:
            store = ImageStore(tmp_path / name)
            with at_once(monkeypatch, layers), pytest.raises(ImageError) as caught:
                pull(fake.ref, store=store, config=fake_config(server))
            errors[name] = (type(caught.value), str(caught.value), caught.value.kind)
            assert pull_threads() == []
            assert os.listdir(store.root / "tmp") == [] and store.remove_dead_tmp() == (0, 0)
            assert store.images() == [] and not store.has_blob(fake.layer_digests[3])
            assert not store.has_layer(sha256(uncompressed(blobs[3])))
    assert errors["at once"] == errors["one after another"]
    assert errors["at once"][1].startswith(f"Layer {fake.layer_digests[3]} does not match its manifest: got ")
    assert errors["at once"][2] == "task_invalid"


def stalled(sent: threading.Semaphore, release: threading.Event, body: bytes):
    """A blob handler that announces all of ``body``, sends a tenth of it, then nothing until ``release``."""

    def handle(req) -> None:
        req.send_response(200)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body[: len(body) // 10])
        req.wfile.flush()
        sent.release()
        release.wait(BOUND * 2)

    return handle


def test_a_failing_layer_stops_the_one_fetched_beside_it(tmp_path, monkeypatch):
    """Layer 0 stalls (for longer than the test waits); layer 1, fetched beside it, is bad: the pull
    ends with layer 1's error at once, layer 0's connection shut, nothing of either left."""
    blobs = [layer(member(f"data{n}", os.urandom(300_000))) for n in range(2)]
    sent, release = threading.Semaphore(0), threading.Event()
    store = ImageStore(tmp_path / "images")
    with TestHTTPServer() as server:
        try:
            fake = FakeRegistry(server, "concurrent/stop", "v1", blobs, corrupt=1)
            server.route(f"/v2/concurrent/stop/blobs/{fake.layer_digests[0]}", stalled(sent, release, blobs[0]))
            config = fake_config(server, DOWNLOAD_TIMEOUT_SECS="600", IMAGE_FETCH_STALL_SECS="600")
            with at_once(monkeypatch, 2):
                outcome = {}
                thread = threading.Thread(target=lambda: _catch(outcome, fake.ref, store, config))
                thread.start()
                thread.join(BOUND)
                assert not thread.is_alive(), "the stalled layer held the pull after the other failed"
        finally:
            release.set()
    assert sent.acquire(timeout=0), "the stalled layer was never asked for"
    error = outcome["error"]
    assert type(error) is ImageError and str(error).startswith(f"Layer {fake.layer_digests[1]} does not match")
    assert pull_threads() == [] and os.listdir(store.root / "tmp") == [] and store.images() == []


def _catch(outcome: dict, ref: str, store: ImageStore, config, cancelled=None) -> None:
    try:
        outcome["value"] = pull(ref, store=store, config=config, cancelled=cancelled)
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        outcome["error"] = exc


def test_a_cancel_mid_pull_stops_every_layers_worker(tmp_path, monkeypatch):
    blobs = [layer(member(f"data{n}", os.urandom(300_000))) for n in range(4)]
    sent, release, cancel = threading.Semaphore(0), threading.Event(), threading.Event()
    store = ImageStore(tmp_path / "images")
    with TestHTTPServer() as server:
        try:
            fake = FakeRegistry(server, "concurrent/cancel", "v1", blobs)
            ref = fake.ref
            for digest, blob in zip(fake.layer_digests, blobs, strict=True):
                server.route(f"/v2/concurrent/cancel/blobs/{digest}", stalled(sent, release, blob))
            config = fake_config(server, DOWNLOAD_TIMEOUT_SECS="600", IMAGE_FETCH_STALL_SECS="600")
            with at_once(monkeypatch, 3):
                outcome = {}
                thread = threading.Thread(target=lambda: _catch(outcome, ref, store, config, cancel.is_set))
                thread.start()
                for _ in range(3):  # three layers under way, each stalled mid-blob
                    assert sent.acquire(timeout=BOUND), "a layer was never asked for"
                # Each of the three in its own thread, unpacking what came (a tar thread each).
                wait_for(lambda: len(tar_threads()) == 3, BOUND, what="three layers unpacking")
                assert len([name for name in pull_threads() if name.startswith("pull-layer")]) == 3
                cancel.set()
                thread.join(BOUND)
                assert not thread.is_alive(), "the cancel did not stop the pull"
        finally:
            release.set()
    assert str(outcome["error"]) == f"The pull of {ref} was cancelled."
    assert pull_threads() == []  # every layer's thread, its unpack's and its writers' ended
    assert os.listdir(store.root / "tmp") == [] and store.images() == []
    assert not sent.acquire(timeout=0), "the fourth layer was asked for after the cancel"
