"""agent_patch for a task without a repository: the evaluation's layer read as a change set (SPEC §16).

The upper folders here are made by hand in overlayfs' format (root makes the whiteouts); the
pipeline's own test runs a real agent in a real image (tests/images/test_image_e2e.py).
"""

from __future__ import annotations

import os

import pytest

from evaluations.images.diff import MAX_FILE_BYTES, image_patch

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
    patch = image_patch(upper, base, "/app", max_bytes=2000, exclude=("tmp",))
    assert len(patch.encode()) < 2200 and patch.endswith("bytes]\n")
    assert "[executor: the patch is cut here" in patch
    assert "tmp/scratch" not in image_patch(upper, base, "/app", max_bytes=10**6, exclude=("tmp",))


def test_a_workdir_the_agent_never_touched_gives_an_empty_patch(layers):
    base, upper = layers
    assert image_patch(upper, base, "/srv", max_bytes=1000) == ""
