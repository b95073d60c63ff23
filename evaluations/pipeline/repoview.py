"""The tests' view of the repository (SPEC §25): an overlay whose lower layer is the repository as the
agent left it, so that the agent's patch reads that repository while the tests run and write in theirs.

Without it the patch must be made before the tests start (the tests write in the repository the patch
reads: ``.pytest_cache``, a test patch applied, a file a test edits), one step after the other on the
evaluation's path. With it:

1. ``mount(root, repo)``: ``<root>/tests-repo`` (``root``: the session folder), an overlay of its ``repo`` (a folder, or the
   workspace cache's overlay: overlays stack, two deep) whose upper layer is in the session
   (``.layers/tests-repo.upper``, so the disk limit counts what the tests write) and whose root has the
   repository's owner and mode. Made once every process of the agent is gone: nothing writes the
   lower layer while the view is mounted (the patch's git writes only its own scratch folder).
2. The environment binds it at the repository's path for the tests' commands, and the executor
   writes the tests' support files into it (``BaseEnvironment.view_repo``): the tests see the
   repository and nothing else changes for them.
3. ``unmount(root)`` at cleanup (lazily: nothing inside can hold it); its layers go with the
   session folder, or stay with a kept one.

``mount`` returns None wherever the view cannot be made, and the pipeline keeps the order without
it: not root, a session folder on a filesystem an upper layer cannot be on (itself an overlay, in a
container), or overlays stacked too deep (the workspace cache's on an overlay).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from evaluations.cache import mounts, overlay
from evaluations.safefs import remove_tree_nofollow

log = logging.getLogger(__name__)

VIEW = "tests-repo"  # <session>/tests-repo, its layers <session>/.layers/tests-repo.upper and .work


def mount(root: Path, repo: Path) -> Path | None:
    """The view of ``repo`` at ``<root>/tests-repo`` (``root``: the session folder); None if it cannot be made."""
    if os.geteuid() != 0:
        return None  # mounting is root's
    target = root / VIEW
    try:
        owner = os.lstat(repo)
        if not stat.S_ISDIR(owner.st_mode):
            return None
        # The overlay's root takes the repository's owner and mode from the upper folder.
        upper, work = overlay.make_layers(root, VIEW, (owner.st_uid, owner.st_gid), stat.S_IMODE(owner.st_mode))
        target.mkdir(mode=0o700)
        mounts.mount_overlay(repo, upper, work, target)
    except OSError as exc:
        log.info("no view of the repository for the tests (the patch is made before them): %s", exc)
        try:
            remove_tree_nofollow(target)
            overlay.remove_layers(root, VIEW)
        except OSError:
            pass  # the session's removal takes it
        return None
    return target


def unmount(root: Path) -> None:
    """Take the view down (its layers stay, in the session folder)."""
    mounts.unmount(root / VIEW)
