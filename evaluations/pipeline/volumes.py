"""A compose file's volumes (SPEC §23), made one way for an evaluation (imageenv.py) and for a live
sandbox (sandboxes/host.py, SPEC §24).

1. A named volume is a folder of the session, ``volumes/<name>/``, so the disk quota counts it as the
   rest of the session: the evaluation's uid's (the user of every root's map) and writable by every id
   of the evaluation (0777: an image's User, a ``[verifier] user`` or a live sandbox's service user may
   be another id of its range). It starts empty (Docker's copy of the image's files at the target is
   not made).
2. Harbor's log folders in a service (``${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}``, and the same
   for AGENT_LOGS) are the session's own folders main has at /logs/agent and /logs/artifacts, which the
   caller makes (``log_folders``): a file a sidecar writes in its /logs/artifacts is in main's.
3. What each root binds: ``Volumes.main`` and ``Volumes.services[name]``, a ``Mount`` at each target,
   writable unless the entry says ``ro``; ``Volumes.logs``, the log folders a service binds, which main
   must have bound at their paths too (the pipeline binds them for every agent; a live sandbox only
   then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evaluations.models import ErrorKind
from evaluations.pipeline.context import StepFailed, make_session_folder
from evaluations.pipeline.session import Session
from evaluations.runtime import Mount
from evaluations.tasks.spec import Service, ServiceVolume

VOLUMES_DIR = "volumes"  # <session>/volumes/<name>: each named volume of the compose file


@dataclass(frozen=True)
class Volumes:
    main: tuple[Mount, ...]  # main's named volumes
    services: dict[str, tuple[Mount, ...]]  # each service's named volumes and Harbor's log folders
    logs: dict[str, Path]  # the log folders a service binds (/logs/agent, /logs/artifacts): main's own there


def make_volumes(
    session: Session,
    main: Sequence[ServiceVolume],
    services: Iterable[Service],
    log_folders: Callable[[], dict[str, Path]],
) -> Volumes | None:
    """The folders of ``main``'s and ``services``' volumes made in ``session``, and what each binds;
    None when none has a volume. ``log_folders``: the session's folders main has at /logs/agent and
    /logs/artifacts, made, by their path inside (called only when a service binds one). StepFailed
    (infrastructure) when a folder cannot be made."""
    services = tuple(services)
    if not main and not any(service.volumes for service in services):
        return None
    named = sorted({v.volume for holder in (main, *(s.volumes for s in services)) for v in holder if v.volume})
    parent = session.root / VOLUMES_DIR
    folders: dict[str, Path] = {}
    if named:
        # passed by every id, never listed
        make_session_folder(session, parent, 0o711, owner=session.root_passed, shown="the volumes' folder")
    for name in named:
        folders[name] = parent / name
        make_session_folder(session, folders[name], 0o777, owner=session.uid_owner, shown=f"volume {name!r}")
    wanted = {v.log_folder for service in services for v in service.volumes if v.log_folder is not None}
    logs = {}
    if wanted:
        try:
            logs = {inside: folder for inside, folder in log_folders().items() if inside in wanted}
        except OSError as exc:
            raise StepFailed(f"could not make the log folders: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None

    def mounts(volumes: Sequence[ServiceVolume]) -> tuple[Mount, ...]:
        return tuple(
            Mount(folders[v.volume] if v.volume is not None else logs[v.log_folder], v.target, writable=not v.read_only)
            for v in volumes
        )

    return Volumes(mounts(main), {service.name: mounts(service.volumes) for service in services}, logs)
