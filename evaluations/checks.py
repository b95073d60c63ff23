"""Start-up checks shown by `manage.py check`, migrate and the run commands."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core import checks

logger = logging.getLogger("term_executor")


def startup_warnings() -> list[str]:
    config = settings.EXECUTOR
    warnings = []
    if not config.auth_enabled:
        warnings.append(
            "AUTH_TOKEN and AUTH_TOKENS are unset: authentication is disabled, anyone who reaches the port can "
            "submit code"
        )
    return warnings


def sandbox_warnings(mode: str, limits: str = "monitor") -> list[str]:
    """What is not enforced, given the sandbox the worker runs ("bwrap" or "none") and its limits
    ("cgroup v2", "cgroup v1" or "monitor")."""
    import os

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
