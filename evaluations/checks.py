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
        warnings.append("AUTH_TOKEN is unset: authentication is disabled, anyone who reaches the port can submit code")
    return warnings


def log_startup_warnings() -> None:
    for warning in startup_warnings():
        logger.warning(warning)


@checks.register()
def executor_checks(app_configs, **kwargs):
    return [checks.Warning(text, id="term_executor.W001") for text in startup_warnings()]
