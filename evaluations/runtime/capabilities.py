"""The capabilities this process holds, and the ones the service needs as root (SPEC §20, §21).

On a host, root holds every capability; in a container, root holds what the engine grants
(``docker run --cap-add``), a fraction of them. What the service does as root and the capability
each needs:

* a uid of its own per evaluation and live sandbox (``setpriv``), and the image id ranges written
  into a user namespace's maps: ``CAP_SETUID``, ``CAP_SETGID``;
* session folders handed to those uids and image layers unpacked with their owners and modes:
  ``CAP_CHOWN``, ``CAP_FOWNER``, ``CAP_FSETID``, ``CAP_DAC_OVERRIDE``; whiteouts (device 0:0):
  ``CAP_MKNOD``;
* an image's layers mounted for a task (overlay, idmapped mounts through ``open_tree`` and
  ``mount_setattr``), and a live sandbox's namespaces joined: ``CAP_SYS_ADMIN``;
* every process of an evaluation found (its tag in ``/proc/<pid>/environ``) and killed, whatever uid
  it runs as, and an image's user namespace and a sandbox's IPC namespace opened
  (``/proc/<pid>/ns``): ``CAP_SYS_PTRACE`` (the kernel's ptrace read check for another uid's
  process) and ``CAP_KILL``.

``CAP_SYS_NICE`` is optional: with it, the thread that starts a command lowers its own priority
for the start and raises it back (``policy.NICE_BY_THREAD``); without it, ``nice`` does it.
"""

from __future__ import annotations

import functools

# Bit numbers of linux/capability.h.
NUMBERS = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_NICE": 23,
    "CAP_MKNOD": 27,
}
# What running as root takes, in the order a message names them, with what each is for.
NEEDED_AS_ROOT = {
    "CAP_SYS_ADMIN": "mounting an image's layers for image tasks, Harbor tasks and live sandboxes",
    "CAP_SYS_PTRACE": "reading the environment and namespaces of each evaluation's processes, to find and kill them",
    "CAP_MKNOD": "the whiteouts of an image's layers",
    "CAP_SETUID": "a uid of its own per evaluation and sandbox",
    "CAP_SETGID": "a gid of its own per evaluation and sandbox",
    "CAP_CHOWN": "handing session folders to those uids",
    "CAP_FOWNER": "unpacking image layers with their modes",
    "CAP_FSETID": "unpacking image layers with their set-id bits",
    "CAP_DAC_OVERRIDE": "reaching the sessions' folders",
    "CAP_KILL": "killing every process of an evaluation",
}


def effective(status: str | None = None) -> frozenset[str]:
    """The capabilities named in ``NUMBERS`` that ``CapEff`` of ``/proc/self/status`` (or ``status``) holds."""
    if status is None:
        return _own()
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            bits = int(line.split()[1], 16)
            return frozenset(name for name, bit in NUMBERS.items() if bits >> bit & 1)
    raise ValueError("no CapEff line in the process status")


@functools.cache
def _own() -> frozenset[str]:
    with open("/proc/self/status") as status:
        return effective(status.read())


def missing_as_root(status: str | None = None) -> list[str]:
    """``NEEDED_AS_ROOT``'s capabilities this process lacks."""
    held = effective(status)
    return [name for name in NEEDED_AS_ROOT if name not in held]
