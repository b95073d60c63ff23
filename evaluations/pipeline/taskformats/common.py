"""What the Harbor and Terminal-Bench readers share: the TaskSpec of an image task, a compose
file's single service, values as JSON holds them."""

from __future__ import annotations

import datetime
import math
import os
from pathlib import Path

from evaluations.pipeline.taskbase import TaskError, TaskSpec, load_yaml_mapping

_COMPOSE_NAMES = ("docker-compose.yaml", "docker-compose.yml")


def single_service(folder: Path, prefix: str) -> dict | None:
    """The single service of ``folder``'s docker-compose file as {file, name, service}, or None
    without one; several services are refused (a task runs in one container here)."""
    for name in _COMPOSE_NAMES:
        if not os.path.lexists(folder / name):
            continue
        shown = prefix + name
        data, _node = load_yaml_mapping(folder / name, shown)
        services = data.get("services")
        if not isinstance(services, dict) or not services:
            raise TaskError(f"{shown}: 'services' must be a mapping of service names to services")
        if len(services) > 1:
            names = ", ".join(sorted(str(service) for service in services))
            raise TaskError(f"{shown} has {len(services)} services ({names}); a task runs in one container here")
        ((service_name, service),) = services.items()
        if not isinstance(service, dict):
            raise TaskError(f"{shown}: service {service_name!r} must be a mapping")
        return {"file": shown, "name": str(service_name), "service": service}
    return None


def image_task(root: Path, **fields) -> TaskSpec:
    return TaskSpec(
        root=root,
        repo=None,  # the image's WorkingDir is the workspace (SPEC §16)
        base_commit=None,
        version=None,
        language=None,
        install=[],
        static_assets={},
        original_pr=None,
        cache=False,
        **fields,
    )


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def jsonable(value: object) -> object:
    """TOML and YAML values as JSON holds them: dates as ISO text, non-finite floats as text."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
