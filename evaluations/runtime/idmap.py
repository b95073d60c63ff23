"""User namespaces the executor makes itself: for idmapped mounts, and for commands in an image.

An image's commands run "root in name only" (SPEC §16): inside, the ids 0-65535 of a container;
on the host, ids the evaluation owns and nothing else has.

1. ``IdMap``: the map of one evaluation. The image's ``User`` (uid ``user``, gid ``group``) is the
   evaluation's leased uid ``lease`` on the host, so every folder the executor already gives that
   uid (the repository, HOME, tmp, the egress socket) is the image user's own inside, and the
   uid's proxy, quota and sweep work unchanged. Every other id ``n`` of 0-65535 is ``base + n``:
   a range of 65536 host ids of the evaluation's own (``image_id_base``: one range per uid of the
   pool, so two evaluations never share one).
2. ``userns_fd(idmap, owner)``: a user namespace with that map, owned by host uid ``owner``, kept
   open for this process. Owned by the lease, so bwrap, started as the lease like every sandboxed
   command, may join it (``--userns``: setns needs the caller to own the namespace); made by a
   process that drops to ``owner`` and unshares (the init's ``--userns``, runtime/init.c: a spawn
   of a small static program, where a fork would copy this process's whole address space; a fork
   where the init cannot be built), the maps written by us (root needs no ``/etc/subuid`` entry
   for that). ``max_user_namespaces`` is 0 inside it: no command can make a
   nested namespace (what bwrap's ``--disable-userns`` does, which needs ``--unshare-user``).
   The same fd serves ``mount_setattr(MOUNT_ATTR_IDMAP)``: the image's layers, owned on disk by
   the image's own ids, are seen through the map.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from evaluations.runtime import initbin
from executor_project.process import keep_descriptor

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWUSER = 0x10000000
ID_COUNT = 65536  # ids inside a container's namespace: 0-65535, as /etc/subuid ranges give


class NamespaceError(OSError):
    """A user namespace could not be made (user namespaces disabled, a map refused)."""


@dataclass(frozen=True)
class IdMap:
    """Inside id -> host id for one evaluation's image commands (uids and gids alike)."""

    lease: int  # the evaluation's own uid: the image user is this uid on the host
    base: int  # the evaluation's range: inside id n (any other) is host id base + n
    user: int = 0  # the image's User uid inside
    group: int = 0  # and its gid

    def uid_lines(self) -> str:
        return _lines(self.user, self.lease, self.base)

    def gid_lines(self) -> str:
        return _lines(self.group, self.lease, self.base)

    def host_uid(self, inside: int) -> int:
        return self.lease if inside == self.user else self.base + inside

    def host_gid(self, inside: int) -> int:
        return self.lease if inside == self.group else self.base + inside

    def owns_uid(self, host: int) -> bool:
        """Whether ``host`` is one of this evaluation's ids (the lease, or the range but its hole)."""
        return host == self.lease or (self.base <= host < self.base + ID_COUNT and host != self.base + self.user)


def image_id_base(first: int, lease: int, pool_start: int) -> int:
    """The range of the pool's uid ``lease``: ``first`` + its index in the pool x 65536."""
    return first + (lease - pool_start) * ID_COUNT


def image_id_range(first: int, lease: int, pool_start: int) -> range:
    """Every host id of ``lease``'s range (``image_id_base``): what its image commands run as, but the lease."""
    base = image_id_base(first, lease, pool_start)
    return range(base, base + ID_COUNT)


def _lines(special: int, lease: int, base: int) -> str:
    """``special`` -> lease, and around it 0..65535 -> base+n, as uid_map's "inside host count" lines."""
    lines = []
    if special > 0:
        lines.append(f"0 {base} {special}")
    lines.append(f"{special} {lease} 1")
    if special + 1 < ID_COUNT:
        lines.append(f"{special + 1} {base + special + 1} {ID_COUNT - special - 1}")
    return "\n".join(lines) + "\n"


_namespaces: dict[tuple[str, str, int], int] = {}
_lock = threading.Lock()


def userns_fd(uid_map: str, gid_map: str, owner: int) -> int:
    """An fd of a user namespace with these maps, owned by ``owner`` (made once per process)."""
    key = (uid_map, gid_map, owner)
    with _lock:
        fd = _namespaces.get(key)
        if fd is None:
            fd = _namespaces[key] = _make(uid_map, gid_map, owner)
            keep_descriptor(fd)
        return fd


def image_userns_fd(idmap: IdMap) -> int:
    return userns_fd(idmap.uid_lines(), idmap.gid_lines(), idmap.lease)


def _make(uid_map: str, gid_map: str, owner: int) -> int:
    """A new user namespace with these maps, owned by ``owner``, held by the returned fd: made by the
    init's ``--userns`` (runtime/init.c, spawned), else by a fork of this process (``_make_forked``)."""
    helper = initbin.host_binary()
    if helper is None:
        return _make_forked(uid_map, gid_map, owner)
    # A fork of a service's process copies its whole address space: 7 ms at 88 MB where a spawn of the
    # static init takes 1-2 (bench/RESULTS.md, issue 38, stop 48).
    proc = subprocess.Popen(
        [str(helper), "--userns", str(owner)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
    )
    try:
        return _handshake(proc.pid, proc.stdout.fileno(), proc.stdin.fileno(), uid_map, gid_map)
    finally:
        proc.stdin.close()  # it reads the end and exits
        proc.stdout.close()
        proc.wait()


def _handshake(pid: int, ready: int, go: int, uid_map: str, gid_map: str) -> int:
    """Our side with the maker, the init or a fork: it says "1" once unshared, we write its maps and
    say "1", it forbids nested namespaces and says "2"; the namespace's fd (the maker exits after)."""
    if os.read(ready, 1) != b"1":
        raise NamespaceError(errno.EPERM, "could not create a user namespace (are user namespaces allowed?)")
    proc = Path(f"/proc/{pid}")
    try:
        (proc / "uid_map").write_text(uid_map)
        (proc / "gid_map").write_text(gid_map)
    except OSError as exc:
        raise NamespaceError(exc.errno, f"user namespace map refused: {exc.strerror}") from None
    os.write(go, b"1")
    if os.read(ready, 1) != b"2":
        raise NamespaceError(errno.EPERM, "could not forbid nested user namespaces")
    return os.open(proc / "ns" / "user", os.O_RDONLY | os.O_CLOEXEC)


def _make_forked(uid_map: str, gid_map: str, owner: int) -> int:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only switches uid, unshares and waits: nothing that could take a lock
        code = 1
        try:
            os.close(ready_r)
            os.close(go_w)
            if owner != os.geteuid():
                os.setgroups([])
                os.setresgid(owner, owner, owner)
                os.setresuid(owner, owner, owner)
            if _libc.unshare(_CLONE_NEWUSER) == 0:
                os.write(ready_w, b"1")
                if os.read(go_r, 1) == b"1":  # the maps are written: we are root inside
                    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
                        limit.write("0")
                    os.write(ready_w, b"2")
                    os.read(go_r, 1)
                    code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    try:
        return _handshake(pid, ready_r, go_w, uid_map, gid_map)
    finally:
        os.close(ready_r)
        os.close(go_w)  # the child reads EOF and exits
        os.waitpid(pid, 0)
