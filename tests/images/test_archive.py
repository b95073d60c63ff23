"""Import and export of ``docker save`` and OCI layout archives, checked with skopeo both ways."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile

import pytest

from evaluations.images.archive import export_image, import_archive
from evaluations.images.errors import ImageError
from evaluations.images.pull import pull
from evaluations.images.store import ImageRecord, ImageStore, now_iso
from evaluations.images.unpack import unpack_layer
from tests.helpers.images import layer, member, push_image

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _skopeo():
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (apt-get install -y skopeo)")


def skopeo(*args: str) -> str:
    done = subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def layers_of(registry):
    return [
        layer(member("etc/"), member("etc/keep", b"kept"), member("etc/gone", b"x"), member("var/cache/"), member("var/cache/old", b"o")),
        layer(member("etc/.wh.gone"), member("var/cache/.wh..wh..opq"), member("var/cache/new", b"n"),
              member("bin/"), member("bin/a", b"same", mode=0o755, uid=1000), member("bin/b", type="hardlink", target="bin/a")),
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", ["docker", "oci"])
def test_a_pulled_image_round_trips_through_skopeo(registry, store, pull_config, tmp_path, fmt):
    pushed = push_image(registry, f"archive/{fmt}:v1", layers=layers_of(registry), config={"Env": ["X=1"]})
    record = pull(pushed.ref, store=store, config=pull_config).record
    out = tmp_path / f"image-{fmt}.tar"
    export_image(store, record, out, format=fmt)
    transport = "docker-archive" if fmt == "docker" else "oci-archive"
    inspected = json.loads(skopeo("inspect", f"{transport}:{out}"))
    assert inspected["Layers"] == (pushed.diff_ids if fmt == "docker" else pushed.layers)  # docker save: plain tars
    assert inspected["Env"] == ["X=1"]
    # skopeo copies it (every blob checked) to the other format; we import that copy.
    other = tmp_path / "copy.tar"
    other_transport = "oci-archive" if fmt == "docker" else "docker-archive"
    skopeo("copy", "--quiet", f"{transport}:{out}", f"{other_transport}:{other}")
    fresh = ImageStore(tmp_path / "fresh")
    (imported,) = import_archive(other, fresh)
    assert imported.layers == pushed.diff_ids and imported.source == "import" and imported.config["Env"] == ["X=1"]
    top = fresh.layer_tree(imported.layers[1])
    assert stat.S_ISCHR((top / "etc/gone").lstat().st_mode)
    assert (top / "bin/a").stat().st_ino == (top / "bin/b").stat().st_ino


def test_archives_skopeo_makes_from_a_registry_import(registry, store, tmp_path):
    pushed = push_image(registry, "archive/src:v2", layers=layers_of(registry))
    for transport in ("docker-archive", "oci-archive"):
        out = tmp_path / f"{transport}.tar"
        skopeo("copy", "--quiet", "--src-tls-verify=false", f"docker://{pushed.ref}", f"{transport}:{out}:{pushed.ref}")
        (record,) = import_archive(out, store)
        assert record.layers == pushed.diff_ids
        if transport == "docker-archive":
            assert record.refs == [pushed.ref]
    assert len({path.name for path in (store.root / "layers").iterdir()}) == 2  # stored once


def test_a_built_image_exports_its_layer_trees_deterministically(store, tmp_path):
    blobs = layers_of(None)
    ids = []
    for blob in blobs:
        counts = {}

        def populate(tree, blob=blob, counts=counts):
            result = unpack_layer(io.BytesIO(blob), tree, layer="built", diff_id=None)
            counts["diff_id"] = result.diff_id
            return result.as_meta()

        layer_id = "sha256:" + hashlib.sha256(blob + b"built").hexdigest()  # a builder's own id
        store.add_layer(layer_id, populate)
        ids.append(layer_id)
    record = store.save_image(
        ImageRecord("sha256:" + "e" * 64, [], {"Cmd": ["sh"]}, ids, 10, "build", now_iso(), now_iso()),
        refs=["localhost/built/img:v1"],
    )
    first, second = tmp_path / "one.tar", tmp_path / "two.tar"
    export_image(store, record, first, format="oci")
    export_image(store, record, second, format="oci")
    assert first.read_bytes() == second.read_bytes()
    inspected = json.loads(skopeo("inspect", f"oci-archive:{first}"))
    assert len(inspected["Layers"]) == 2
    export_image(store, record, tmp_path / "docker.tar", format="docker")
    skopeo("inspect", f"docker-archive:{tmp_path / 'docker.tar'}")
    fresh = ImageStore(tmp_path / "fresh")
    (imported,) = import_archive(tmp_path / "docker.tar", fresh)
    assert imported.refs == ["localhost/built/img:v1"]
    top = fresh.layer_tree(imported.layers[1])
    assert stat.S_ISCHR((top / "etc/gone").lstat().st_mode)
    assert os.getxattr(top / "var/cache", "trusted.overlay.opaque") == b"y"
    assert stat.S_IMODE((top / "bin/a").stat().st_mode) == 0o755 and (top / "bin/a").stat().st_uid == 1000


def test_an_archive_that_is_neither_is_refused(store, tmp_path):
    junk = tmp_path / "junk.tar"
    subprocess.run(["tar", "-cf", str(junk), "-C", str(tmp_path), "."], check=True)
    with pytest.raises(ImageError, match="has neither manifest.json"):
        import_archive(junk, store)
    (tmp_path / "text").write_text("hello")
    with pytest.raises(ImageError, match="cannot be read as a tar file"):
        import_archive(tmp_path / "text", store)


def test_a_layer_tree_deeper_than_path_max_exports_in_name_order(tmp_path):
    """Export walks the layer tree from handles (SPEC §21): a tree deeper than PATH_MAX, which a build
    can now commit, exports like any other, parents before children and names in order."""
    from evaluations.images.archive import tar_layer_tree

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "b").mkdir()
    (tree / "b" / "z").write_bytes(b"z")
    (tree / "b" / "a").symlink_to("/etc/passwd")  # content: its target, never followed
    (tree / "a.txt").write_bytes(b"a")
    long = "d" * 200
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(25):  # 25 x 201 bytes: past PATH_MAX
            os.mkdir(long, dir_fd=fd)
            child = os.open(long, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with os.fdopen(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as bottom:
            bottom.write(b"deep")
    finally:
        os.close(fd)
    out = tmp_path / "layer.tar.gz"
    tar_layer_tree(tree, out)
    with tarfile.open(out) as archive:
        members = archive.getmembers()
        names = [m.name for m in members]
        chain = [("/".join([long] * n)) for n in range(1, 26)]
        assert names == ["a.txt", "b", "b/a", "b/z", *chain, f"{chain[-1]}/bottom"]
        assert members[2].issym() and members[2].linkname == "/etc/passwd"
        assert archive.extractfile(members[-1]).read() == b"deep"
    shutil.rmtree(tree)  # by handles (rmtree's fd walk): the paths are past PATH_MAX
