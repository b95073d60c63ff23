"""Attacks on pulling images (SPEC §21): layers that unpack to too much, registries that trickle,
stall or hang up, what killed pulls leave in the store, credentials sent where they do not belong,
another tenant's private layer named by digest, and a store other users could read.

The registries are real: Debian's docker-registry on 127.0.0.1 (tests/helpers/images.py), and small
http.servers on 127.0.0.1 / 127.0.0.2 for what a real registry never does. Every wait is on the
event itself (a request arriving, a thread ending), with a bound.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import threading

import pytest

from evaluations.images.errors import ImageError, ImageUnavailable
from evaluations.images.pull import pull
from evaluations.images.store import ImageStore
from evaluations.worker import reaper
from tests.helpers.httpserver import TestHTTPServer, make_tls_files, server_tls_context
from tests.helpers.images import (
    FakeRegistry,
    RegistryServer,
    compress,
    image_config,
    layer,
    member,
    need_root,
    push_image,
    sha256,
)
from tests.helpers.polling import wait_for
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow

BOUND = 60  # seconds: every wait on an event


@pytest.fixture
def store(tmp_path) -> ImageStore:
    need_root()
    return ImageStore(tmp_path / "images")


def fake_config(server, **env):
    """A Config reaching the fake registry ``server`` on 127.0.0.1 over plain HTTP."""
    values = {"ALLOWED_PRIVATE_HOSTS": "127.0.0.1,127.0.0.2", "IMAGE_INSECURE_REGISTRIES": f"127.0.0.1:{server.port}"}
    return image_config(None, **{**values, **env})


def leftovers(store: ImageStore) -> list[str]:
    return sorted(os.listdir(store.root / "tmp"))


def in_thread(function):
    """Run ``function`` in a thread; returns (thread, outcome) where outcome gets "value" or "error"."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def stalling_blob(body: bytes, sent: threading.Event, release: threading.Event, *, first: int):
    """A blob handler that sends its full Content-Length header, ``first`` bytes, then nothing until
    ``release`` (set at the test's end)."""

    def handle(req) -> None:
        req.send_response(200)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body[:first])
        req.wfile.flush()
        sent.set()
        release.wait(BOUND * 2)

    return handle


# -- caps while unpacking ---------------------------------------------------------------------


def test_a_zero_filled_layer_over_the_unpacked_cap_is_refused_and_nothing_stays(registry, store):
    zeros = layer(member("big/zeros", bytes(16 * 1024 * 1024)))  # 16 MiB of zeros: ~16 KB gzip'd
    assert len(zeros) < 100_000
    pushed = push_image(registry, "caps/zeros:v1", layers=[zeros])
    config = image_config(registry, IMAGE_MAX_UNPACKED_BYTES=str(4 * 1024 * 1024))
    with pytest.raises(ImageError) as caught:
        pull(pushed.ref, store=store, config=config)
    assert caught.value.kind == "task_invalid"
    assert str(caught.value) == (
        f"Layer {pushed.layers[0]} is refused: member 'big/zeros' would take the image past "
        f"IMAGE_MAX_UNPACKED_BYTES ({4 * 1024 * 1024} bytes unpacked)."
    )
    assert not store.has_layer(pushed.diff_ids[0]) and not store.has_blob(pushed.layers[0])
    assert store.images() == [] and leftovers(store) == []


def test_the_cap_is_checked_before_a_member_is_written(registry, store):
    """A member whose header says 1 TiB, with 10 bytes behind it: refused for the cap before anything
    is read or written (written first, it would fail as a broken tar, or fill the disk)."""
    header = tarfile.TarInfo("huge")
    header.size = 1 << 40
    raw = header.tobuf(format=tarfile.PAX_FORMAT) + b"0123456789"
    blob = compress(raw, "gzip")
    pushed = push_image(registry, "caps/header:v1", layers=[blob])
    with pytest.raises(ImageError, match=r"member 'huge' would take the image past IMAGE_MAX_UNPACKED_BYTES"):
        pull(pushed.ref, store=store, config=image_config(registry))  # the default cap: 20 GiB
    assert not store.has_layer(pushed.diff_ids[0]) and leftovers(store) == []


def test_the_caps_count_the_whole_image_across_its_layers(registry, store):
    three = [layer(member(f"part{n}", bytes(3 * 1024 * 1024))) for n in range(2)]
    pushed = push_image(registry, "caps/layers:v1", layers=three)
    config = image_config(registry, IMAGE_MAX_UNPACKED_BYTES=str(5 * 1024 * 1024))
    with pytest.raises(ImageError) as caught:
        pull(pushed.ref, store=store, config=config)
    # Unpacked at once, either layer's member may be the one that crosses the cap: that one is named.
    refused = {
        f"Layer {pushed.layers[n]} is refused: member 'part{n}' would take the image past IMAGE_MAX_UNPACKED_BYTES "
        f"({5 * 1024 * 1024} bytes unpacked).": n
        for n in range(2)
    }
    assert str(caught.value) in refused and caught.value.kind == "task_invalid"
    assert not store.has_layer(pushed.diff_ids[refused[str(caught.value)]])
    assert store.images() == [] and leftovers(store) == []
    # A layer the store holds counts for the next image that has it, before anything is unpacked.
    first = push_image(registry, "caps/first:v1", layers=[three[0]])
    assert pull(first.ref, store=store, config=config).record
    again = push_image(registry, "caps/again:v1", layers=[three[0], layer(member("more", bytes(3 * 1024 * 1024)))])
    with pytest.raises(ImageError) as caught:
        pull(again.ref, store=store, config=config)
    assert str(caught.value) == (
        f"Layer {again.layers[1]} is refused: member 'more' would take the image past IMAGE_MAX_UNPACKED_BYTES "
        f"({5 * 1024 * 1024} bytes unpacked)."
    )
    assert not store.has_layer(again.diff_ids[1]) and leftovers(store) == []


def test_a_layer_over_the_file_cap_is_refused(registry, store):
    many = layer(*(member(f"d/f{n}", b"") for n in range(50)))
    pushed = push_image(registry, "caps/files:v1", layers=[many])
    with pytest.raises(ImageError) as caught:
        pull(pushed.ref, store=store, config=image_config(registry, IMAGE_MAX_FILES="20"))
    assert caught.value.kind == "task_invalid"
    assert str(caught.value).startswith(f"Layer {pushed.layers[0]} is refused: member ")
    assert str(caught.value).endswith("would take the image past IMAGE_MAX_FILES (20 files).")
    assert not store.has_layer(pushed.diff_ids[0]) and leftovers(store) == []
    assert pull(pushed.ref, store=store, config=image_config(registry, IMAGE_MAX_FILES="51")).record


# -- registries that hang up, stall or trickle --------------------------------------------------


def test_a_download_cut_short_is_infrastructure_not_a_bad_layer(store):
    blob = layer(member("data", os.urandom(300_000)))
    with TestHTTPServer() as server:
        fake = FakeRegistry(server, "cut/img", "v1", [blob])

        def hang_up(req) -> None:  # all of Content-Length announced, half sent, then the connection closed
            req.send_response(200)
            req.send_header("Content-Length", str(len(blob)))
            req.end_headers()
            req.wfile.write(blob[: len(blob) // 2])

        server.route(f"/v2/cut/img/blobs/{fake.layer_digests[0]}", hang_up)
        with pytest.raises(ImageError) as caught:
            pull(fake.ref, store=store, config=fake_config(server))
    assert type(caught.value) is ImageUnavailable and caught.value.kind == "infrastructure"
    assert str(caught.value) == (
        f"Downloading blob {fake.layer_digests[0]} was cut short: {len(blob) // 2} of {len(blob)} bytes arrived."
    )
    assert store.images() == [] and not store.has_blob(fake.layer_digests[0]) and leftovers(store) == []


def test_a_stalled_layer_releases_its_lock_and_another_registry_serves_it(registry, store):
    """A registry that sends part of a layer and then nothing: the pull gives up after the (lowered)
    IMAGE_FETCH_STALL_SECS, not after DOWNLOAD_TIMEOUT_SECS, and lets the layer's lock go. A pull of
    the same layer from a healthy registry, waiting on that lock meanwhile, then gets it; a pull of
    another layer never waited at all."""
    shared = layer(member("shared", os.urandom(400_000)))
    healthy = push_image(registry, "stall/healthy:v1", layers=[shared])
    other = push_image(registry, "stall/other:v1", layers=[layer(member("other", b"o"))])
    sent, release = threading.Event(), threading.Event()
    with TestHTTPServer() as server:
        try:
            fake = FakeRegistry(server, "stall/img", "v1", [shared])
            server.route(
                f"/v2/stall/img/blobs/{fake.layer_digests[0]}", stalling_blob(shared, sent, release, first=1000)
            )
            slow_config = fake_config(server, DOWNLOAD_TIMEOUT_SECS="600", IMAGE_FETCH_STALL_SECS="2")
            stalled, stalled_out = in_thread(lambda: pull(fake.ref, store=store, config=slow_config))
            assert sent.wait(BOUND), "the stalling registry was never asked for the layer"
            # Another layer: no lock in common with the stalled one, done while it stalls.
            assert pull(other.ref, store=ImageStore(store.root), config=image_config(registry)).record
            waiter, waiter_out = in_thread(
                lambda: pull(healthy.ref, store=ImageStore(store.root), config=image_config(registry))
            )
            stalled.join(BOUND)
            waiter.join(BOUND)
            assert not stalled.is_alive() and not waiter.is_alive()
        finally:
            release.set()
    error = stalled_out["error"]
    assert type(error) is ImageUnavailable and error.kind == "infrastructure"
    assert str(error) == (
        f"Downloading blob {fake.layer_digests[0]} stalled: nothing received for 2 s (IMAGE_FETCH_STALL_SECS)."
    )
    assert waiter_out["value"].record.digest == healthy.digest
    assert (store.layer_tree(healthy.diff_ids[0]) / "shared").stat().st_size == 400_000


def test_a_trickling_registry_is_bounded_by_the_pull_timeout(store):
    """One byte every 0.1 s never stalls a read; IMAGE_PULL_TIMEOUT_SECS ends the pull all the same."""
    blob = layer(member("slow", os.urandom(50_000)))
    with TestHTTPServer() as server:
        fake = FakeRegistry(server, "trickle/img", "v1", [blob])
        stop = threading.Event()

        def trickle(req) -> None:
            req.send_response(200)
            req.send_header("Content-Length", str(len(blob)))
            req.end_headers()
            for byte in blob:
                if stop.wait(0.1):
                    return
                req.wfile.write(bytes([byte]))
                req.wfile.flush()

        server.route(f"/v2/trickle/img/blobs/{fake.layer_digests[0]}", trickle)
        ref = fake.ref
        config = fake_config(server, IMAGE_PULL_TIMEOUT_SECS="3")
        try:
            thread, outcome = in_thread(lambda: pull(fake.ref, store=store, config=config))
            thread.join(BOUND)
            assert not thread.is_alive(), "the trickled pull never ended"
        finally:
            stop.set()
    error = outcome["error"]
    assert type(error) is ImageUnavailable
    assert str(error) == f"The pull of {ref} took longer than IMAGE_PULL_TIMEOUT_SECS (3 s)."
    assert leftovers(store) == []


def test_a_cancelled_evaluation_stops_its_pull_mid_layer(store):
    blob = layer(member("data", os.urandom(300_000)))
    sent, release, cancel = threading.Event(), threading.Event(), threading.Event()
    with TestHTTPServer() as server:
        try:
            fake = FakeRegistry(server, "cancel/img", "v1", [blob])
            ref = fake.ref
            server.route(
                f"/v2/cancel/img/blobs/{fake.layer_digests[0]}", stalling_blob(blob, sent, release, first=1000)
            )
            config = fake_config(server, DOWNLOAD_TIMEOUT_SECS="600")  # stall: the default 60 s
            thread, outcome = in_thread(lambda: pull(fake.ref, store=store, config=config, cancelled=cancel.is_set))
            assert sent.wait(BOUND)
            cancel.set()
            thread.join(BOUND)  # well under IMAGE_FETCH_STALL_SECS' 60 s: the watcher shut the read down
            assert not thread.is_alive()
        finally:
            release.set()
    assert str(outcome["error"]) == f"The pull of {ref} was cancelled."
    assert leftovers(store) == []


# -- what killed pulls leave ---------------------------------------------------------------------

CHILD = """
import sys
from evaluations.images.pull import pull
from evaluations.images.store import ImageStore
from tests.helpers.images import image_config
config = image_config(None, ALLOWED_PRIVATE_HOSTS="127.0.0.1", IMAGE_INSECURE_REGISTRIES=sys.argv[3],
                      DOWNLOAD_TIMEOUT_SECS="600", IMAGE_FETCH_STALL_SECS="600")
pull(sys.argv[1], store=ImageStore(sys.argv[2]), config=config)
"""


def test_what_a_killed_pull_left_is_counted_reaped_and_reported_by_prune(store, tmp_path):
    blobs = [layer(member(f"data{n}", os.urandom(2_000_000)), compression=None) for n in range(3)]
    events = [(threading.Event(), threading.Event()) for _ in blobs]
    children = []
    with TestHTTPServer() as server:
        try:
            fakes = []
            for n, blob in enumerate(blobs):
                fake = FakeRegistry(server, f"killed/img{n}", "v1", [blob])
                sent, release = events[n]
                server.route(
                    f"/v2/killed/img{n}/blobs/{fake.layer_digests[0]}",
                    stalling_blob(blob, sent, release, first=1_500_000),
                )
                fakes.append(fake)
            for fake in fakes:
                argv = [
                    sys.executable,
                    "-c",
                    textwrap.dedent(CHILD),
                    fake.ref,
                    str(store.root),
                    f"127.0.0.1:{server.port}",
                ]
                children.append(subprocess.Popen(argv, cwd=PROJECT, stderr=subprocess.PIPE))
            for sent, _ in events:
                assert sent.wait(BOUND)

            def written(n: int) -> bool:  # the child's blob in the making holds what it was sent
                names = [name for name in leftovers(store) if name.startswith(f"blob-{fakes[n].layer_digests[0][7:]}")]
                blobs = [store.root / "tmp" / name for name in names if not name.endswith(".lock")]
                return any(path.stat().st_size >= 1_000_000 for path in blobs)

            for n in range(3):
                wait_for(lambda n=n: written(n), BOUND, what=f"pull {n} to write its blob")
            for child in children[:2]:  # two killed as a lost worker is; the third still running
                child.send_signal(signal.SIGKILL)
                child.wait(BOUND)

            configs = sum(path.stat().st_size for path in (store.root / "blobs" / "sha256").iterdir())
            assert store.total_bytes() >= configs + 6 * 1_000_000  # each pull's blob and tree in the making
            assert store.total_bytes() == configs + store.tmp_bytes()  # no layer yet: the rest is tmp/
            config = image_config(None, IMAGES_DIR=str(store.root), WORKSPACE_BASE=str(tmp_path / "ws"))
            assert reaper.tend_images(config) == (0, 0, 4)  # a blob and a layer tree for each dead one
            live = [name for name in leftovers(store) if not name.endswith(".lock")]
            assert len(live) == 2 and store.tmp_bytes() >= 2 * 1_000_000  # the live pull's, untouched
            assert reaper.tend_images(config) == (0, 0, 0)
            assert children[2].poll() is None

            children[2].send_signal(signal.SIGKILL)
            children[2].wait(BOUND)
            left = store.tmp_bytes()
            assert left >= 2 * 1_000_000
            assert store.prune() == left + configs  # what it freed: the unused configs and tmp/

            assert leftovers(store) == [] and store.total_bytes() == 0
        finally:
            for _, release in events:
                release.set()
            for child in children:
                if child.poll() is None:
                    child.kill()
                child.wait(BOUND)


# -- credentials and private layers ---------------------------------------------------------------


def token_server(host: str, token: str):
    """A token realm on ``host`` that records the Authorization of each request."""
    server = TestHTTPServer(host=host)
    seen: list[str] = []

    def answer(req) -> None:
        seen.append(req.headers.get("Authorization", ""))
        body = json.dumps({"token": token}).encode()
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    server.route("/token", answer)
    return server, seen


def test_credentials_never_go_to_a_token_realm_on_another_host(store, tmp_path):
    blob = layer(member("x", b"x"))
    realm, seen = token_server("127.0.0.2", "t0k3n")
    with TestHTTPServer() as server, realm:
        fake = FakeRegistry(server, "realm/img", "v1", [blob], token="t0k3n", realm=realm.url("/token"))
        auth = tmp_path / "auth.json"
        auth.write_text(
            json.dumps({"auths": {f"127.0.0.1:{server.port}": {"username": "alice", "password": "s3cret"}}})
        )
        result = pull(fake.ref, store=store, config=fake_config(server, REGISTRY_AUTH_FILE=str(auth)))
        assert result.record.digest == fake.digest
        assert seen and seen == [""] * len(seen)  # the realm was asked anonymously
        # The auth file's own entry for the realm's host: those credentials (its own) go there.
        realm_host = f"127.0.0.2:{realm.port}"
        both = {**json.loads(auth.read_text())["auths"], realm_host: {"username": "realm-user", "password": "r"}}
        auth.write_text(json.dumps({"auths": both}))
        pull(fake.ref, store=ImageStore(tmp_path / "other"), config=fake_config(server, REGISTRY_AUTH_FILE=str(auth)))
    assert seen[-1] == "Basic " + base64.b64encode(b"realm-user:r").decode()
    assert not any("alice" in base64.b64decode(value.split(" ", 1)[1]).decode() for value in seen if value)


def test_no_authorization_after_an_https_to_http_redirect(store, tmp_path):
    ca, cert, key = make_tls_files(tmp_path / "tls", ("localhost",))
    blob = layer(member("x", b"x"))
    with TestHTTPServer(ssl_context=server_tls_context(cert, key)) as secure, TestHTTPServer() as plain:
        fake = FakeRegistry(
            secure, "tls/img", "v1", [blob], token="t0k3n", realm=secure.url("/token", host="localhost"),
            cdn=plain, cdn_host="localhost",
        )  # fmt: skip
        config = image_config(None, ALLOWED_PRIVATE_HOSTS="localhost,127.0.0.1,::1", SSL_CERT_FILE=str(ca))
        result = pull(f"localhost:{secure.port}/tls/img:v1", store=store, config=config)
    assert result.record.digest == fake.digest
    assert "Bearer t0k3n" in fake.authorizations  # over https, to the registry itself
    assert fake.cdn_authorizations == [""]  # the same host name, but over http: nothing


def test_a_private_layer_is_reused_for_another_repository_only_when_its_registry_has_it(store, tmp_path):
    secret = layer(member("secret.txt", b"another tenant's secret\n"))
    with RegistryServer(users={"alice": "s3cret"}) as private:
        pushed = push_image(private, "tenant-a/img:v1", layers=[secret])
        auth = tmp_path / "auth.json"
        auth.write_text(json.dumps({"auths": {private.host: {"username": "alice", "password": "s3cret"}}}))
        private_config = image_config(private, REGISTRY_AUTH_FILE=str(auth))
        pull(pushed.ref, store=store, config=private_config)

        # Another repository of the same registry that really has the blob: a HEAD, then reuse.
        shared = push_image(private, "tenant-a/other:v1", layers=[secret, layer(member("o", b"o"))])
        assert pull(shared.ref, store=store, config=private_config).record.digest == shared.digest

    # A manifest elsewhere naming the layer by its digests, from a registry that does not have it.
    with TestHTTPServer() as server:
        thief = FakeRegistry(server, "thief/img", "v1", [secret])
        server.respond(f"/v2/thief/img/blobs/{thief.layer_digests[0]}", status=404)
        assert thief.layer_digests == pushed.layers
        with pytest.raises(ImageError) as caught:
            pull(thief.ref, store=store, config=fake_config(server))
        assert caught.value.kind == "task_invalid"
        assert f"blob {pushed.layers[0]} of thief/img" in str(caught.value)
        assert store.image(thief.digest) is None

        # One that sends the very bytes shows it has them: the layer is used.
        honest = FakeRegistry(server, "honest/img", "v1", [secret])
        assert pull(honest.ref, store=store, config=fake_config(server)).record.digest == honest.digest
        assert honest.blob_gets[honest.layer_digests[0]] == 1


# -- the store is root's alone ------------------------------------------------------------------


def test_the_store_is_readable_by_root_only(tmp_path):
    need_root()
    fresh = ImageStore(tmp_path / "fresh")
    for path in (fresh.root, *fresh.root.iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    old = tmp_path / "old"  # a store made before: folders 0755, as the code made them
    for sub in ("", "layers", "blobs", "tmp", "images"):
        (old / sub).mkdir(mode=0o755, exist_ok=True)
        os.chmod(old / sub, 0o755)
    ImageStore(old)
    for path in (old, *old.iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_an_uncompressed_layer_member_stream_is_capped_too(registry, store):
    """A plain (uncompressed) layer is capped as a gzip'd one is."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("plain")
        info.size = 2 * 1024 * 1024
        archive.addfile(info, io.BytesIO(bytes(info.size)))
    pushed = push_image(registry, "caps/plain:v1", layers=[raw.getvalue()], oci=True)
    assert pushed.diff_ids[0] == sha256(raw.getvalue())
    with pytest.raises(ImageError, match="IMAGE_MAX_UNPACKED_BYTES"):
        pull(pushed.ref, store=store, config=image_config(registry, IMAGE_MAX_UNPACKED_BYTES="1048576"))


def test_an_imported_archive_is_held_to_the_same_caps(store, tmp_path):
    """``manage.py image import`` unpacks with the same caps as a pull: a docker-save archive whose one
    layer unpacks to 16 MiB of zeros, over a 4 MiB IMAGE_MAX_UNPACKED_BYTES, is refused and leaves nothing."""
    from evaluations.images.archive import import_archive

    layer_tar = layer(member("big/zeros", bytes(16 * 1024 * 1024)), compression=None)
    config_body = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [sha256(layer_tar)]}}
    ).encode()
    saved = tmp_path / "zeros.tar"
    with tarfile.open(saved, "w") as out:
        for name, data in [
            ("layer.tar", layer_tar),
            ("config.json", config_body),
            (
                "manifest.json",
                json.dumps(
                    [{"Config": "config.json", "RepoTags": ["caps/zeros:v1"], "Layers": ["layer.tar"]}]
                ).encode(),
            ),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    config = image_config(None, IMAGE_MAX_UNPACKED_BYTES=str(4 * 1024 * 1024))
    with pytest.raises(ImageError, match=r"member 'big/zeros' would take the image past IMAGE_MAX_UNPACKED_BYTES"):
        import_archive(saved, store, config)
    assert store.images() == [] and leftovers(store) == []
    assert not store.has_layer(sha256(layer_tar))
    (record,) = import_archive(saved, store, image_config(None))  # within the default caps: imported
    assert record.refs
