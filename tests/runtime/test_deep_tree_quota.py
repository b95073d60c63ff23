"""A folder tree nested deeper than PATH_MAX must not hide its bytes from the disk quota, nor its files
from the file count."""

import os

from evaluations.runtime.monitor import folder_usage
from evaluations.safefs import remove_tree_nofollow


def test_bytes_below_path_max_depth_are_counted(tmp_path):
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1200):  # 1200 * "dddd/" > PATH_MAX (4096)
            os.mkdir("dddd", dir_fd=fd)
            inner = os.open("dddd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        leaf = os.open("hidden.bin", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(leaf, os.urandom(8 * 1024 * 1024))
        os.close(leaf)
    finally:
        os.close(fd)
    try:
        usage = folder_usage(root)
        assert usage.bytes >= 8 * 1024 * 1024
        assert usage.files == 1 + 1200 + 1  # the root, every level, the leaf
    finally:
        remove_tree_nofollow(root)
