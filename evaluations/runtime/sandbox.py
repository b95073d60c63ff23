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
gets its empty mount-point folders created inside ``<session>/tmp``.

Who runs bwrap, and why (measured on the dev host, root, kernel 6.18, bwrap 0.8):

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evaluations.runtime.killer import TAG_VAR

if TYPE_CHECKING:
    from evaluations.runtime.spawner import Mount

log = logging.getLogger(__name__)

# One-off commands outside an evaluation (the start-up probe without a lease, tests):
# nobody. Evaluations lease a uid of their own from SANDBOX_UID.. (uids.py).
DEFAULT_SANDBOX_UID = 65534
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# /dev/shm is RAM the memory monitor cannot see unless mapped: capped like Docker's default.
SHM_BYTES = 64 * 1024 * 1024
_SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc files every command may read; the network ones only when it has network.
_ETC_ALWAYS = (
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
)
_ETC_NETWORK = ("/etc/resolv.conf", "/etc/hosts", "/etc/host.conf", "/etc/gai.conf")


NO_SANDBOX_LIMITS = (
    "network isolation (TEST_NETWORK=off, AGENT_NETWORK=off) cannot be enforced, and commands see "
    "the host's world-readable files and process list"
)


class SandboxUnavailable(RuntimeError):
    """SANDBOX=bwrap was asked for and bubblewrap does not work on this host."""


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

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return () if self.info is None else (self.info.write_fd,)

    def close(self) -> None:
        if self.info is not None:
            self.info.close()


class Runtime:
    name = "runtime"
    isolated = False  # True when commands see /static/<save_path> instead of host paths
    # True when each command runs in a pid namespace whose pid 1 its Launch.info reports.
    contains_processes = False

    def __init__(self, uid: int | None):
        if os.geteuid() == 0 and not uid:
            raise ValueError("running as root: commands need an unprivileged uid (SANDBOX_UID)")
        self.uid = uid
        self.warning: str | None = None
        self.language_runtimes = usable_language_runtimes(uid)

    def command_path(self) -> str:
        """The PATH to give commands: reachable language runtimes first, then the system's."""
        return ":".join([*(f"{prefix}/bin" for prefix in self.language_runtimes), SYSTEM_PATH])

    def launch(
        self,
        argv: Sequence[str],
        *,
        session_dir: Path,
        cwd: Path,
        env: dict[str, str],
        network: bool,
        writable: Iterable[Path],
        mounts: Iterable[Mount],
    ) -> Launch:
        raise NotImplementedError


class NoSandbox(Runtime):
    """The command as given; network, writable and mounts cannot be enforced here."""

    name = "none"

    def launch(self, argv, *, session_dir, cwd, env, network, writable, mounts) -> Launch:
        return Launch(list(argv), dict(env), cwd)


class Bubblewrap(Runtime):
    name = "bwrap"
    isolated = True
    contains_processes = True

    def __init__(self, uid: int | None, bwrap: str = "bwrap"):
        super().__init__(uid)
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxUnavailable(f"{bwrap}: not found")
        self.bwrap = found

    def launch(self, argv, *, session_dir, cwd, env, network, writable, mounts) -> Launch:
        flags = bwrap_argv(
            cwd=cwd,
            env=env,
            network=network,
            private_tmp=private_tmp(session_dir, self.uid),
            writable=writable,
            mounts=mounts,
            runtimes=self.language_runtimes,
        )
        # bwrap's own environment: nothing the caller chose, plus the tag for the sweep.
        outer_env = {"PATH": SYSTEM_PATH, TAG_VAR: env[TAG_VAR]}
        info = InfoPipe()
        # Its report names the sandbox's pid 1: the spawner waits for it to end (InfoPipe.sandbox_init).
        report = ["--info-fd", str(info.write_fd)]
        return Launch([self.bwrap, *report, *flags, "--", *argv], outer_env, Path("/"), info)


def bwrap_argv(
    *,
    cwd: Path,
    env: dict[str, str],
    network: bool,
    private_tmp: Path,
    writable: Iterable[Path],
    mounts: Iterable[Mount],
    runtimes: Iterable[str],
) -> list[str]:
    """The bwrap options, one flag per line, each with its reason."""
    a: list[str] = []
    a += ["--unshare-user"]  # own user namespace: the uid inside is the host uid bwrap runs as
    a += ["--disable-userns"]  # no nested user namespaces: less kernel surface to attack
    a += ["--unshare-pid"]  # host processes invisible; killing its pid 1 ends every process inside
    a += ["--unshare-ipc"]  # no SysV IPC or POSIX queues shared with the host
    a += ["--unshare-uts"]  # own hostname
    a += ["--unshare-cgroup-try"]  # host cgroup paths not shown
    if not network:
        a += ["--unshare-net"]  # only a loopback of its own
    a += ["--die-with-parent"]  # the sandbox dies if the spawner does
    a += ["--new-session"]  # setsid: cannot push keystrokes into a terminal (TIOCSTI)
    a += ["--proc", "/proc"]  # a /proc of the new pid namespace only
    a += ["--dev", "/dev"]  # null, zero, random, urandom, tty, pts: no host devices
    a += ["--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]  # POSIX shm works, RAM capped
    a += ["--ro-bind", "/usr", "/usr"]  # programs and libraries, read-only
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            a += ["--symlink", os.readlink(top), top]  # merged-/usr link, as on the host
        elif os.path.isdir(top):
            a += ["--ro-bind", top, top]  # a real folder on a non-merged host
    for path in _ETC_ALWAYS:
        a += ["--ro-bind-try", path, path]  # alternatives, certificates, users, linker cache
    if network:
        for path in _ETC_NETWORK:
            a += ["--ro-bind-try", path, path]  # name resolution, only for steps with network
    for prefix in runtimes:
        a += ["--ro-bind", prefix, prefix]  # a language runtime living outside /usr
    a += ["--bind", str(private_tmp), "/tmp"]  # /tmp on disk, in the session, under its quota
    a += ["--symlink", "/tmp", "/var/tmp"]  # the other temp folder tools expect, same place
    for path in writable:
        a += ["--bind", _host_path(path), _host_path(path)]  # session folders, same path inside
    for mount in mounts:
        target = _sandbox_target(mount.target)
        a += ["--bind" if mount.writable else "--ro-bind", str(mount.source), target]  # assets
    a += ["--remount-ro", "/dev"]  # /dev is a tmpfs: files there would be RAM no limit sees
    a += ["--remount-ro", "/"]  # so is the root: writable only through the binds above
    a += ["--chdir", str(cwd)]  # start where the caller asked
    a += ["--clearenv"]  # nothing of bwrap's own environment leaks in
    for key, value in env.items():
        a += ["--setenv", key, value]  # exactly the caller's environment (+ the tag)
    return a


def _host_path(path: Path | str) -> str:
    path = os.path.abspath(path)
    if path == "/":
        raise ValueError("refusing to bind / as a whole")
    return path


def _sandbox_target(target: str) -> str:
    if not target.startswith("/") or ".." in target.split("/") or target.rstrip("/") == "":
        raise ValueError(f"mount target must be an absolute path other than /: {target!r}")
    return target


def private_tmp(session_dir: Path, uid: int | None) -> Path:
    """``<session>/tmp``, a real folder (not a link) owned by the command uid, mode 0700."""
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
    finally:
        os.close(fd)
    return tmp


def _is_system(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in _SYSTEM_ROOTS)


def language_runtimes() -> list[str]:
    """Prefixes of the Python and Node this host has outside the system folders."""
    candidates = [os.path.realpath(sys.base_prefix)]
    for name in ("python3", "node"):
        exe = shutil.which(name)
        if exe is None:
            continue
        bindir = os.path.dirname(os.path.realpath(exe))
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
        if _can_traverse(f"{prefix}/bin", uid):
            usable.append(prefix)
        else:
            log.warning(
                "language runtime %s is not reachable by uid %s (a parent folder is not "
                "traversable); commands use the system's interpreters instead",
                prefix,
                uid,
            )
    return tuple(usable)


def _can_traverse(path: str, uid: int | None) -> bool:
    """Whether ``uid`` (group = uid, no other groups) may search every folder down to ``path``."""
    if uid is None:
        return os.access(path, os.X_OK)
    current = "/"
    for part in ("", *Path(os.path.realpath(path)).parts[1:]):
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
        runtime = Bubblewrap(uid, bwrap=exe)
        env = {"PATH": SYSTEM_PATH, TAG_VAR: "bwrap-probe"}
        launch = runtime.launch(
            ["true"], session_dir=session, cwd=session, env=env, network=False, writable=[session], mounts=[]
        )
        owner = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
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
                **owner,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{exe}: {exc}"
        finally:
            launch.close()
    if done.returncode != 0:
        return False, f"{exe} exited {done.returncode}: {done.stderr.strip()[-500:]}"
    return True, f"{version or 'bubblewrap'} works (uid {uid if uid is not None else os.getuid()})"


def select_runtime(mode: str, *, uid: int | None = None, bwrap: str = "bwrap", workdir: Path | None = None) -> Runtime:
    """auto: bwrap when the probe passes, else none with a warning; bwrap: or raise; none.

    ``uid`` and ``workdir`` as for ``probe_bwrap``.
    """
    if uid is None:
        uid = sandbox_uid()
    if mode == "none":
        runtime = NoSandbox(uid)
        runtime.warning = f"SANDBOX=none: {NO_SANDBOX_LIMITS}"
        log.warning("sandbox: %s", runtime.warning)
        return runtime
    if mode not in ("auto", "bwrap"):
        raise ValueError(f"sandbox mode must be auto, bwrap or none, got {mode!r}")
    works, detail = probe_bwrap(uid, bwrap, workdir)
    if works:
        log.info("sandbox: %s", detail)
        return Bubblewrap(uid, bwrap)
    if mode == "bwrap":
        raise SandboxUnavailable(
            f"SANDBOX=bwrap but bubblewrap does not work here: {detail}. "
            "Fix bubblewrap (user namespaces must be allowed) or set SANDBOX=auto or none."
        )
    runtime = NoSandbox(uid)
    runtime.warning = f"bubblewrap unavailable, commands run without a sandbox ({detail}): {NO_SANDBOX_LIMITS}"
    log.warning("sandbox: %s", runtime.warning)
    return runtime


def command_path(runtime: Runtime) -> str:
    """The fixed PATH the pipeline gives every command under ``runtime``."""
    return runtime.command_path()
