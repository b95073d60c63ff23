"""Image content never reaches the host (SPEC §21, issue 34 items 1 and 5): what a Dockerfile's
``ADD`` archive, ``COPY`` destination or stage holds is resolved inside the image's root, and
``COPY``/``ADD`` count against the build's disk and file limits before writing.

Each attack is a real build (the suite's Debian tree as the base image, real RUNs in bubblewrap)
aimed at a host folder made for the test; each asserts that folder is exactly as it was.
"""

from __future__ import annotations

import io
import os
import re
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest

from evaluations.images.build import build
from evaluations.images.errors import ImageError
from tests.images.build_support import BASE_REF, config_for, environment, write_context
from tests.images.conftest import build_images_dir, build_store, bwrap_runtime, debian_image  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds mount image roots: root only")

ROOT = Path(__file__).resolve().parents[2]
LONG = "n" * 200  # 24 of them: 4800 characters, past PATH_MAX


@pytest.fixture
def builder(bwrap_runtime, build_store, build_images_dir, debian_image, tmp_path):  # noqa: F811
    """builder(files, **config) -> BuildResult: a build of ``files`` as the context."""

    def run(files: dict, **settings):
        context = write_context(tmp_path / "ctx", files)
        env = environment(bwrap_runtime, config_for(build_images_dir, **settings))
        return build(context / "Dockerfile", context, None, None, store=build_store, env=env)

    return run


@pytest.fixture
def host_folder():
    """A root-owned folder on the host holding ``victimdir`` (0755) and ``file``: the target."""
    folder = Path(tempfile.mkdtemp(prefix="te-victim-", dir="/tmp"))
    os.chmod(folder, 0o755)
    (folder / "victimdir").mkdir(mode=0o755)
    (folder / "file").write_text("host\n")
    before = snapshot(folder)
    yield folder
    assert snapshot(folder) == before, "the build changed a folder of the host"
    for path in sorted(folder.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    folder.rmdir()


def snapshot(folder: Path) -> dict:
    """Every entry below ``folder`` (and itself) with its type, mode, owner and content."""
    found = {}
    for path in [folder, *folder.rglob("*")]:
        st = os.lstat(path)
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        found[str(path)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, data)
    return found


def layer_file(store, record, path: str) -> Path | None:
    for layer in reversed(record.layers):
        candidate = store.layer_tree(layer) / path.lstrip("/")
        if os.path.lexists(candidate):
            return candidate
    return None


def tar_of(*members) -> bytes:
    """members: (name, "dir" | "file" | "link", link target or content, mode)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, value, mode in members:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid = mode, 1000, 1000
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, value
                tar.addfile(info)
            else:
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
    return out.getvalue()


def test_an_add_archive_swapping_its_own_link_never_changes_a_host_folder(builder, build_store, host_folder):  # noqa: F811
    """Issue 34 #1: ``q/``, ``p -> q``, ``p/victimdir/`` (0777), then ``p -> <host folder>``:
    extractall applied the folder's mode and owner at the end, through the swapped link."""
    archive = tar_of(
        ("q", "dir", "", 0o755),
        ("p", "link", "q", 0o777),
        ("p/victimdir", "dir", "", 0o777),
        ("p", "link", str(host_folder), 0o777),
    )
    result = builder({"Dockerfile": f"FROM {BASE_REF}\nADD evil.tar /x/\n", "evil.tar": archive})
    record = result.record
    victim = os.lstat(layer_file(build_store, record, "/x/q/victimdir"))
    assert stat.S_IMODE(victim.st_mode) == 0o777 and victim.st_uid == 1000  # in the image, the image's ids
    assert os.readlink(layer_file(build_store, record, "/x/p")) == str(host_folder)


def test_a_chain_of_short_links_past_path_max_stays_in_the_image(builder, build_store, host_folder):  # noqa: F811
    """Issue 34 #1: realpath gives up past PATH_MAX (it takes the rest as named), so a file below
    a deep chain of links and one last link to the host passed the check and was written there."""
    members = [(LONG, "dir", "", 0o755)]
    for level in range(1, 25):
        previous = f"k{level - 1}/{LONG}" if level > 1 else LONG
        members += [(f"k{level}", "link", previous, 0o777), (f"k{level}/{LONG}", "dir", "", 0o755)]
    members += [("k24/esc", "link", str(host_folder), 0o777), ("k24/esc/planted", "file", b"x\n", 0o644)]
    files = {"Dockerfile": f"FROM {BASE_REF}\nADD evil.tar /deep/\n", "evil.tar": tar_of(*members)}
    # The member lands in the image, below the image's own copy of the host folder's path, and the
    # layer is committed from handles however deep it goes; the host folder is unchanged (host_folder).
    record = builder(files).record
    layer = build_store.layer_tree(record.layers[-1])
    bottom = os.open(layer / "deep", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in [LONG] * 24:  # k24 -> k23/LONG -> ... -> LONG: the chain's real folders
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=bottom)
            os.close(bottom)
            bottom = nxt
        assert os.readlink("esc", dir_fd=bottom) == str(host_folder)  # a link, as the archive had it
    finally:
        os.close(bottom)
    top = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = [path for path in _walk_names(top) if path.endswith("/planted")]
    finally:
        os.close(top)
    assert found == [str(host_folder).lstrip("/") + "/planted"]  # the host's path, inside the image


def _walk_names(top: int) -> list[str]:
    """Every path below the folder handle ``top`` (no link followed), walked from handles."""
    found, stack = [], [("", os.dup(top))]
    while stack:
        rel, fd = stack.pop()
        try:
            for name in os.listdir(fd):
                path = f"{rel}/{name}" if rel else name
                found.append(path)
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    stack.append((path, os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)))
        finally:
            os.close(fd)
    return found


def test_copy_through_the_image_s_links_to_root_lands_inside_the_image(builder, build_store, host_folder):  # noqa: F811
    """A COPY destination whose parent in the image is a link to ``/`` (and one through a link to
    the host folder's path): written in the image, never on the host."""
    marker = f"te-copied-{os.getpid()}.txt"
    dockerfile = (
        f"FROM {BASE_REF}\n"
        f"RUN ln -s / /w && ln -s {host_folder} /h\n"
        f"COPY {marker} /w/tmp/\n"
        f"COPY {marker} /h/copied.txt\n"
    )
    record = builder({"Dockerfile": dockerfile, marker: "inside\n"}).record
    assert layer_file(build_store, record, f"/tmp/{marker}").read_text() == "inside\n"
    assert layer_file(build_store, record, f"{host_folder}/copied.txt").read_text() == "inside\n"
    assert not os.path.lexists(f"/tmp/{marker}")


def _nothing_left(store, images_dir: Path, layers_before: set[str]) -> None:
    assert not list((images_dir / "builds").iterdir())  # the build folder and its lock went
    assert {path.name for path in (images_dir / "layers").iterdir()} == layers_before


def test_copy_of_a_sparse_file_counts_its_size_against_the_build_quota(builder, build_store, build_images_dir):  # noqa: F811
    """Issue 34 #5: ``RUN truncate`` then ``COPY --from=0`` wrote every zero of a sparse file."""
    layers = {path.name for path in (build_images_dir / "layers").iterdir()}
    # Each under the quota (RUN's RLIMIT_FSIZE is the quota), a few KiB on disk; 60 MiB copied.
    dockerfile = f"FROM {BASE_REF}\nRUN truncate -s 20M /a /b /c\nFROM {BASE_REF}\nCOPY --from=0 /a /b /c /g/\n"
    with pytest.raises(ImageError) as caught:
        builder({"Dockerfile": dockerfile}, DISK_QUOTA_MB="32")
    assert caught.value.kind == "task_invalid"
    assert str(caught.value) == (
        "Dockerfile line 4 (COPY): copying /b (20 MiB) would take the build past its disk quota (DISK_QUOTA_MB=32)."
    )
    created = {path.name for path in (build_images_dir / "layers").iterdir()} - layers
    assert len(created) <= 1  # the RUN's layer (a sparse file, a few KiB); nothing of the COPY
    _nothing_left(build_store, build_images_dir, layers | created)


def test_copy_and_add_count_files_against_max_files(builder, build_store, build_images_dir):  # noqa: F811
    layers = {path.name for path in (build_images_dir / "layers").iterdir()}
    files = {f"many/{n:03}": "" for n in range(120)}
    with pytest.raises(ImageError) as caught:
        builder({"Dockerfile": f"FROM {BASE_REF}\nCOPY many /many/\n", **files}, MAX_FILES="100")
    assert re.fullmatch(
        r"Dockerfile line 2 \(COPY\): copying /many/\d+ would take the build past its file count limit "
        r"\(MAX_FILES=100\)\.",
        str(caught.value),
    ), str(caught.value)
    archive = tar_of(*[(f"f{n}", "file", b"", 0o644) for n in range(120)])
    with pytest.raises(ImageError) as caught:
        builder({"Dockerfile": f"FROM {BASE_REF}\nADD a.tar /a/\n", "a.tar": archive}, MAX_FILES="100")
    assert "would take the build past its file count limit (MAX_FILES=100)." in str(caught.value)
    _nothing_left(build_store, build_images_dir, layers)


# Where a host path is built from content of an image, an archive or an agent, these never come back.
_FORBIDDEN = re.compile(r"os\.path\.realpath\(|\.extractall\(|\.resolve\(\)")
_SCANNED = ("evaluations/images", "evaluations/artifacts.py", "evaluations/pipeline")
_ALLOWED: set[tuple[str, str]] = set()  # none: the task folder too goes through inroot (tasks/readers.inside_task)


def test_no_realpath_then_open_nor_extractall_on_image_content():
    found = set()
    for scanned in _SCANNED:
        top = ROOT / scanned
        for path in [top] if top.is_file() else sorted(top.rglob("*.py")):
            for line in path.read_text().splitlines():
                if _FORBIDDEN.search(line) and not line.strip().startswith("#"):
                    found.add((str(path.relative_to(ROOT)), line.strip()))
    assert found - _ALLOWED == set(), "use evaluations/images/inroot.py for paths inside an image"


# One resolver (issue 34): a link of a tree someone else shaped is followed only by
# evaluations/images/inroot.py. Reading a link's target anywhere else is a second hand-written
# link-follower in the making; each use that only keeps the target as content is listed, with why.
_LINK_READ = re.compile(r"\breadlink\(|\.readlink\(\)")
_RESOLVER = "evaluations/images/inroot.py"
_LINK_SCANNED = ("evaluations/images", "evaluations/environments", "evaluations/pipeline")
_LINK_CONTENT = {
    # A layer's link is content: its target goes into the layer's id, never followed.
    ("evaluations/images/commit.py", "tail = os.readlink(name, dir_fd=folder)"),
    # The agent patch shows a link's target as the link's content (git's format).
    ("evaluations/images/diff.py", 'return _Side("link", os.fsencode(os.readlink(name, dir_fd=dir_fd)), "120000")'),
    # The isolated verifier's layer copies a link as a link (the same target, made with symlinkat).
    ("evaluations/images/isolate.py", "os.symlink(os.readlink(name, dir_fd=source), as_name, dir_fd=target)"),
    # A build context's link is recorded as an entry to COPY as a link, never followed.
    (
        "evaluations/images/context.py",
        'found.append(Entry(out, "link", 0o777, rel, target=os.readlink(name, dir_fd=folder)))',
    ),
    # Export: a store layer's link becomes a tar SYMTYPE member's linkname.
    ("evaluations/images/archive.py", "info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=folder)"),
    # A staged static asset's digest (the executor's copy, made before any task code): the target as bytes.
    ("evaluations/pipeline/steps.py", 'digest.update(b"link:" + os.fsencode(os.readlink(child)))'),
}


def test_no_link_is_followed_by_hand_outside_the_resolver():
    found = set()
    for scanned in _LINK_SCANNED:
        for path in sorted((ROOT / scanned).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if relative == _RESOLVER:
                continue
            for line in path.read_text().splitlines():
                if _LINK_READ.search(line) and not line.strip().startswith("#"):
                    found.add((relative, line.strip()))
    assert found, "the scan sees no link read at all: it is looking in the wrong place"
    assert found - _LINK_CONTENT == set(), (
        "a link's target is read outside evaluations/images/inroot.py: resolve paths with inroot.resolve "
        "or inroot.open_in (or, for a target kept as content, list it here with the reason)"
    )
    assert _LINK_CONTENT - found == set(), "an allowed use is gone: remove it from the list"
