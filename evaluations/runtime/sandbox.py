"""Runtimes: how a command's argv becomes the argv that is really started.

``NoSandbox`` starts the command as it is; the spawner still puts it in its
own session, under rlimits and ``no_new_privs``, at lowered priority, as the
evaluation's own unprivileged uid (``uids.py``). What that cannot enforce:
network isolation (commands share the host's network, loopback included),
and the host's world-readable files and process list stay visible.

``Bubblewrap`` wraps it in ``bwrap`` with new pid, ipc, uts, user and (unless
the step allows network) net namespaces, a root made only of read-only system
folders, the session's folders read-write, and ``<session>/tmp`` as ``/tmp``.
The sandbox's own root and ``/dev`` are tmpfs, that is RAM no limit would
see, so both are remounted read-only; ``/dev/shm`` is a 64 MiB tmpfs.
A folder bound under ``/tmp`` (sessions live in ``/tmp/sessions`` by default)
gets its empty mount-point folders inside that tmp, made by the executor
before bwrap starts (``prepare_mount_points``), never by bwrap through what
the agent left there; the executor's own commands get a fresh, empty tmp
(``fresh_tmp``), not ``<session>/tmp``.

Who runs bwrap, and why (the checks behind it: bench/RESULTS.md, "Issue 13"):

1. bwrap runs *as the unprivileged uid* (``Popen(user=65534)``), so it makes
   an unprivileged user namespace where that uid maps to itself: files are
   checked against host uid 65534, a root-owned 0600 file is unreadable.
2. Rejected: bwrap as root with ``--unshare-user --uid 65534``. The sandbox
   uid then maps to host root, and a root-owned 0600 file in a writable bind
   was readable, even with ``--cap-drop ALL`` (the owner check passes).
3. Rejected: bwrap as root, then ``setpriv`` to 65534 inside. It can bind
   the pyenv Python (once ``/root`` is recreated 0755 inside: bwrap copies
   the host's 0700), but bwrap and setpriv then run as real root with all
   capabilities in a mount namespace holding agent-writable folders, and
   one wrong argv would run the agent as root. Not worth what it buys (4).
4. Consequence: a runtime is offered to commands only if the sandbox uid can
   reach it. The service's pyenv Python (``/root/.pyenv/versions/3.11.7``) is
   not: ``/root`` is 0700, bwrap as 65534 cannot bind it (``--ro-bind-fd``
   does not help: bwrap resolves the fd back to its path), and NoSandbox
   commands could not execute it either. Such a runtime is skipped with a
   warning and commands find the distribution's ``/usr/bin/python3`` (3.11
   here) first on ``command_path()``. A Python under ``/opt`` or
   ``/usr/local``, as in the Docker image, is found and bound (or reachable).

The command's environment reaches it through ``--clearenv``/``--setenv``;
bwrap itself starts with a two-variable environment, so a caller-supplied
``LD_PRELOAD`` cannot touch it before the namespaces exist. bwrap adds one
variable of its own: ``PWD``, the folder it started the command in.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluations.images import inroot
from evaluations.runtime import idmap, initbin
from evaluations.runtime.cgroupfs import CgroupSupport
from evaluations.runtime.killer import TAG_VAR
from evaluations.runtime.policy import HOST_SYSTEM_ROOTS, NICE_BY_THREAD, SandboxPolicy, Tools, render
from evaluations.safefs import remove_tree_nofollow

log = logging.getLogger(__name__)

# One-off commands outside an evaluation (the start-up probe without a lease, tests):
# nobody. Evaluations lease a uid of their own from SANDBOX_UID.. (uids.py).
DEFAULT_SANDBOX_UID = 65534
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TOOLS_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


NO_SANDBOX_LIMITS = (
    "network isolation (TEST_NETWORK=off, AGENT_NETWORK=off) cannot be enforced, and commands see "
    "the host's world-readable files and process list"
)


class SandboxUnavailable(RuntimeError):
    """SANDBOX=auto or bwrap, and bubblewrap is missing or does not work on this host."""


def sandbox_uid(configured: int = DEFAULT_SANDBOX_UID) -> int | None:
    """The uid commands run as: ``configured`` when we are root, else None (no switch)."""
    return configured if os.geteuid() == 0 else None


class InfoPipe:
    """The pipe bwrap reports its sandbox's pid 1 on (``--info-fd``). Each end is closed once:
    a second ``close`` of a reused fd number would close another thread's file."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.close_write_end()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def sandbox_init(self) -> int | None:
        """The host pid of the sandbox's pid 1, once bwrap has told it (None if it never did).

        Blocks until bwrap closes its end (the caller has closed its own): after it wrote
        the report, or when it exits. When that process is gone, so is every process of the
        sandbox: the kernel kills the rest of a pid namespace when its pid 1 exits, and
        nothing can leave one.
        """
        report = b""
        while chunk := os.read(self.read_fd, 4096):
            report += chunk
        try:
            pid = json.loads(report)["child-pid"]
        except (ValueError, KeyError, TypeError):
            return None
        return pid if isinstance(pid, int) and pid > 1 else None


@dataclass(frozen=True)
class Launch:
    """What the spawner hands to Popen (before its rlimit/nice prefix).

    ``info``: where bwrap reports its sandbox's pid 1; its write end goes to the
    command (``pass_fds``), the spawner closes both. None for a runtime without
    a pid namespace.
    """

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    info: InfoPipe | None = None
    userns_fd: int | None = None  # an image's namespace (runtime/idmap.py): kept open by idmap, not closed here

    @property
    def pass_fds(self) -> tuple[int, ...]:
        fds = () if self.info is None else (self.info.write_fd,)
        return fds if self.userns_fd is None else (*fds, self.userns_fd)

    def close(self) -> None:
        if self.info is not None:
            self.info.close()


class Runtime:
    """How commands are contained on this host, resolved once at start (``select_runtime``).

    It holds no uid: each evaluation leases its own (uids.py) and the spawner puts it in the
    command's ``SandboxPolicy``.
    """

    name = "runtime"
    isolated = False  # True when commands see /static/<save_path> instead of host paths
    # True when each command runs in a pid namespace whose pid 1 its Launch.info reports.
    contains_processes = False

    def __init__(self, language_runtimes: Sequence[str] = (), cgroups: CgroupSupport | None = None):
        self.warning: str | None = None
        self.language_runtimes = tuple(language_runtimes)
        self.bwrap: str | None = None
        # What the kernel enforces for each evaluation (cgroups.detect()); None: the monitor alone.
        self.cgroups = cgroups

    def command_path(self) -> str:
        """The PATH to give commands: reachable language runtimes first, then the system's."""
        return ":".join([*(f"{prefix}/bin" for prefix in self.language_runtimes), SYSTEM_PATH])

    def launch(self, argv: Sequence[str], policy: SandboxPolicy, *, cwd: Path, env: dict[str, str]) -> Launch:
        """``argv`` under ``policy`` (complete: the spawner has filled in the evaluation's part)."""
        tools = Tools(
            setpriv=system_tool("setpriv"),
            prlimit=system_tool("prlimit"),
            nice=None if NICE_BY_THREAD else system_tool("nice"),
            bwrap=self.bwrap,
            nsenter=system_tool("nsenter") if policy.netns is not None else None,
            launcher=_launcher(),
        )
        info = InfoPipe() if self.contains_processes else None
        userns = idmap.image_userns_fd(policy.image.idmap) if policy.image is not None else None
        # bwrap's own environment: the tag alone, for the sweep (killer.py).
        outer_env = {"PATH": SYSTEM_PATH, TAG_VAR: env[TAG_VAR]} if TAG_VAR in env else {"PATH": SYSTEM_PATH}
        rendered = render(
            policy,
            argv,
            cwd=cwd,
            env=env,
            tools=tools,
            outer_env=outer_env,
            info_fd=None if info is None else info.write_fd,
            userns_fd=userns,
        )
        return Launch(rendered.argv, rendered.env, rendered.cwd, info, userns)


class NoSandbox(Runtime):
    """The command as given, under the policy's uid and rlimits; namespaces and binds cannot apply."""

    name = "none"


class Bubblewrap(Runtime):
    name = "bwrap"
    isolated = True
    contains_processes = True

    def __init__(
        self, language_runtimes: Sequence[str] = (), bwrap: str = "bwrap", cgroups: CgroupSupport | None = None
    ):
        super().__init__(language_runtimes, cgroups)
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxUnavailable(f"{bwrap}: not found")
        self.bwrap = found


def private_tmp(session_dir: Path, uid: int | None, *, sticky: bool = False) -> Path:
    """``<session>/tmp``, a real folder (not a link) owned by the command uid, mode 0700; ``sticky``:
    1777, as a container's /tmp, where an image's other users (apt's ``_apt``) write too (the
    session folder around it keeps every other host uid out)."""
    tmp = session_dir / "tmp"
    try:
        os.mkdir(tmp, 0o700)
    except FileExistsError:
        pass
    # O_NOFOLLOW: if an agent swapped the folder for a link, fail instead of chowning its target.
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if uid is not None and os.fstat(fd).st_uid != uid:
            os.fchown(fd, uid, uid)
            os.fchmod(fd, 0o700)
        if sticky and stat.S_IMODE(os.fstat(fd).st_mode) != 0o1777:
            os.fchmod(fd, 0o1777)
    finally:
        os.close(fd)
    return tmp


def fresh_tmp(session_dir: Path, uid: int | None) -> Path:
    """An empty folder for one executor command's /tmp, in the session folder (root's: no command
    can plant anything where it is made), owned by the command uid. The caller removes it."""
    tmp = Path(tempfile.mkdtemp(prefix=".executor-tmp-", dir=session_dir))
    if uid is not None:
        os.chown(tmp, uid, uid, follow_symlinks=False)
    return tmp


# Where the private tmp is seen in the sandbox: /tmp, and /var/tmp (a link to it, or a bind).
_TMP_TARGETS = ("/tmp", "/var/tmp")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def prepare_mount_points(policy: SandboxPolicy) -> None:
    """Make, inside the policy's private tmp, the folders the binds below /tmp will be mounted on.

    Sessions live under /tmp by default, so ``<session>/repo`` is bound at a path inside the
    private tmp, which is ``<session>/tmp``: a folder the agent writes. bwrap (as the sandbox
    uid) creates missing mount points as it goes and follows links in what is already mounted:
    an agent that put a link where a parent of the session path goes had bwrap create folders
    outside the session (issue 23), and the command failed. Here every folder on the way to each
    mount point is made a real folder of ours (root's, 0755, when we are root), anything else
    in its place removed without following it, before bwrap starts. No process of the
    evaluation runs meanwhile (every sandbox ends with all its processes), and none can change
    a root-owned folder afterwards.
    """
    tmp = policy.private_tmp
    if tmp is None:
        return
    points = []
    for source, target in [*((path, path) for path in policy.writable), *((m.source, m.target) for m in policy.mounts)]:
        target = os.path.abspath(target)
        for top in _TMP_TARGETS:
            if target.startswith(top + "/"):
                points.append((target[len(top) + 1 :].split("/"), os.path.isdir(source)))
                break
    for parts, _ in points:
        for other, _ in points:
            if len(other) < len(parts) and parts[: len(other)] == other:
                raise ValueError(f"a bind at {'/'.join(parts)} inside another bind below /tmp")
    for parts, is_dir in points:
        _make_mount_point(tmp, parts, is_dir)


def _make_mount_point(tmp: Path, parts: list[str], is_dir: bool) -> None:
    fd = os.open(tmp, _DIR_FLAGS)
    path = str(tmp)
    try:
        for position, name in enumerate(parts):
            path = os.path.join(path, name)
            folder = is_dir or position < len(parts) - 1
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and not (folder and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()):
                remove_tree_nofollow(path)  # a link, a file, or a folder a command made: not ours
                st = None
            if not folder:
                if st is None:
                    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd))
                continue
            if st is None:
                os.mkdir(name, 0o755, dir_fd=fd)
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            os.fchmod(fd, 0o755)  # whatever the umask: the sandbox uid passes, and cannot write
    finally:
        os.close(fd)


def _is_system(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in HOST_SYSTEM_ROOTS)


def language_runtimes() -> list[str]:
    """Prefixes of the Python and Node this host has outside the system folders."""
    candidates = [inroot.host_path(sys.base_prefix)]
    for name in ("python3", "node"):
        exe = shutil.which(name)
        if exe is None:
            continue
        bindir = os.path.dirname(inroot.host_path(exe))
        # <prefix>/bin/<name>; a pyenv shim (<root>/shims/python3) is a script, not a runtime.
        if os.path.basename(bindir) == "bin":
            candidates.append(os.path.dirname(bindir))
    found: list[str] = []
    for prefix in candidates:
        if prefix not in found and not _is_system(prefix) and os.path.isdir(f"{prefix}/bin"):
            found.append(prefix)
    return found


@functools.cache
def usable_language_runtimes(uid: int | None) -> tuple[str, ...]:
    """The language runtimes commands running as ``uid`` can execute; warn (once) about the rest."""
    usable = []
    for prefix in language_runtimes():
        if can_traverse(f"{prefix}/bin", uid):
            usable.append(prefix)
        else:
            log.warning(
                "language runtime %s is not reachable by uid %s (a parent folder is not "
                "traversable); commands use the system's interpreters instead",
                prefix,
                uid,
            )
    return tuple(usable)


def can_traverse(path: str, uid: int | None) -> bool:
    """Whether ``uid`` (group = uid, no other groups) may search every folder down to ``path``."""
    if uid is None:
        return os.access(path, os.X_OK)
    current = "/"
    for part in ("", *Path(inroot.host_path(path)).parts[1:]):
        current = os.path.join(current, part)
        try:
            st = os.stat(current)
        except OSError:
            return False
        if st.st_uid == uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid == uid:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


@functools.cache
def system_tool(name: str) -> str:
    """A program of the system folders (setpriv, prlimit, nice), never one a PATH could substitute."""
    path = shutil.which(name, path=_TOOLS_PATH)
    if path is None:
        raise RuntimeError(f"{name} not found in {_TOOLS_PATH}: install util-linux and coreutils")
    return path


def _launcher() -> str | None:
    """The static init, which runs every step before bwrap in one exec (policy.py); None where it
    cannot be built, and the system's tools take them one each."""
    binary = initbin.host_binary()
    return None if binary is None else str(binary)


def probe_bwrap(uid: int | None = None, bwrap: str = "bwrap", workdir: Path | None = None) -> tuple[bool, str]:
    """Run ``bwrap ... true`` once with the real flags; (works, human detail).

    ``uid`` None means this process's default: 65534 as root, no switch otherwise.
    ``workdir`` is where the probe's session folder goes: pass WORKSPACE_BASE so
    the probe also proves the sandbox uid can reach real session folders.
    """
    if uid is None:
        uid = sandbox_uid()
    exe = shutil.which(bwrap)
    if exe is None:
        return False, f"{bwrap}: not found"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bwrap-probe-", dir=workdir) as tmp:
        session = Path(tmp)
        if uid is not None:
            os.chown(session, uid, uid)
        runtime = Bubblewrap(usable_language_runtimes(uid), bwrap=exe)
        # The uid switched as every command's is (the launch's own steps), not by Popen: the launcher
        # (the init, in root's cache) runs as root, as it does for every command.
        policy = SandboxPolicy(namespaces=True, writable=(session,), runtimes=runtime.language_runtimes, uid=uid)
        env = {"PATH": SYSTEM_PATH, TAG_VAR: "bwrap-probe"}
        launch = runtime.launch(["true"], policy, cwd=session, env=env)
        try:
            done = subprocess.run(
                launch.argv,
                env=launch.env,
                cwd=launch.cwd,
                capture_output=True,
                text=True,
                timeout=30,
                start_new_session=True,
                pass_fds=launch.pass_fds,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{exe}: {exc}"
        finally:
            launch.close()
    if done.returncode != 0:
        return False, f"{exe} exited {done.returncode}: {done.stderr.strip()[-500:]}"
    return True, f"{version or 'bubblewrap'} works (uid {uid if uid is not None else os.getuid()})"


def select_runtime(mode: str, *, uid: int | None = None, bwrap: str = "bwrap", workdir: Path | None = None) -> Runtime:
    """none: no sandbox, as the operator said; auto and bwrap: bubblewrap when the probe passes,
    else ``SandboxUnavailable`` naming what to install or fix. Agent code never runs unsandboxed
    unless SANDBOX=none says so (SPEC §20): a fresh machine without bubblewrap refuses to start.

    ``uid`` and ``workdir`` as for ``probe_bwrap``; ``uid`` also decides which language
    runtimes are offered (those it can reach).
    """
    if uid is None:
        uid = sandbox_uid()
    runtimes = usable_language_runtimes(uid)
    if mode == "none":
        runtime = NoSandbox(runtimes)
        runtime.warning = f"SANDBOX=none: {NO_SANDBOX_LIMITS}"
        log.warning("sandbox: %s", runtime.warning)
        return runtime
    if mode not in ("auto", "bwrap"):
        raise ValueError(f"sandbox mode must be auto, bwrap or none, got {mode!r}")
    works, detail = probe_bwrap(uid, bwrap, workdir)
    if works:
        log.info("sandbox: %s", detail)
        return Bubblewrap(runtimes, bwrap)
    if shutil.which(bwrap) is None:
        raise SandboxUnavailable(
            f"SANDBOX={mode} but bubblewrap is not installed ({detail}), and agent code does not run "
            f"unsandboxed unless told to: install the bubblewrap package (apt-get install bubblewrap), "
            f"or set SANDBOX=none to run it without a sandbox"
        )
    raise SandboxUnavailable(
        f"SANDBOX={mode} but bubblewrap does not work here: {detail}. Fix bubblewrap (user namespaces "
        f"must be allowed), or set SANDBOX=none to run agent code without a sandbox"
    )
