"""A compose volume binding a folder of the task at the working directory (SPEC §22), before the agent.

Docker Compose mounts the folder over the image's working directory: what the image had there is
hidden, and the folder's files are what the agent finds. Here, at ``cloning_repo`` (no command of
the evaluation has run; the image's root is mounted), the working directory is emptied and the
folder's files written into it, owned by the evaluation's uid as the bind's files are the host
user's. The folder's tests and reference solution were left out when the task was read
(tasks/compose.py ``bound_folder``): the agent never sees them. The tests come back as the task's
support files, written there before the verifier runs (steps.running_tests), where the bind shows them.

Every write goes from the working directory's handle without following a link (safefs): the image's
content under it is the image author's, and nothing of it is trusted.
"""

from __future__ import annotations

import os

from evaluations.models import ErrorKind
from evaluations.pipeline.context import Context, StepFailed
from evaluations.safefs import SafeFSError, open_parent, remove_entry_nofollow, write_file_nofollow


def fill_workdir(ctx: Context) -> None:
    """The task's bound folder as the working directory's content; nothing for a task without one."""
    files = ctx.task.workdir_files  # a Harbor or Terminal-Bench task's: an image's, without a repository
    if files is None:
        return
    owner = ctx.workdir_owner()
    try:
        with ctx.workdir_handle() as workdir:  # resolved in the image's root (environments/kinds.py)
            for name in os.listdir(workdir):  # what the image had there: hidden by the bind
                remove_entry_nofollow(workdir, name)
            made = set()
            for file in files:
                write_file_nofollow(workdir, file.relpath, file.data, file.mode)
                parts = file.relpath.split("/")
                made.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
            if owner is not None:
                os.fchown(workdir, owner, owner)  # the bind's own folder too
                for relpath in sorted(made):
                    folder, name = open_parent(workdir, relpath, create=False)
                    try:
                        os.chown(name, owner, owner, dir_fd=folder, follow_symlinks=False)
                    finally:
                        os.close(folder)
    except (OSError, SafeFSError) as exc:
        raise StepFailed(
            f"could not copy the task's bound folder into {ctx.workdir}: {exc}", kind=ErrorKind.INFRASTRUCTURE
        ) from None
