"""What one command may see and do, written down as data, and the one place it becomes an argv.

A ``SandboxPolicy`` is to a command what nsjail's config is to a jail: the
step chooses what the command needs (network, writable folders, extra
binds, a root filesystem), the spawner adds what the evaluation fixes (the
uid, rlimits, niceness, namespaces), and ``render`` turns the whole into
``<the launch's steps> [bwrap ...] -- argv``. A new capability is a field here
and a few lines in ``render``, never a second code path.

The steps before bubblewrap (the cgroup, the network namespace, the uid, no_new_privs, the
rlimits, the niceness) are one list (``_launch_steps``), written as one exec of the static init's
``--launch`` where it is built (``Tools.launcher``: one static exec where the system's tools take
three or four dynamic ones; bench/RESULTS.md, issue 38, stop 51), else as those tools one after
another (``sh`` for the cgroup, ``nsenter``, ``setpriv``, ``prlimit``, ``nice``), each the same step.

Why the exec chain and not Popen options: the launch switching the uid lets
Popen use vfork (CPython forks whenever it must change uid itself), and no
``preexec_fn`` is needed (unsafe with threads). As root the spawner lowers
the niceness of its own thread for the moment of the Popen instead of one
more exec of ``nice`` (children inherit a thread's niceness).

How bwrap itself is run, and why as the unprivileged uid, is in sandbox.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluations.network.egress.relay import RELAY_TARGET, SANDBOX_SOCKET, proxy_env, relay_wrapper
from evaluations.runtime import capabilities, initbin
from evaluations.runtime.cgroups import join_prefix
from evaluations.runtime.types import ImageRoot, Mount

COMMAND_NICENESS = 10  # below the service and the other evaluations' bookkeeping
# Raising a thread's priority back afterwards takes CAP_SYS_NICE: root's on a host, not in a container.
NICE_BY_THREAD = os.geteuid() == 0 and "CAP_SYS_NICE" in capabilities.effective()
# /dev/shm is RAM the memory monitor cannot see unless mapped: capped like Docker's default.
SHM_BYTES = 64 * 1024 * 1024
HOST_SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# /etc files every command may read on the host's root; the network ones only with network.
ETC_ALWAYS = (
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
)
# An environment's top folders that are not its files: the sandbox makes its own.
ROOT_SKIPPED = frozenset({"proc", "dev", "sys", "tmp", "run", "mnt", "media", "lost+found"})
# Where the host's CA bundle is inside every sandbox: commands trust what the host trusts,
# whatever root filesystem they see (the pipeline points SSL_CERT_FILE and the like here).
SANDBOX_CA_BUNDLE = "/run/term-executor/ca-certificates.crt"
DISTRIBUTION_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# What a container's root gets by default (Docker's set, less MKNOD and NET_RAW): root in the
# image's user namespace can install packages, chown, switch users; none of it reaches the host.
CONTAINER_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_SETFCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
)


@dataclass(frozen=True)
class RLimits:
    fsize_bytes: int  # one file cannot outgrow the whole disk quota
    nproc: int  # kernel backstop against fork bombs (per uid: see spawner.py)
    core_bytes: int = 0  # no core dumps filling the session


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the programs ``render`` puts in front of a command."""

    setpriv: str
    prlimit: str
    nice: str | None = None  # only where the niceness is not set by the starting thread
    bwrap: str | None = None  # only for a runtime with namespaces
    nsenter: str | None = None  # only for a policy that joins a network namespace (``netns``)
    launcher: str | None = None  # the static init (``--launch``): every step before bwrap in one exec


@dataclass(frozen=True)
class SandboxPolicy:
    # Chosen by the step, for this command.
    network: bool = False  # egress through the evaluation's proxy (egress_socket); never the host's network
    writable: tuple[Path, ...] = ()  # bound read-write at the same path
    mounts: tuple[Mount, ...] = ()  # extra binds (assets at /static, the agent's folder)
    root: Path | None = None  # a root filesystem (an environment); None: the host's system folders
    image: ImageRoot | None = None  # an image's writable root, its commands root in name only (SPEC §16)
    # The executor's own commands (clone, patch): a /tmp made empty for this command alone, never
    # the session's tmp/, which the agent writes (see sandbox.prepare_mount_points).
    fresh_tmp: bool = False
    # A live sandbox (SPEC §24): /tmp is its image's own, in its writable layer (files sent there
    # through the API are the ones its commands see), not the session's tmp/ bound over it.
    image_tmp: bool = False
    # Fixed by the evaluation; the spawner fills these in.
    namespaces: bool = False  # bubblewrap: user, pid, ipc, uts, cgroup and (without network) net
    uid: int | None = None  # None: no switch (the service does not run as root)
    rlimits: RLimits | None = None
    niceness: int = COMMAND_NICENESS
    no_new_privs: bool = True
    private_tmp: Path | None = None  # the session's own /tmp (namespaces only)
    runtimes: tuple[str, ...] = ()  # language runtimes outside /usr, bound read-only (host root only)
    ca_bundle: Path | None = None  # the host's trusted certificates, bound at SANDBOX_CA_BUNDLE
    egress_socket: Path | None = None  # the evaluation's egress proxy (evaluations/egress), bound at SANDBOX_SOCKET
    # The init's folder (initbin.ensure_init, under WORKSPACE_BASE): bound at RELAY_TARGET with the
    # socket, the egress relay is its ``--relay`` (network/egress/relay.py), whatever the root.
    relay_init: Path | None = None
    cgroup_procs: tuple[Path, ...] = ()  # the evaluation's cgroup: the command joins it before anything else
    # The environment's network namespace (runtime/netns.py, SPEC §23): joined (as root, before the uid
    # switch) instead of a new one, so the environment's processes, the agent and the verifier share
    # one loopback, as the processes of one container do. Namespaces only.
    netns: Path | None = None


@dataclass(frozen=True)
class Rendered:
    argv: list[str]
    env: dict[str, str]  # what Popen starts the chain with
    cwd: Path


def render(
    policy: SandboxPolicy,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    tools: Tools,
    outer_env: Mapping[str, str] | None = None,
    info_fd: int | None = None,
    userns_fd: int | None = None,
) -> Rendered:
    """The whole argv of one command under ``policy``; the only place a policy becomes flags."""
    chain = _launch_prefix(policy, tools)
    if not policy.namespaces:
        return Rendered([*chain, *argv], dict(env), Path(cwd))
    if tools.bwrap is None:
        raise ValueError("a policy with namespaces needs bwrap")
    report = [] if info_fd is None else ["--info-fd", str(info_fd)]  # bwrap names the sandbox's pid 1
    if _egress(policy):
        # Network "on": a relay on the sandbox's own loopback to the proxy's socket, and the
        # variables that send clients to it. Without a socket the command has no network at all.
        argv = [*relay_wrapper(f"{RELAY_TARGET}/{initbin.NAME}", SANDBOX_SOCKET), *argv]
        env = {**proxy_env(), **env}  # the caller may say NO_PROXY (the executor's own fetch of 127.0.0.1)
    flags = bwrap_flags(policy, cwd=Path(cwd), env=env, userns_fd=userns_fd)
    # bwrap's own environment: nothing the caller chose (no LD_PRELOAD before the namespaces exist).
    return Rendered([*chain, tools.bwrap, *report, *flags, "--", *argv], dict(outer_env or {}), Path("/"))


def cgroup_joins(argv: Sequence[str]) -> tuple[str, ...]:
    """The cgroup files a launcher line (``Tools.launcher``'s ``--launch``) joins; () for another line."""
    if len(argv) < 2 or argv[1] != "--launch":
        return ()
    end = argv.index("--") if "--" in argv else len(argv)
    return tuple(argv[i + 1] for i in range(2, end - 1) if argv[i] == "--cgroup")


def without_joins(argv: Sequence[str]) -> list[str]:
    """A launcher line without its cgroup joins: the rest of it, for a launcher that joined them
    already (``--hold``, the spawner's held launch)."""
    end = argv.index("--")
    head = [part for i, part in enumerate(argv[:end]) if not (part == "--cgroup" or (i and argv[i - 1] == "--cgroup"))]
    return [*head, *argv[end:]]


@dataclass(frozen=True)
class _LaunchSteps:
    """What runs before the command or its bubblewrap, in this order: as root, the cgroup's join and
    the network namespace's (setns needs CAP_SYS_ADMIN); then the uid switch; then, as that uid,
    no_new_privs, the rlimits (so never above the service's own) and the niceness."""

    cgroup_procs: tuple[Path, ...]
    netns: Path | None
    uid: int | None
    no_new_privs: bool
    rlimits: RLimits | None
    niceness: int | None  # None: the starting thread's (NICE_BY_THREAD), nothing to do here


def _launch_steps(policy: SandboxPolicy, tools: Tools) -> _LaunchSteps:
    netns = policy.netns if policy.namespaces else None
    if netns is not None and tools.nsenter is None and tools.launcher is None:
        raise ValueError("a policy joining a network namespace needs nsenter")
    return _LaunchSteps(
        cgroup_procs=tuple(policy.cgroup_procs),
        netns=netns,
        uid=policy.uid,
        # bwrap sets no_new_privs itself (and a setuid bwrap must keep its bit): only without it here.
        # setuid/setgid/file-capability programs (su, crontab, ping...) gain nothing.
        no_new_privs=policy.no_new_privs and not policy.namespaces,
        rlimits=policy.rlimits,
        niceness=policy.niceness if tools.nice is not None else None,
    )


def _launch_prefix(policy: SandboxPolicy, tools: Tools) -> list[str]:
    steps = _launch_steps(policy, tools)
    if tools.launcher is not None:
        return _launcher_prefix(steps, tools.launcher)
    return _tools_prefix(steps, tools)


def _launcher_prefix(steps: _LaunchSteps, launcher: str) -> list[str]:
    """Every step in one exec of the static init (runtime/init.c's ``--launch``)."""
    a = [launcher, "--launch"]
    for procs in steps.cgroup_procs:
        a += ["--cgroup", str(procs)]
    if steps.netns is not None:
        a += ["--netns", str(steps.netns)]
    if steps.uid is not None:
        a += ["--uid", str(steps.uid)]
    if steps.no_new_privs:
        a.append("--no-new-privs")
    if steps.rlimits is not None:
        limits = steps.rlimits
        a += ["--fsize", str(limits.fsize_bytes), "--nproc", str(limits.nproc), "--core", str(limits.core_bytes)]
    if steps.niceness is not None:
        a += ["--nice", str(steps.niceness)]
    return [*a, "--"] if len(a) > 2 else []


def _tools_prefix(steps: _LaunchSteps, tools: Tools) -> list[str]:
    """The same steps as the system's tools, one exec each (a host where the init cannot be built)."""
    chain = join_prefix(steps.cgroup_procs) if steps.cgroup_procs else []
    if steps.netns is not None:
        chain += [tools.nsenter, f"--net={steps.netns}", "--"]
    if steps.uid is not None or steps.no_new_privs:
        chain.append(tools.setpriv)
        if steps.uid is not None:
            chain += [f"--reuid={steps.uid}", f"--regid={steps.uid}", "--clear-groups"]
        if steps.no_new_privs:
            chain.append("--no-new-privs")
        chain.append("--")
    if steps.rlimits is not None:
        limits = steps.rlimits
        chain += [
            tools.prlimit,
            f"--fsize={limits.fsize_bytes}",
            f"--nproc={limits.nproc}",
            f"--core={limits.core_bytes}",
            "--",
        ]
    if steps.niceness is not None:
        chain += [tools.nice, "-n", str(steps.niceness), "--"]
    return chain


def bwrap_flags(policy: SandboxPolicy, *, cwd: Path, env: Mapping[str, str], userns_fd: int | None = None) -> list[str]:
    """The bwrap options, one flag per line, each with its reason."""
    a: list[str] = []
    if policy.image is None:
        a += ["--unshare-user"]  # own user namespace: the uid inside is the host uid bwrap runs as
        a += ["--disable-userns"]  # no nested user namespaces: less kernel surface to attack
    else:
        a += _image_user_flags(policy.image, userns_fd)
    a += ["--unshare-pid"]  # host processes invisible; killing its pid 1 ends every process inside
    a += ["--unshare-ipc"]  # no SysV IPC or POSIX queues shared with the host
    a += ["--unshare-uts"]  # own hostname
    a += ["--unshare-cgroup-try"]  # host cgroup paths not shown
    if policy.netns is None:
        a += ["--unshare-net"]  # only a loopback of its own, whatever the step: egress goes through the proxy
    # else: the environment's namespace, joined by nsenter before bwrap: its loopback alone, shared
    a += ["--die-with-parent"]  # the sandbox dies if the spawner does
    a += ["--new-session"]  # setsid: cannot push keystrokes into a terminal (TIOCSTI)
    if policy.image is not None:
        a += ["--bind", str(policy.image.rootfs), "/"]  # the image and the evaluation's layer: first, under all
    a += ["--proc", "/proc"]  # a /proc of the new pid namespace only
    a += ["--dev", "/dev"]  # null, zero, random, urandom, tty, pts: no host devices
    a += ["--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]  # POSIX shm works, RAM capped
    if policy.image is not None:
        pass  # bound above
    elif policy.root is None:
        a += _host_root_flags(policy)
    else:
        a += _environment_root_flags(policy, policy.root)
    if policy.ca_bundle is not None:
        a += ["--ro-bind", str(policy.ca_bundle), SANDBOX_CA_BUNDLE]  # the host's trust, at a fixed path
    if policy.private_tmp is not None:
        a += ["--bind", str(policy.private_tmp), "/tmp"]  # /tmp on disk, in the session, under its quota
        if policy.root is None and policy.image is None:
            a += ["--symlink", "/tmp", "/var/tmp"]  # the other temp folder tools expect, same place
        elif (
            policy.root is not None
            and os.path.isdir(policy.root / "var/tmp")
            and not os.path.islink(policy.root / "var/tmp")
        ):
            a += ["--bind", str(policy.private_tmp), "/var/tmp"]  # the environment's own is read-only
    for path in policy.writable:
        a += ["--bind", _host_path(path), _host_path(path)]  # session folders, same path inside
    for mount in policy.mounts:
        a += ["--bind" if mount.writable else "--ro-bind", str(mount.source), _sandbox_target(mount.target)]
    if _egress(policy):
        a += ["--bind", str(policy.egress_socket), SANDBOX_SOCKET]  # the proxy; connecting needs write
        a += ["--ro-bind", str(policy.relay_init), RELAY_TARGET]  # the relay: our static init, no library of the root's
    a += ["--remount-ro", "/dev"]  # /dev is a tmpfs: files there would be RAM no limit sees
    if policy.image is None:
        a += ["--remount-ro", "/"]  # so is the root: writable only through the binds above
    a += ["--chdir", str(cwd)]  # start where the caller asked
    a += ["--clearenv"]  # nothing of bwrap's own environment leaks in
    for key, value in env.items():
        a += ["--setenv", key, value]  # exactly the caller's environment
    return a


def _host_root_flags(policy: SandboxPolicy) -> list[str]:
    """The read-only system: the host's system folders, never / as a whole."""
    a: list[str] = []
    a += ["--ro-bind", "/usr", "/usr"]  # programs and libraries, read-only
    for top in HOST_SYSTEM_ROOTS[1:]:
        if os.path.islink(top):
            a += ["--symlink", os.readlink(top), top]  # merged-/usr link, as on the host
        elif os.path.isdir(top):
            a += ["--ro-bind", top, top]  # a real folder on a non-merged host
    for path in ETC_ALWAYS:
        a += ["--ro-bind-try", path, path]  # alternatives, certificates, users, linker cache
    # No resolv.conf: a sandbox resolves nothing itself; the proxy resolves what it checks.
    for prefix in policy.runtimes:
        a += ["--ro-bind", prefix, prefix]  # a language runtime living outside /usr
    return a


def _image_user_flags(image: ImageRoot, userns_fd: int | None) -> list[str]:
    """Join the evaluation's namespace (runtime/idmap.py) as the user its commands run as (the map's:
    the image's User or [agent] user; or the verifier's); root keeps a container's caps."""
    if userns_fd is None:
        raise ValueError("a policy with an image needs the user namespace's fd")
    uid, gid = image.ids
    if uid != 0 and gid != image.idmap.group:
        # bubblewrap 0.8 sets the uid before the gid, and a user not root inside may take no other gid
        # than its own: a sandbox of another user has the map's group (a phase's init switches both).
        gid = image.idmap.group
    a = ["--userns", str(userns_fd)]  # ids 0-65535 inside, the evaluation's own on the host
    a += ["--uid", str(uid), "--gid", str(gid)]
    if uid == 0:
        for capability in CONTAINER_CAPABILITIES:
            a += ["--cap-add", capability]  # apt, chown, su: as root in a container, in the namespace only
    return a


def _egress(policy: SandboxPolicy) -> bool:
    if not (policy.network and policy.egress_socket is not None):
        return False
    if policy.relay_init is None:
        raise ValueError("a policy with network needs relay_init (the init's folder: the relay runs from it)")
    return True


def _environment_root_flags(policy: SandboxPolicy, root: Path) -> list[str]:
    """An environment as the read-only system: each of its top folders, links as links.

    Bound folder by folder onto bwrap's own root rather than as /, so that the
    mount points of the session, /tmp and /static can still be made.
    """
    a: list[str] = []
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name in ROOT_SKIPPED:
                continue
            if entry.is_symlink():
                a += ["--symlink", os.readlink(entry.path), f"/{entry.name}"]  # bin -> usr/bin, as it has it
            elif entry.is_dir():
                a += ["--ro-bind", entry.path, f"/{entry.name}"]  # usr, etc, lib, var, opt...
    if policy.ca_bundle is not None and _is_plain_file(root / DISTRIBUTION_CA_BUNDLE.lstrip("/")):
        a += ["--ro-bind", str(policy.ca_bundle), DISTRIBUTION_CA_BUNDLE]  # tools reading the usual path
    return a


def _is_plain_file(path: Path) -> bool:
    return os.path.isfile(path) and not os.path.islink(path)


def _host_path(path: Path | str) -> str:
    path = os.path.abspath(path)
    if path == "/":
        raise ValueError("refusing to bind / as a whole")
    return path


def _sandbox_target(target: str) -> str:
    if not target.startswith("/") or ".." in target.split("/") or target.rstrip("/") == "":
        raise ValueError(f"mount target must be an absolute path other than /: {target!r}")
    return target
