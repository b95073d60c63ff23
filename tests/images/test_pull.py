"""Pulling from a real registry (Debian's docker-registry on 127.0.0.1), and from a fake one for
what a real registry never does (wrong bytes, 5xx, a token realm, a CDN redirect)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from evaluations.images.errors import ImageError, ImageUnavailable
from evaluations.images.pull import pull
from tests.helpers.httpserver import TestHTTPServer, respond_with
from tests.helpers.images import FakeRegistry, RegistryServer, image_config, layer, member, push_image, push_index
from tests.helpers.service import PROJECT

pytestmark = pytest.mark.slow


def base_layer():
    return layer(
        member("etc/"),
        member("etc/os-release", b"ID=test\n"),
        member("bin/"),
        member("bin/tool", b"#!/bin/sh\n", mode=0o755),
    )


def test_a_single_layer_image(registry, store, pull_config):
    pushed = push_image(
        registry, "pull/single:v1", layers=[base_layer()], config={"Env": ["A=1"], "WorkingDir": "/srv"}
    )
    lines = []
    result = pull(pushed.ref, store=store, config=pull_config, progress=lines.append)
    record = result.record
    assert not result.cached
    assert record.digest == pushed.digest and record.layers == pushed.diff_ids and record.source == "pull"
    assert record.refs == [pushed.ref]
    assert record.config == {"Env": ["A=1"], "WorkingDir": "/srv"}
    assert lines == [f"layer {pushed.layers[0][:19]}… 0.0 MB pulled"]
    tree = store.layer_tree(pushed.diff_ids[0])
    assert (tree / "etc/os-release").read_bytes() == b"ID=test\n"
    assert store.layer_meta(pushed.diff_ids[0])["files"] == 4
    for blob in (pushed.digest, pushed.config_digest, *pushed.layers):  # kept for export
        assert store.has_blob(blob)
    assert store.image(pushed.digest) is not None


def test_layers_shared_between_images_are_stored_and_downloaded_once(registry, store, pull_config):
    shared = base_layer()
    one = push_image(registry, "pull/one:v1", layers=[shared, layer(member("one", b"1"))])
    two = push_image(registry, "pull/two:v1", layers=[shared, layer(member("two", b"2"), compression="zstd")], oci=True)
    pull(one.ref, store=store, config=pull_config)
    lines = []
    result = pull(two.ref, store=store, config=pull_config, progress=lines.append)
    assert lines == [f"layer {two.layers[0][:19]}… cached", f"layer {two.layers[1][:19]}… 0.0 MB pulled"]
    assert not result.cached
    assert sorted(path.name for path in (store.root / "layers").iterdir()) == sorted(
        {d.split(":")[1] for d in one.diff_ids + two.diff_ids}
    )
    assert (store.layer_tree(two.diff_ids[1]) / "two").read_bytes() == b"2"


def test_a_tag_is_asked_again_only_after_its_ttl_and_a_digest_never(store, tmp_path):
    with RegistryServer() as own:
        first = push_image(own, "ttl/img:v1", layers=[layer(member("v", b"1"))])
        config = image_config(own, IMAGE_TAG_TTL_SECS="3600")
        assert not pull(first.ref, store=store, config=config).cached
        second = push_image(own, "ttl/img:v1", layers=[layer(member("v", b"2"))])
        again = pull(first.ref, store=store, config=config)  # within the TTL: the store's answer
        assert again.cached and again.record.digest == first.digest
        fresh = pull(first.ref, store=store, config=image_config(own, IMAGE_TAG_TTL_SECS="0"))
        assert not fresh.cached and fresh.record.digest == second.digest
        by_digest = f"{own.host}/ttl/img@{first.digest}"
        assert pull(by_digest, store=store, config=config).record.digest == first.digest
    # The registry is gone: a tag within its TTL and a digest the store has need no network.
    assert pull(first.ref, store=store, config=config).record.digest == second.digest
    assert pull(by_digest, store=store, config=config).cached
    with pytest.raises(ImageUnavailable, match="cannot be reached"):
        pull(first.ref, store=store, config=image_config(own, IMAGE_TAG_TTL_SECS="0"))


def test_a_manifest_list_is_narrowed_to_this_platform(registry, store, pull_config):
    arm = push_image(registry, "multi/img:arm", layers=[layer(member("arch", b"arm64"))], architecture="arm64")
    amd = push_image(registry, "multi/img:amd", layers=[layer(member("arch", b"amd64"))])
    s390 = push_image(registry, "multi/img:s390", layers=[layer(member("arch", b"s390x"))], architecture="s390x")
    index = push_index(
        registry,
        "multi/img:all",
        [
            (arm, {"os": "linux", "architecture": "arm64", "variant": "v8"}),
            (amd, {"os": "linux", "architecture": "amd64"}),
        ],
    )
    if os.uname().machine != "x86_64":
        pytest.skip("the images here are for amd64")
    result = pull(f"{registry.host}/multi/img:all", store=store, config=pull_config)
    assert result.record.digest == amd.digest
    assert (store.layer_tree(result.record.layers[0]) / "arch").read_bytes() == b"amd64"
    by_index = pull(f"{registry.host}/multi/img@{index}", store=store, config=pull_config)
    assert by_index.record.digest == amd.digest
    assert pull(f"{registry.host}/multi/img@{index}", store=store, config=pull_config).cached

    push_index(
        registry,
        "multi/img:other",
        [
            (arm, {"os": "linux", "architecture": "arm64", "variant": "v8"}),
            (s390, {"os": "linux", "architecture": "s390x"}),
        ],
        oci=True,
    )
    with pytest.raises(ImageError) as caught:
        pull(f"{registry.host}/multi/img:other", store=store, config=pull_config)
    assert str(caught.value) == (
        f"There is no manifest for linux/amd64 in {registry.host}/multi/img:other (has: linux/arm64/v8, linux/s390x)."
    )
    assert caught.value.kind == "task_invalid"


def test_unknown_images_and_tags_are_the_tasks_fault(registry, store, pull_config):
    push_image(registry, "known/img:v1", layers=[base_layer()])
    with pytest.raises(ImageError) as caught:
        pull(f"{registry.host}/known/img:nope", store=store, config=pull_config)
    assert type(caught.value) is ImageError
    assert str(caught.value) == f"The registry {registry.host} has no manifest nope of known/img (MANIFEST_UNKNOWN)."
    with pytest.raises(ImageError) as caught:
        pull(f"{registry.host}/unknown/img:v1", store=store, config=pull_config)
    assert type(caught.value) is ImageError
    assert str(caught.value).startswith(f"The registry {registry.host} has no manifest v1 of unknown/img")


def test_server_errors_and_unreachable_registries_are_ours(store):
    with TestHTTPServer() as server:
        server.route("/v2/broken/img/manifests/v1", respond_with(503, b"down for maintenance"))
        config = image_config(
            None, ALLOWED_PRIVATE_HOSTS="127.0.0.1", IMAGE_INSECURE_REGISTRIES=f"127.0.0.1:{server.port}"
        )
        with pytest.raises(ImageUnavailable) as caught:
            pull(f"127.0.0.1:{server.port}/broken/img:v1", store=store, config=config)
        assert str(caught.value) == (
            f"The registry 127.0.0.1:{server.port} answered HTTP 503 for the manifest v1 of broken/img."
        )
        assert caught.value.kind == "infrastructure"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        config = image_config(None, ALLOWED_PRIVATE_HOSTS="127.0.0.1", IMAGE_INSECURE_REGISTRIES=f"127.0.0.1:{port}")
        with pytest.raises(
            ImageUnavailable, match=rf"The registry 127.0.0.1:{port} cannot be reached .*connection refused"
        ):
            pull(f"127.0.0.1:{port}/gone/img:v1", store=store, config=config)


def test_a_layer_whose_bytes_differ_from_its_digest_is_refused(store):
    with TestHTTPServer() as server:
        fake = FakeRegistry(server, "bad/img", "v1", [base_layer(), layer(member("x", b"x"))], corrupt=1)
        config = image_config(
            None, ALLOWED_PRIVATE_HOSTS="127.0.0.1", IMAGE_INSECURE_REGISTRIES=f"127.0.0.1:{server.port}"
        )
        with pytest.raises(ImageError) as caught:
            pull(fake.ref, store=store, config=config)
    bad = fake.layer_digests[1]
    assert str(caught.value).startswith(f"Layer {bad} does not match its manifest: got ")
    assert caught.value.kind == "task_invalid"
    assert not store.has_blob(bad) and store.images() == []
    assert list((store.root / "tmp").iterdir()) == []


def test_a_private_registry_is_reached_only_when_allowed(registry, store):
    pushed = push_image(registry, "private/img:v1", layers=[base_layer()])
    refused = image_config(None, IMAGE_INSECURE_REGISTRIES=registry.host)
    with pytest.raises(ImageError) as caught:
        pull(pushed.ref, store=store, config=refused)
    assert type(caught.value) is ImageError
    assert "registry host 127.0.0.1 resolves to" in str(caught.value)
    allowed = image_config(None, IMAGE_INSECURE_REGISTRIES=registry.host, ALLOWED_PRIVATE_HOSTS="127.0.0.0/8")
    assert pull(pushed.ref, store=store, config=allowed).record.digest == pushed.digest


def test_credentials_from_the_auth_file(store, tmp_path):
    with RegistryServer(users={"alice": "s3cret"}) as private:
        pushed = push_image(private, "secret/img:v1", layers=[base_layer()])
        with pytest.raises(ImageError) as caught:
            pull(pushed.ref, store=store, config=image_config(private))
        assert type(caught.value) is ImageError and "needs credentials" in str(caught.value)

        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps({"auths": {private.host: {"username": "alice", "password": "nope"}}}))
        with pytest.raises(ImageUnavailable, match="refused the credentials of REGISTRY_AUTH_FILE"):
            pull(pushed.ref, store=store, config=image_config(private, REGISTRY_AUTH_FILE=str(wrong)))

        docker = tmp_path / "config.json"  # Docker's form: base64 user:password
        auth = base64.b64encode(b"alice:s3cret").decode()
        docker.write_text(json.dumps({"auths": {f"http://{private.host}": {"auth": auth}}}))
        assert (
            pull(pushed.ref, store=store, config=image_config(private, REGISTRY_AUTH_FILE=str(docker))).record.digest
            == pushed.digest
        )


def test_bearer_tokens_from_the_realm_and_blobs_redirected_to_a_cdn(store):
    with TestHTTPServer() as server, TestHTTPServer() as cdn:
        fake = FakeRegistry(server, "tok/img", "v1", [base_layer()], token="t0k3n", cdn=cdn)
        config = image_config(
            None, ALLOWED_PRIVATE_HOSTS="127.0.0.1", IMAGE_INSECURE_REGISTRIES=f"127.0.0.1:{server.port}"
        )
        result = pull(fake.ref, store=store, config=config)
    assert result.record.digest == fake.digest
    assert fake.authorizations[0] == "" and "Bearer t0k3n" in fake.authorizations
    assert {d: fake.blob_gets[d] for d in fake.layer_digests} == {d: 1 for d in fake.layer_digests}  # by the CDN
    assert any(request["path"].startswith("/cdn/") for request in cdn.requests)


def test_https_with_the_trust_store(store):
    with RegistryServer(tls=True) as secure:
        pushed = push_image(secure, "tls/img:v1", layers=[base_layer()])
        assert pull(pushed.ref, store=store, config=image_config(secure)).record.digest == pushed.digest
        untrusting = image_config(None, ALLOWED_PRIVATE_HOSTS="localhost,127.0.0.1,::1", IMAGE_TAG_TTL_SECS="0")
        with pytest.raises(ImageUnavailable, match="TLS certificate verification failed"):
            pull(pushed.ref, store=store, config=untrusting)


def test_a_mirror_is_tried_first_then_the_registry(registry, store):
    with RegistryServer() as mirror:
        only_on_mirror = push_image(mirror, "mirrored/img:v1", layers=[base_layer()])
        only_on_registry = push_image(registry, "mirrored/img:v2", layers=[layer(member("v2", b"2"))])
        config = image_config(
            registry,
            IMAGE_INSECURE_REGISTRIES=f"{registry.host},{mirror.host}",
            IMAGE_REGISTRY_MIRRORS=f"{registry.host}={mirror.host}",
        )
        assert (
            pull(f"{registry.host}/mirrored/img:v1", store=store, config=config).record.digest == only_on_mirror.digest
        )
        assert (
            pull(f"{registry.host}/mirrored/img:v2", store=store, config=config).record.digest
            == only_on_registry.digest
        )


CHILD = """
import sys
from evaluations.images.pull import pull
from evaluations.images.store import ImageStore
from tests.helpers.images import image_config
config = image_config(None, ALLOWED_PRIVATE_HOSTS="127.0.0.1", IMAGE_INSECURE_REGISTRIES=sys.argv[3])
pull(sys.argv[1], store=ImageStore(sys.argv[2]), config=config, progress=lambda line: print(line, flush=True))
"""


def test_two_processes_pulling_one_image_download_each_layer_once(store):
    layers = [base_layer(), layer(member("a", os.urandom(200000))), layer(member("b", b"b"))]
    with TestHTTPServer() as server:
        # Every blob is held half sent until both children have the manifest: the second is then
        # under way while the first downloads, and finds each layer there once it has its lock.
        fake = FakeRegistry(server, "conc/img", "v1", layers, hold_until_manifests=2)
        argv = [sys.executable, "-c", textwrap.dedent(CHILD), fake.ref, str(store.root), f"127.0.0.1:{server.port}"]
        children = [
            subprocess.Popen(argv, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outputs = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    assert {d: fake.blob_gets[d] for d in fake.layer_digests} == {d: 1 for d in fake.layer_digests}
    lines = "".join(out for out, _ in outputs).splitlines()
    assert sum(line.endswith("pulled") for line in lines) == 3 and sum(line.endswith("cached") for line in lines) == 3
    assert [record.digest for record in store.images()] == [fake.digest]
