"""Timing probe for ``python -m bench.profile_sandboxes``: where a live sandbox's create, exec and delete go.

Loaded by Python itself (``sitecustomize``) in every process the profiled service starts, when
this folder is on its PYTHONPATH and SANDBOX_PROBE_LOG names a file; nothing in the product
changes. When one of the modules below has been imported, the functions listed for it are
wrapped: each call appends one line, ``label pid start end`` (``time.time()``, so processes share
one clock), to the log (O_APPEND: lines from many processes do not interleave). The wrappers are
in place before the worker forks its forkserver, so every sandbox's process has them.
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import sys
import time

LOG = os.environ.get("SANDBOX_PROBE_LOG")

# module -> [(attribute path in that module, label)]. A name a module imported from another one is
# wrapped where it is called from (``host.pull``), a module's own function in that module.
TARGETS: dict[str, list[tuple[str, str]]] = {
    "django.core.handlers.wsgi": [("WSGIHandler.__call__", "api: django request")],
    "evaluations.api.sandboxes": [
        ("SandboxListView.post", "api: POST /sandboxes view"),
        ("parse", "api: parse the spec"),
        ("_wait_ready", "api: wait for ready (row polls)"),
        ("SandboxSerializer.build", "api: serialize"),
        ("SandboxExecView.post", "api: POST exec view"),
        ("SandboxDetailView.delete", "api: DELETE view"),
        ("_row", "api: read the row"),
        ("_call", "api: control socket call"),
    ],
    "evaluations.lifecycle": [
        ("start_sandbox", "db: insert the row"),
        ("sandbox_ready", "db: row ready"),
        ("end_sandbox", "db: row ended"),
    ],
    "evaluations.worker.wakeup": [("notify", "api: wake the worker")],
    "evaluations.worker.loop": [
        ("wait", "worker: wait (ends when woken)"),
        ("claim_sandboxes", "worker: claim"),
        ("Worker.collect_sandboxes", "worker: collect ended sandboxes"),
    ],
    "evaluations.worker.pool": [("Pool.start", "worker: start the process (forkserver)")],
    "evaluations.worker.child": [("sandbox_main", "owner: process main")],
    "evaluations.sandboxes.host": [
        ("LiveSandbox.__init__", "owner: read the row, parse the spec"),
        ("LiveSandbox.prepare", "owner: prepare"),
        ("LiveSandbox._environment", "prepare: environment (pull, cached)"),
        ("LiveSandbox.user", "prepare: resolve the user"),
        ("LiveSandbox.start", "owner: start (bwrap, init ready)"),
        ("LiveSandbox.serve", "owner: serve"),
        ("LiveSandbox.teardown", "owner: teardown"),
        ("LiveSandbox.exec", "exec: owner's exec"),
        ("LiveSandbox._exec_request", "exec: parse, user, env"),
        ("LiveSandbox._run_exec", "exec: run"),
        ("LiveSandbox._collect", "exec: collect output, wait"),
        ("LiveSandbox._record", "exec: record (thread start)"),
        ("LiveSandbox._oom_kills", "exec: read oom_kill"),
        ("pull", "prepare: pull (cached)"),
        ("host_ca", "host CA lookup"),
        ("EgressProxy.start", "prepare: egress proxy start"),
        ("EgressProxy.close", "teardown: egress proxy close"),
        ("Session.create", "prepare: session folder"),
        ("Session.retire", "teardown: session retire"),
        ("ImageStore.of", "prepare: image store"),
        ("ImageStore.touch", "prepare: store touch"),
        ("egress_policy", "egress policy"),
    ],
    "evaluations.sandboxes.control": [("listen", "serve: listen on the control socket")],
    "evaluations.runtime.initbin": [("ensure_init", "start: ensure the init binary")],
    "evaluations.runtime.initchannel": [
        ("InitChannel.__init__", "start: init channel"),
        ("InitChannel.wait_ready", "start: wait for the init's R"),
        ("InitChannel.start", "exec: init starts it (S)"),
    ],
    "evaluations.environments.kinds": [
        ("mount_image", "prepare: mount the image (overlay)"),
        ("make_mount_point", "prepare: init mount point"),
        ("trust_host_ca", "mount: host CA into the root"),
        ("make_workdir", "mount: workdir"),
    ],
    "evaluations.images.rootfs": [
        ("mount_root", "mount: mount_root (idmapped binds, overlay)"),
        ("unmount_root", "teardown: unmount the root"),
    ],
    "evaluations.runtime.uids": [
        ("acquire", "prepare: uid lease"),
        ("UidLease.release", "teardown: uid release"),
    ],
    "evaluations.runtime.spawner": [
        ("Spawner.__init__", "prepare: spawner"),
        ("Spawner.run", "spawner: run (the sandbox's life)"),
        ("Spawner._ensure_cgroup", "spawner: cgroup"),
        ("Spawner._complete", "spawner: policy, mount points"),
        ("Spawner._start", "spawner: Popen bwrap"),
        ("Spawner._adopt_sandbox_init", "spawner: bwrap's pid 1 (info pipe)"),
        ("Spawner.sweep", "teardown: sweep"),
        ("Spawner.close", "teardown: cgroup remove"),
        ("Spawner.scrub", "teardown: scrub the uid"),
        ("Spawner.resources", "teardown: resources"),
    ],
    "evaluations.runtime.sandbox": [("Bubblewrap.launch", "spawner: bwrap argv")],
    "evaluations.runtime.monitor": [("Monitor.start", "spawner: monitor start")],
    "evaluations.pipeline.session": [("remove_retired", "teardown: remove the session folder")],
}

# With SANDBOX_PROBE_MEMORY=1, where a sandbox's process notes its private memory (Private_Clean +
# Private_Dirty, KiB) and the modules it imported since it was forked: on entering these calls and
# on leaving them. Each note reads /proc/self/smaps_rollup (a millisecond or more): the timings of
# such a run are longer.
CHECKPOINTS = (
    {"owner: process main", "owner: prepare", "owner: start (bwrap, init ready)", "owner: serve"}
    if os.environ.get("SANDBOX_PROBE_MEMORY") == "1"
    else set()
)
_modules_at_fork: set[str] | None = None

_fd: int | None = None
_fd_pid: int | None = None


def _write(label: str, start: float, end: float) -> None:
    global _fd, _fd_pid
    if _fd is None or _fd_pid != os.getpid():
        _fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        _fd_pid = os.getpid()
    try:
        os.write(_fd, f"{label}\t{os.getpid()}\t{start:.6f}\t{end:.6f}\n".encode())
    except OSError:
        pass


def _private_kib() -> int:
    total = 0
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def _checkpoint(label: str, when: str) -> None:
    """``mem|label|when`` with the private KiB, and the modules imported since the process began."""
    global _modules_at_fork
    if label == "owner: process main" and when == "enter":
        _modules_at_fork = set(sys.modules)
    new = sorted(set(sys.modules) - _modules_at_fork) if _modules_at_fork is not None else []
    now = time.time()
    _write(f"mem|{label}|{when}|{_private_kib()}|{len(new)}|{','.join(new)}", now, now)


def _timed(function, label: str):
    checkpoint = label in CHECKPOINTS

    @functools.wraps(function)
    def timed(*args, **kwargs):
        if checkpoint:
            _checkpoint(label, "enter")
        start = time.time()
        try:
            return function(*args, **kwargs)
        finally:
            _write(label, start, time.time())
            if checkpoint and label != "owner: process main":
                _checkpoint(label, "leave")

    return timed


def _patch(module, path: str, label: str) -> None:
    owner = module
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent, None)
        if owner is None:
            return
    static = inspect.getattr_static(owner, name, None)
    if static is None:
        return
    if isinstance(static, classmethod):
        setattr(owner, name, classmethod(_timed(static.__func__, label)))
    elif isinstance(static, staticmethod):
        setattr(owner, name, staticmethod(_timed(static.__func__, label)))
    elif callable(static):
        setattr(owner, name, _timed(static, label))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders, and wraps the loader of a module listed above."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            for attr, label in TARGETS[fullname]:
                _patch(module, attr, label)

        loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _Finder())
