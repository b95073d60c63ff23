"""Operating the image store (SPEC §16): `manage.py image`, GET /images, the image metrics, and the
store kept under IMAGES_MAX_BYTES after a pull, an import or a build. A real registry on 127.0.0.1,
`manage.py` as a subprocess, builds in the real sandbox."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from evaluations.images.pull import pull
from evaluations.images.store import ImageRecord, ImageStore, now_iso
from tests.helpers.cli import EvaluateCli
from tests.helpers.images import image_config, layer, member, push_image

pytestmark = pytest.mark.slow


def _images_dir() -> Path:
    """Under /tmp, 0711: a build's RUN (the sandbox uid) must reach its step roots below it."""
    folder = Path(tempfile.mkdtemp(prefix="te-images-", dir="/tmp"))
    os.chmod(folder, 0o711)
    return folder


@pytest.fixture
def image_cli(tmp_path, registry, store):  # store: the image tests' root check
    """``manage.py image`` on an IMAGES_DIR of its own, reaching the test registry (and no database)."""
    made = []

    def make(name: str = "cli", **env: str) -> EvaluateCli:
        images = _images_dir()
        runner = EvaluateCli(
            tmp_path / name,
            database=False,
            IMAGES_DIR=str(images),
            IMAGE_INSECURE_REGISTRIES=registry.host,
            ALLOWED_PRIVATE_HOSTS="127.0.0.1,localhost,::1",
            **env,
        )
        runner.images = images
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()
        subprocess.run(["rm", "-rf", "--one-file-system", str(runner.images)], check=False)


def _error(done: subprocess.CompletedProcess) -> str:
    """The one sentence a failing command printed; exit status 1."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: "), done.stderr
    return lines[0].removeprefix("CommandError: ")


def _ok(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout.splitlines()


def test_pull_list_remove_and_prune(image_cli, registry):
    cli = image_cli()
    blob = layer(member("ops/"), member("ops/a", b"a" * 50000))
    first = push_image(registry, "ops/a:v1", layers=[blob])
    second = push_image(registry, "ops/a:v2", layers=[blob])  # the same image under a second tag
    assert second.digest == first.digest
    assert _ok(cli.manage("image", "pull", first.ref))[-1] == f"pulled {first.ref}: {first.digest}"
    assert _ok(cli.manage("image", "pull", first.ref))[-1] == f"pulled {first.ref}: {first.digest} (cached)"
    assert (
        _ok(cli.manage("image", "pull", second.ref))[-1] == f"pulled {first.ref}, {second.ref}: {first.digest} (cached)"
    )

    rows = json.loads(cli.manage("image", "list", "--json").stdout)
    assert rows == ImageStore(cli.images).listing()
    assert [(row["ref"], row["digest"]) for row in rows] == [(first.ref, first.digest), (second.ref, first.digest)]
    assert rows[0]["size_bytes"] >= 50000
    table = _ok(cli.manage("image", "list"))
    assert table[0].split() == ["REF", "DIGEST", "SIZE", "LAST", "USED"]
    for line, ref in zip(table[1:3], (first.ref, second.ref), strict=True):
        assert re.fullmatch(
            rf"{re.escape(ref)} +{first.digest[:19]} +[0-9.]+ KiB +\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d", line
        )
    assert table[3].startswith("2 references; ")

    # An unknown reference is an error; the others given with it are still removed.
    removing = cli.manage("image", "remove", first.ref, f"{registry.host}/ops/never:v1")
    assert _error(removing) == f"There is no image {registry.host}/ops/never:v1 in the store."
    assert removing.stdout == f"removed {first.ref} ({first.digest})\n"
    assert [row["ref"] for row in ImageStore(cli.images).listing()] == [second.ref]  # the image stays for v2
    assert _ok(cli.manage("image", "remove", first.digest)) == [f"removed {first.digest} ({first.digest})"]
    assert ImageStore(cli.images).listing() == []
    freed = _ok(cli.manage("image", "prune"))
    assert re.fullmatch(r"freed [0-9.]+ KiB", freed[0]) and freed != ["freed 0 B"]
    assert list((cli.images / "layers").iterdir()) == []
    assert _ok(cli.manage("image", "prune")) == ["freed 0 B"]


def test_errors_are_one_sentence_and_exit_1(image_cli, registry, tmp_path):
    cli = image_cli()
    assert _error(cli.manage("image", "pull", "Not A Ref")).startswith("The image reference 'Not A Ref' ")
    unknown = _error(cli.manage("image", "pull", f"{registry.host}/ops/never:v1"))
    assert unknown == f"The registry {registry.host} has no manifest v1 of ops/never (MANIFEST_UNKNOWN)."
    assert _error(cli.manage("image", "pull", "127.0.0.1:9/ops/a:v1")) == (
        "The registry 127.0.0.1:9 cannot be reached for the manifest v1 of ops/a (connection refused)."
    )
    assert _error(cli.manage("image", "remove", "ops/a:v1")) == "There is no image docker.io/ops/a:v1 in the store."
    assert _error(cli.manage("image", "export", "ops/a:v1", str(tmp_path / "a.tar"))) == (
        "There is no image ops/a:v1 in the store."
    )
    assert (
        _error(cli.manage("image", "import", str(tmp_path / "none.tar")))
        == f"There is no file {tmp_path / 'none.tar'}."
    )
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    assert _error(cli.manage("image", "import", str(tmp_path / "junk.tar"))) == (
        f"The image archive {tmp_path / 'junk.tar'} cannot be read as a tar file (plain, gzip, bzip2 or xz)."
    )
    assert cli.manage("image", "build", str(tmp_path), "--build-arg", "NOEQUALS").stderr == (
        "CommandError: --build-arg NOEQUALS: expected K=V\n"
    )


@pytest.mark.parametrize("form", ["docker", "oci"])
def test_export_then_import_elsewhere_and_the_import_evicts_down_to_the_cap(image_cli, registry, tmp_path, form):
    source = image_cli("source")
    pushed = push_image(registry, "ops/moved:v1", layers=[layer(member("moved", b"m" * 40000))], config={"Cmd": ["x"]})
    _ok(source.manage("image", "pull", pushed.ref))
    archive = tmp_path / f"moved-{form}.tar"
    assert _ok(source.manage("image", "export", pushed.ref, str(archive), "--format", form)) == [
        f"exported {pushed.ref} ({pushed.digest}) to {archive} ({form} format)"
    ]
    assert tarfile.is_tarfile(archive)

    target = image_cli("target", IMAGES_MAX_BYTES="1")  # only the newest image ever stays
    old = push_image(registry, "ops/old:v1", layers=[layer(member("old", b"o" * 40000))])
    _ok(target.manage("image", "pull", old.ref))
    imported = _ok(target.manage("image", "import", str(archive)))
    assert len(imported) == 1 and imported[0].startswith("imported ")
    rows = ImageStore(target.images).listing()
    assert [row["ref"] for row in rows] == ([pushed.ref] if form == "docker" else [rows[0]["ref"]])
    record = ImageStore(target.images).image(rows[0]["digest"])
    assert record.config == {"Cmd": ["x"]} and record.layers == pushed.diff_ids and record.source == "import"
    assert not any(row["digest"] == old.digest for row in rows)  # evicted by the import


def test_eviction_runs_once_when_the_outermost_addition_ends(registry, store, pull_config):
    """A build's FROM pulls nest in the build's own ``using``: nothing is evicted until it ends, and
    then never what it added."""
    capped = ImageStore(store.root, max_bytes=1)
    images = [push_image(registry, f"ops/nest{n}:v1", layers=[layer(member(f"n{n}", b"n" * 30000))]) for n in range(3)]
    pull(images[0].ref, store=capped, config=pull_config)
    with capped.using():
        pull(images[1].ref, store=capped, config=pull_config)
        pull(images[2].ref, store=capped, config=pull_config)
        assert {record.digest for record in capped.images()} == {image.digest for image in images}
    assert {record.digest for record in capped.images()} == {images[1].digest, images[2].digest}


@pytest.mark.django_db
def test_get_images_and_the_image_metrics(api, executor_config, registry, store):
    config = image_config(registry, IMAGES_DIR=str(store.root), IMAGE_TAG_TTL_SECS="3600")
    executor_config(images_dir=store.root)
    blob = layer(member("api", b"p" * 20000))
    first, second = push_image(registry, "ops/api:v1", layers=[blob]), push_image(registry, "ops/api:v2", layers=[blob])
    assert api.get("/images").json() == []
    assert _metric(api, "term_executor_image_pulls_total") == 0

    assert not pull(first.ref, store=ImageStore.of(config), config=config).cached  # a pull
    assert pull(first.ref, store=ImageStore.of(config), config=config).cached  # within the TTL: a hit, no network
    assert pull(second.ref, store=ImageStore.of(config), config=config).cached  # asked the registry, fetched nothing
    untagged = ImageRecord("sha256:" + "e" * 64, [], {}, [first.diff_ids[0]], 20000, "build", now_iso(), now_iso())
    store.save_image(untagged)  # a build without --tag

    rows = api.get("/images").json()
    assert rows == store.listing()
    assert [(row["ref"], row["digest"]) for row in rows] == [
        (None, untagged.digest), (first.ref, first.digest), (second.ref, first.digest),
    ]  # fmt: skip
    assert rows[1]["size_bytes"] == store.image(first.digest).size_bytes and rows[1]["last_used_at"].endswith("Z")
    assert _metric(api, "term_executor_image_pulls_total") == 1
    assert _metric(api, "term_executor_image_cache_hits_total") == 2
    assert _metric(api, "term_executor_image_builds_total") == 0
    assert _metric(api, "term_executor_image_bytes") == store.total_bytes() > 20000

    executor_config(auth_tokens=("tok",))
    assert api.get("/images").status_code == 401
    assert api.get("/images", HTTP_AUTHORIZATION="Bearer tok").json() == rows


def _metric(api, name: str) -> float:
    text = api.get("/metrics").content.decode()
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_build_tags_the_image_and_a_rebuild_is_cached(image_cli, base_image, bwrap_runtime, tmp_path):
    """`image build` through the worker's sandbox as a leased uid, egress proxy on (BUILD_NETWORK's default)."""
    _registry, base_ref, _digest = base_image
    cli = image_cli()
    _ok(cli.manage("image", "pull", base_ref, timeout=600))
    context = tmp_path / "context"
    context.mkdir()
    (context / "note.txt").write_text("from the context\n")
    (context / "Dockerfile.ops").write_text(
        f'FROM {base_ref}\nARG GREETING=hello\nCOPY note.txt /opt/note.txt\nRUN echo "$GREETING" > /opt/greeting\n'
    )
    args = ("image", "build", str(context), "--file", str(context / "Dockerfile.ops"), "--tag", "localhost/ops/built:v1",
            "--build-arg", "GREETING=hi there")  # fmt: skip
    built = _ok(cli.manage(*args, timeout=600))
    final = re.fullmatch(r"built localhost/ops/built:v1: (sha256:[0-9a-f]{64})", built[-1])
    assert final, built
    store = ImageStore(cli.images)
    record = store.image(final.group(1))
    assert record.source == "build" and record.refs == ["localhost/ops/built:v1"]
    top = store.layer_tree(record.layers[-1])
    assert (top / "opt" / "greeting").read_text() == "hi there\n"
    assert (store.layer_tree(record.layers[-2]) / "opt" / "note.txt").read_text() == "from the context\n"
    assert _ok(cli.manage(*args, timeout=600))[-1] == f"built localhost/ops/built:v1: {record.digest} (cached)"
    # base pulled; the first build's FROM a cache hit, its build a build; the second: FROM and build both hits
    assert store.counts() == {"pulls": 1, "builds": 1, "cache_hits": 3}
    assert list((cli.images / "builds").iterdir()) == []  # a build leaves nothing behind

    failing = context / "Dockerfile.fails"
    failing.write_text(f"FROM {base_ref}\nRUN echo broken >&2; exit 3\n")
    message = _error(cli.manage("image", "build", str(context), "--file", str(failing), timeout=600))
    assert message.startswith("Dockerfile line 2 (RUN): "), message
