"""One network namespace for the processes of one environment (SPEC §23), as a container has one.

Every sandbox otherwise makes a network namespace of its own (``bwrap --unshare-net``): a loopback
nobody else sees. A Harbor task's environment starts a process before the agent (its entrypoint,
a server) and checks it (its healthcheck); the agent and the verifier then reach it on 127.0.0.1,
as processes of one container do. So the environment's sandboxes join one namespace instead
(``SandboxPolicy.netns``: ``nsenter --net`` before bubblewrap):

1. Made here, by root, in a thread of the evaluation's process that does nothing else: the thread
   unshares its own network namespace (the process's other threads keep theirs), opens it, brings
   its loopback up and lets every uid bind ports below 1024 in it (Docker's default for containers:
   the namespace belongs to the host's user namespace, where an image's root has no
   CAP_NET_BIND_SERVICE), and ends. The descriptor holds the namespace; ``close`` lets it go.
2. Nothing but a loopback: no device reaches the host. Egress stays the proxy's, through the relay
   a sandbox with network starts on 127.0.0.1:3128 (relay.py), one at a time: the phases that
   have network (the agent's, the verifier's) never run at once, and the environment's own
   processes get none.
3. Joined through ``/proc/<this process>/fd/<fd>``: only root opens that path (the process is
   root's), and nsenter runs as root, before setpriv drops to the evaluation's uid.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading
from pathlib import Path

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_UNPRIVILEGED_PORT_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"


class NetworkUnavailable(OSError):
    """The namespace could not be made (not root, or the kernel refuses)."""


class SharedNetwork:
    """A network namespace held open by this process; ``path`` is what ``SandboxPolicy.netns`` takes."""

    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def create(cls) -> SharedNetwork:
        made: list[int] = []
        failed: list[BaseException] = []

        def make() -> None:
            try:
                made.append(_unshare_and_open())
            except BaseException as exc:  # reported to the caller, in its thread
                failed.append(exc)

        thread = threading.Thread(target=make, name="shared-netns")
        thread.start()
        thread.join()  # the thread's own namespace ends with it; the descriptor keeps it
        if failed:
            raise NetworkUnavailable(f"could not make the environment's network namespace: {failed[0]}")
        return cls(made[0])

    @property
    def path(self) -> Path:
        if self.fd < 0:
            raise ValueError("the network namespace is closed")
        return Path(f"/proc/{os.getpid()}/fd/{self.fd}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _unshare_and_open() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWNET): {os.strerror(code)}")
    fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _loopback_up()
        with open(_UNPRIVILEGED_PORT_START, "w") as setting:  # this namespace's, not the host's
            setting.write("0")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _loopback_up() -> None:
    """``ip link set lo up``, by ioctl on a socket of this thread's (new) namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
