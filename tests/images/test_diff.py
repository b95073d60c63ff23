"""agent_patch for a task without a repository: the evaluation's layer read as a change set (SPEC §16).

The upper folders here are made by hand in overlayfs' format (root makes the whiteouts); the
pipeline's own test runs a real agent in a real image (tests/images/test_image_e2e.py).
"""

from __future__ import annotations

import os
import shutil

import pytest

from evaluations.images.diff import MAX_FILE_BYTES, image_patch
from evaluations.safefs import remove_tree_nofollow

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts are device nodes: root makes them")


def write(path, data: bytes | str = b"", mode=0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def whiteout(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))


@pytest.fixture
def layers(tmp_path):
    base, upper = tmp_path / "base", tmp_path / "upper"
    write(base / "app/main.py", "print('hello')\n")
    write(base / "app/gone.txt", "old\n")
    write(base / "app/data/a.txt", "a\n")
    write(base / "app/data/b.txt", "b\n")
    write(base / "app/logo.png", b"\x89PNG\0\0binary")
    write(base / "etc/passwd", "root:x:0:0::/root:/bin/sh\n")
    (upper / "app").mkdir(parents=True)
    return base, upper


def test_edits_additions_removals_and_binaries_are_shown_as_git_does(layers):
    base, upper = layers
    write(upper / "app/main.py", "print('hello, world')\n")
    write(upper / "app/new.sh", "echo new\n", 0o755)
    whiteout(upper / "app/gone.txt")
    write(upper / "app/logo.png", b"\x89PNG\0\0other")
    write(upper / "etc/passwd", "changed outside the WorkingDir\n")
    patch = image_patch(upper, base, "/app", max_bytes=100_000)
    assert "diff --git a/main.py b/main.py\n--- a/main.py\n+++ b/main.py\n" in patch
    assert "-print('hello')\n+print('hello, world')\n" in patch
    assert "diff --git a/new.sh b/new.sh\nnew file mode 100755\n--- /dev/null\n+++ b/new.sh\n" in patch
    assert "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\n--- a/gone.txt\n+++ /dev/null\n" in patch
    assert "Binary files a/logo.png and b/logo.png differ" in patch
    assert "passwd" not in patch  # outside WorkingDir


def test_an_opaque_folder_removes_what_the_image_held_there(layers):
    base, upper = layers
    write(upper / "app/data/c.txt", "c\n")
    os.setxattr(upper / "app/data", "trusted.overlay.opaque", b"y")
    patch = image_patch(upper, base, "/app", max_bytes=100_000)
    assert "deleted file mode 100644\n--- a/data/a.txt" in patch and "--- a/data/b.txt" in patch
    assert "new file mode 100644\n--- /dev/null\n+++ b/data/c.txt" in patch


def test_a_copy_up_for_metadata_alone_is_no_change(layers):
    base, upper = layers
    write(upper / "app/main.py", "print('hello')\n", 0o600)
    assert image_patch(upper, base, "/app", max_bytes=100_000) == ""


def test_what_the_agent_leaves_is_read_without_following_or_blocking(layers, tmp_path):
    base, upper = layers
    secret = tmp_path / "host-secret"
    write(secret, "host secret\n")
    os.symlink(str(secret), upper / "app/link")
    os.mkfifo(upper / "app/pipe")
    write(upper / "app/huge.txt", "x" * (MAX_FILE_BYTES + 10))
    patch = image_patch(upper, base, "/app", max_bytes=100_000)
    assert "host secret" not in patch
    assert f"+{secret}\n\\ No newline at end of file" in patch  # a link's content is its target
    assert "# pipe: a FIFO, not shown" in patch
    assert "Binary files /dev/null and b/huge.txt differ" in patch


def test_the_patch_is_capped_and_excludes_the_executors_paths(layers):
    base, upper = layers
    for n in range(50):
        write(upper / f"app/f{n:02d}.txt", "line\n" * 20)
    write(upper / "app/tmp/scratch", "executor's\n")
    patch = image_patch(upper, base, "/app", max_bytes=2000, exclude=("app/tmp",))
    assert len(patch.encode()) < 2200 and patch.endswith("bytes]\n")
    assert "[executor: the patch is cut here" in patch
    assert "tmp/scratch" not in image_patch(upper, base, "/app", max_bytes=10**6, exclude=("app/tmp",))


def test_a_workdir_the_agent_never_touched_gives_an_empty_patch(layers):
    base, upper = layers
    assert image_patch(upper, base, "/srv", max_bytes=1000) == ""


# -- both trees walked from handles (SPEC §21) ---------------------------------------------------


def host_secret(tmp_path):
    """A root-only host file, and its path relative to / (what a link to / in the image reaches)."""
    secret = tmp_path / "box/secret.txt"
    write(secret, "host secret\n", 0o600)
    return secret, str(secret.parent).strip("/")


def test_the_workdir_is_resolved_inside_the_image_never_through_its_links_on_the_host(layers, tmp_path):
    """The image's ``/w -> /`` and WorkingDir ``/w/<folder>``: the agent replaces /w with a folder
    and writes <folder>/secret.txt there; the host's file of that path is never read."""
    base, upper = layers
    secret, folder = host_secret(tmp_path)
    (base / folder).mkdir(parents=True)  # the image has the folder WorkingDir names, through /w
    os.symlink("/", base / "w")
    write(upper / "w" / folder / "secret.txt", "the agent's\n")
    os.setxattr(upper / "w", "trusted.overlay.opaque", b"y")
    workdir = f"/w/{folder}"
    assert image_patch(upper, base, workdir, max_bytes=100_000) == ""  # /w/<folder> is the image's /<folder>
    write(upper / folder / "mine.txt", "at the working directory\n")
    patch = image_patch(upper, base, workdir, max_bytes=100_000)
    assert "host secret" not in patch
    assert patch.startswith("diff --git a/mine.txt b/mine.txt\nnew file mode 100644\n")
    assert "+at the working directory\n" in patch


def test_a_link_the_agent_put_on_the_way_to_the_workdir_is_not_followed(layers, tmp_path):
    base, upper = layers
    secret, _ = host_secret(tmp_path)
    (base / "app/src").mkdir()
    os.rmdir(upper / "app")
    os.symlink(secret.parent.parent, upper / "app")  # /app replaced by a link to a host folder
    (secret.parent.parent / "src").mkdir()
    write(secret.parent.parent / "src/host.txt", "host file\n", 0o600)
    assert image_patch(upper, base, "/app/src", max_bytes=100_000) == ""


def test_a_link_in_the_image_is_content_never_a_way_in(layers, tmp_path):
    """The image's /app/data is a link to a host folder; the agent replaced it with a folder of
    the same names: the patch shows the link removed and the agent's files, never the host's."""
    base, upper = layers
    secret, _ = host_secret(tmp_path)
    shutil.rmtree(base / "app/data")
    os.symlink(secret.parent, base / "app/data")
    write(upper / "app/data/secret.txt", "the agent's\n")
    for opaque in (b"y", b"n"):  # overlayfs marks it opaque; a layer made by hand may not be
        os.setxattr(upper / "app/data", "trusted.overlay.opaque", opaque)
        patch = image_patch(upper, base, "/app", max_bytes=100_000)
        assert "host secret" not in patch
        assert f"deleted file mode 120000\n--- a/data\n+++ /dev/null\n@@ -1 +0,0 @@\n-{secret.parent}\n" in patch
        assert "new file mode 100644\n--- /dev/null\n+++ b/data/secret.txt\n@@ -0,0 +1 @@\n+the agent's\n" in patch


def test_an_opaque_folder_is_compared_name_by_name_and_a_folder_that_became_a_file_is_shown_removed_first(layers):
    base, upper = layers
    write(upper / "app/data/a.txt", "a\n")  # as the image had it
    write(upper / "app/data/c.txt", "c\n")
    os.setxattr(upper / "app/data", "trusted.overlay.opaque", b"y")
    patch = image_patch(upper, base, "/app", max_bytes=100_000)
    assert "data/a.txt" not in patch
    assert "--- a/data/b.txt\n+++ /dev/null" in patch and "+++ b/data/c.txt" in patch
    write(base / "app/tree/inner.txt", "inner\n")
    write(upper / "app/tree", "now a file\n")
    patch = image_patch(upper, base, "/app", max_bytes=100_000)
    removed, added = patch.index("--- a/tree/inner.txt\n+++ /dev/null"), patch.index("--- /dev/null\n+++ b/tree\n")
    assert removed < added


def test_a_tree_deeper_than_path_max_is_walked_with_two_handles(layers):
    """4000 folders below WorkingDir (16 KB of path, over PATH_MAX and Python's recursion limit):
    the new file at the bottom is in the patch, and no handle is left open."""
    base, upper = layers
    depth = 4000
    fd = os.open(upper / "app", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    leaf = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"deep\n")
    os.close(leaf)
    os.close(fd)
    try:
        before = len(os.listdir("/proc/self/fd"))
        patch = image_patch(upper, base, "/app", max_bytes=10**6)
        assert len(os.listdir("/proc/self/fd")) == before
        assert f"+++ b/{'d/' * depth}bottom.txt\n@@ -0,0 +1 @@\n+deep\n" in patch
    finally:
        remove_tree_nofollow(upper)  # (shutil.rmtree, and pytest's cleanup, recurse: too deep for them)
