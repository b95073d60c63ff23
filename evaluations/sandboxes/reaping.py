"""What a sandbox leaves when its process cannot clean up after it, found and removed (SPEC §24).

A sandbox's process gives everything back itself (host.py, ``teardown``). When it dies instead
(killed, the host's memory short), what it held outlives it only briefly: bubblewrap runs with
``--die-with-parent``, so the sandbox's pid namespace ends with it; its uid goes back to the pool
unmarked, so its next holder scrubs it (runtime/uids.py). What stays is on disk and in the
kernel: its session folder (with the image's root mounted in it), its cgroup, an uploaded build
context. The worker calls ``remove_leftovers`` when it sees the process gone; the reaper
(``manage.py reap_sessions``, and every worker's periodic reap) ends the sandboxes whose worker
stopped beating and removes what no live sandbox owns.
"""

from __future__ import annotations

import errno
import logging
import os
import uuid

from evaluations import lifecycle
from evaluations.cache import mounts
from evaluations.models import LIVE_SANDBOX_STATUSES, WORKER_LOST, ErrorKind, Sandbox, SandboxStatus
from evaluations.runtime import cgroups, killer
from evaluations.safefs import remove_patiently, remove_tree_nofollow
from evaluations.sandboxes.host import context_path, session_name, tag

logger = logging.getLogger("term_executor.sandboxes")
_PREFIX = session_name("")
_RETIRED = ".retired-" + _PREFIX


def remove_leftovers(config, sandbox_id: str) -> int:
    """Kill what carries the sandbox's tag, unmount and remove its folder, its cgroup and its upload;
    returns how many processes were killed."""
    sandbox_id = str(sandbox_id)
    killed = killer.kill_all(tag(sandbox_id))
    for name in (session_name(sandbox_id), ".retired-" + session_name(sandbox_id)):
        folder = config.workspace_base / name
        if folder.is_symlink() or folder.exists():
            if os.geteuid() == 0:
                mounts.unmount_below(folder)
            remove_tree_nofollow(folder)
    if os.geteuid() == 0:
        support = cgroups.detect(config.cgroup_parent)
        if support.enforced:
            if not cgroups.EvalCgroup(tag(sandbox_id), support=support).remove():
                raise OSError(errno.EBUSY, f"sandbox {sandbox_id}'s cgroup still holds processes")
    context_path(config, sandbox_id).unlink(missing_ok=True)
    return killed


def end_lost(config, live_workers, *, dry_run: bool = False) -> list[str]:
    """Live sandboxes whose worker stopped beating are failed (their processes died with it)."""
    lost = []
    for sandbox_id in (
        Sandbox.objects.filter(status__in=LIVE_SANDBOX_STATUSES)
        .exclude(worker_id="")
        .exclude(worker_id__in=list(live_workers))
        .values_list("id", flat=True)
    ):
        if dry_run or lifecycle.end_sandbox(
            sandbox_id, SandboxStatus.FAILED, error=WORKER_LOST, kind=ErrorKind.INFRASTRUCTURE
        ):
            lost.append(str(sandbox_id))
    return lost


def live_tags() -> list[str]:
    """The cgroup names of live sandboxes (which the evaluations' stale-cgroup sweep must keep)."""
    return [tag(str(i)) for i in Sandbox.objects.filter(status__in=LIVE_SANDBOX_STATUSES).values_list("id", flat=True)]


def remove_orphans(config, *, dry_run: bool = False) -> int:
    """Sandbox folders and uploads of sandboxes that are not live; returns how many were removed (one
    that could not be yet is left to the next pass)."""
    found = set()
    try:
        entries = list(os.scandir(config.workspace_base))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        for prefix in (_RETIRED, _PREFIX):
            if entry.name.startswith(prefix):
                found.add(entry.name[len(prefix) :])
                break
    uploads = config.data_dir / "sandbox-contexts"
    if uploads.is_dir():
        found.update(name.removesuffix(".tar") for name in os.listdir(uploads) if name.endswith(".tar"))
    ids = []
    for name in found:
        try:
            ids.append(str(uuid.UUID(name)))
        except ValueError:
            continue
    live = {
        str(i)
        for i in Sandbox.objects.filter(id__in=ids, status__in=LIVE_SANDBOX_STATUSES).values_list("id", flat=True)
    }
    orphans = [sandbox_id for sandbox_id in ids if sandbox_id not in live]
    if dry_run:
        return len(orphans)
    removed = 0
    for sandbox_id in orphans:
        # Its processes die with its owner, but a dying one can hold its folder or cgroup for a moment
        # after it stops showing in /proc as tagged.
        error = remove_patiently(lambda sandbox_id=sandbox_id: remove_leftovers(config, sandbox_id))
        if error is None:
            removed += 1
        else:
            logger.warning("could not remove sandbox %s's leftovers yet: %s", sandbox_id, error)
    return removed
