"""Start-up checks shown by `manage.py check`, migrate and the run commands."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from django.conf import settings
from django.core import checks
from django.db import DatabaseError

from evaluations.api import auth

logger = logging.getLogger("term_executor")


def startup_warnings() -> list[str]:
    config = settings.EXECUTOR
    warnings = []
    if not _auth_on(config):
        warnings.append(
            "AUTH_TOKEN and AUTH_TOKENS are unset and no token was made in the admin: authentication is "
            "disabled, anyone who reaches the port can submit code"
        )
    return warnings


def _auth_on(config) -> bool:
    """A configured token, or one made in the admin (SPEC §21); before migrate made the table, only the first."""
    try:
        return auth.enabled(config)
    except DatabaseError:
        return config.auth_enabled


@dataclass(frozen=True)
class SandboxState:
    """What the workers run agent code in, for /status and the admin dashboard."""

    mode: str  # "bwrap" or "none"
    limits: str  # "cgroup v2", "cgroup v1" or "monitor"
    words: str  # the two in a sentence: "bubblewrap 0.8.0, cgroup v1 memory+pids, ..."


def sandbox_state(workers) -> SandboxState:
    """The live workers' sandbox and limits (they probed at start); with no worker up, what one
    started here would get."""
    from evaluations.runtime.cgroupfs import guess_mode

    config = settings.EXECUTOR
    limits = workers[0].limits if workers and workers[0].limits else guess_mode().value
    if workers:
        mode = workers[0].sandbox
    elif config.sandbox == "none":
        mode = "none"
    elif _bwrap_works():
        mode = "bwrap"
    else:  # a worker would refuse to start (SPEC §20): nothing runs, sandboxed or not
        words = (
            f"unavailable: SANDBOX={config.sandbox} and {_bwrap_version()} does not work here, so no worker "
            "can start (install bubblewrap, or set SANDBOX=none)"
        )
        return SandboxState("none", limits, words)
    return SandboxState(mode, limits, sandbox_words(mode, limits))


def sandbox_words(mode: str, limits: str) -> str:
    """``mode`` and ``limits`` as an operator reads them, with the uids commands run as."""
    config = settings.EXECUTOR
    if os.geteuid() == 0:
        last = config.sandbox_uid + config.sandbox_uid_count - 1
        uids = f"uids {config.sandbox_uid}-{last} (one per evaluation)"
    else:
        uids = f"uid {os.geteuid()} (the service's own)"
    if mode == "none":
        return f"none: SANDBOX=none, agent code runs unsandboxed as {uids}"
    kernel = f"{limits} memory+pids" if limits.startswith("cgroup") else "no cgroup (limits sampled by the monitor)"
    return f"{_bwrap_version()}, {kernel}, commands run as {uids}"


@functools.cache
def _bwrap_works() -> bool:
    from evaluations.runtime.sandbox import probe_bwrap

    return probe_bwrap()[0]


@functools.cache
def _bwrap_version() -> str:
    """``bubblewrap 0.8.0`` as ``bwrap --version`` says it here; ``bubblewrap`` when it cannot."""
    exe = shutil.which("bwrap")
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout if exe else ""
    except (OSError, subprocess.SubprocessError):
        version = ""
    return version.strip() or "bubblewrap"


def sandbox_warnings(mode: str, limits: str = "monitor") -> list[str]:
    """What is not enforced, given the sandbox the worker runs ("bwrap" or "none") and its limits
    ("cgroup v2", "cgroup v1" or "monitor")."""
    warnings = []
    if mode == "none":
        warnings.append(
            "commands run without bubblewrap: network isolation cannot be enforced (they share the host's "
            "network, with no egress proxy: EGRESS_ALLOW, EGRESS_DENY, TEST_NETWORK=off and AGENT_NETWORK=off "
            "do nothing), and they see the host's world-readable files and process list"
        )
    if limits == "monitor":
        warnings.append(
            "no cgroup: memory and process limits are only sampled by the monitor every MONITOR_INTERVAL_MS, "
            "so a burst allocation can run past MEMORY_LIMIT_MB before it is killed"
        )
    if os.geteuid() != 0:
        detail = (
            ": they can read the database, DATA_DIR and the service's environment, and signal its processes"
            if mode == "none"
            else ", which the kernel's process limit (RLIMIT_NPROC) shares with the service"
        )
        warnings.append(f"the service does not run as root, so every command runs as the service's own uid{detail}")
    return warnings


def log_startup_warnings() -> None:
    for warning in startup_warnings():
        logger.warning(warning)


@checks.register()
def executor_checks(app_configs, **kwargs):
    return [checks.Warning(text, id="term_executor.W001") for text in startup_warnings()]
