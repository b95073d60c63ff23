"""What a process that runs evaluations does once, before the first: `run_worker` and `evaluate`
(and `serve`, before it starts anything: ``check_folders`` and ``choose_runtime``).

1. The folders the sandbox uids must use are checked (``check_folders``): a
   path the operator can fix stops start-up with one line naming the
   variable, instead of a quiet fall back to no sandbox, or evaluations
   failing one by one.
2. WORKSPACE_BASE exists, mode 0711: commands may pass through to their own
   session folder and never list the others.
3. The runtime is chosen by probing bubblewrap as the sandbox uid would run
   it (as `nobody`, outside the uid pool: a pool uid may be scrubbed by a
   concurrent evaluation's lease at any moment), with what the kernel can
   enforce per evaluation (cgroups). The resolved object is what every
   evaluation process gets; nothing downstream probes again. SANDBOX=auto
   (the default) with bubblewrap missing or not working stops start-up with
   a sentence naming the package: agent code runs unsandboxed only when the
   operator set SANDBOX=none (SPEC §20).
4. The image id ranges (IMAGE_UID_BASE, SANDBOX_UID_COUNT x 65536 ids) meet no subordinate range
   of /etc/subuid or /etc/subgid and no account of /etc/passwd or /etc/group (SPEC §21,
   ``check_image_ids``): an id shared with another user would share its files and processes.
5. As root, the capabilities root's work takes (``check_privileges``): in a container, root holds
   only what the engine grants; without, say, CAP_SYS_ADMIN, every image task would fail at its
   mount, so start-up stops with one line naming each missing capability and the flag that grants it.
6. The signing key (SPEC §18) is read, or made at first start: a SIGNING_KEY_FILE that is
   missing, unreadable or not Ed25519 stops start-up with one line naming it.
7. The start-up warnings are logged.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

from evaluations import signing
from evaluations.checks import log_startup_warnings
from evaluations.runtime import (
    Runtime,
    SandboxUnavailable,
    become_subreaper,
    capabilities,
    cgroups,
    hostids,
    sandbox_uid,
    select_runtime,
)
from evaluations.runtime.cgroupfs import favors_dynmods
from evaluations.runtime.idmap import ID_COUNT
from evaluations.runtime.sandbox import can_traverse
from executor_project.config import Config

logger = logging.getLogger(__name__)


class StartupError(Exception):
    """The process cannot run evaluations; the message says what to fix."""

    def exit(self):
        """Stop the process as a bad setting does: one line naming the variable, exit status 2."""
        sys.stderr.write(f"term-executor: configuration error: {self}\n")
        sys.exit(2)


def prepare_to_run(config: Config) -> Runtime:
    check_folders(config)
    check_image_ids(config)
    check_privileges()
    check_signing_key(config)
    runtime = choose_runtime(config)
    if os.geteuid() == 0:
        runtime.cgroups = cgroups.detect(config.cgroup_parent)
        if runtime.cgroups.enforced and not favors_dynmods():
            logger.info(
                "cgroups: each sandbox's move into its evaluation's cgroup waits for an RCU grace period "
                "(mostly while the command before it runs); a cgroup hierarchy mounted with favordynmods "
                "removes that wait (docs/operating.md)"
            )
    log_startup_warnings()
    become_subreaper()  # orphans of a dead evaluation process come to us, not to init
    return runtime


def check_image_ids(config: Config, files: hostids.HostIdFiles = hostids.SYSTEM) -> None:
    """StartupError naming the image id ranges and what on the host (``files``) already has an id in them."""
    start = config.image_uid_base
    stop = start + config.sandbox_uid_count * ID_COUNT
    try:
        found = hostids.overlaps(start, stop, files)
    except OSError as exc:
        raise StartupError(
            f"IMAGE_UID_BASE: could not read the host's ids to check the image id ranges: {exc}"
        ) from None
    if found:
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        raise StartupError(
            f"IMAGE_UID_BASE: the image id ranges ({start}-{stop - 1}, SANDBOX_UID_COUNT x 65536 ids) overlap "
            f"{'; '.join(found[:5])}{more}: set IMAGE_UID_BASE to ids nothing else on this host uses"
        )


def check_privileges(status: str | None = None, euid: int | None = None) -> None:
    """As root (``euid``, default this process's), StartupError naming the capabilities root's work needs
    that this process (``status``: a ``/proc/<pid>/status``, default its own) lacks."""
    if (os.geteuid() if euid is None else euid) != 0:
        return  # no uid switches, no image tasks: the start-up warnings say so
    missing = capabilities.missing_as_root(status)
    if missing:
        needs = "; ".join(f"{name} ({capabilities.NEEDED_AS_ROOT[name]})" for name in missing)
        flags = " ".join(f"--cap-add {name.removeprefix('CAP_')}" for name in missing)
        raise StartupError(
            f"the service runs as root without {needs}: in a container, grant them ({flags}; docs/operating.md, "
            "Docker), or run it as another user, without image tasks"
        )


def check_signing_key(config: Config) -> None:
    """The key results are signed with, read (or made) now rather than at the first evaluation's end."""
    try:
        signing.keyring(config).current()
    except signing.SigningKeyError as exc:
        raise StartupError(str(exc)) from None


def choose_runtime(config: Config) -> Runtime:
    """The runtime SANDBOX asks for, probed in WORKSPACE_BASE (made here, 0711); StartupError when
    bubblewrap is missing or does not work and SANDBOX is not none."""
    config.workspace_base.mkdir(parents=True, exist_ok=True)
    os.chmod(config.workspace_base, 0o711)
    try:
        return select_runtime(config.sandbox, uid=sandbox_uid(), workdir=config.workspace_base)
    except SandboxUnavailable as exc:
        raise StartupError(str(exc)) from exc
    except Exception as exc:
        raise StartupError(f"SANDBOX={config.sandbox}: {exc}") from exc


def check_folders(config: Config) -> None:
    """Refuse folders the sandbox uids cannot use as they must (only as root: else no uid switches)."""
    if os.geteuid() != 0:
        return
    uid = config.sandbox_uid  # the pool's uids are alike: none owns a folder outside the sessions
    reachable = {
        # Each command passes through to its session; the folder itself is made 0711 here.
        "WORKSPACE_BASE": config.workspace_base.parent,
        "STATIC_ASSETS_ROOT": config.static_assets_root,  # bound read-only at /static
        "ENVIRONMENTS_ROOT": config.environments_root,  # bound as / of the task's commands
    }
    for variable, folder in reachable.items():
        if folder is None:
            continue
        blocker = _first_closed(folder, uid)
        if blocker is not None:
            named = getattr(config, variable.lower())
            raise StartupError(
                f"{variable}: {named} cannot be reached by the sandbox uids ({blocker} is mode "
                f"{stat.S_IMODE(os.stat(blocker).st_mode):04o}): use a folder every user may traverse, "
                f"or `chmod o+x {blocker}`"
            )
    _check_closed("DATA_DIR", config.data_dir)


def _first_closed(folder: Path, uid: int) -> Path | None:
    """The first existing folder on the way to ``folder`` that ``uid`` cannot traverse, if any."""
    path = Path("/")
    for part in folder.resolve().parts[1:]:
        path = path / part
        if not path.exists():
            return None  # made by us later, 0711
        if not can_traverse(str(path), uid):
            return path
    return None


def _check_closed(variable: str, folder: Path) -> None:
    """DATA_DIR holds the database, the secret key and the sockets: no sandbox uid may look in."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return
    if st.st_mode & 0o007:
        raise StartupError(
            f"{variable}: {folder} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}, owner uid "
            f"{st.st_uid}): the sandbox uids could read the database and the secret key; `chmod 0700 {folder}`"
        )
