"""What a live sandbox's requests go to (SPEC §24): main, or one of its compose services (a
``Sidecar``, SPEC §23), and what both use: how the sandbox ends (``Ending``), a request for a
service it does not have (``UnknownService``), the user lookup in a root, the relay's variables,
mount points for binds and a root's folder in the session."""

from __future__ import annotations

import itertools
from pathlib import Path

from evaluations.environments import BadEnvironment, kinds
from evaluations.environments.toolchains import CA_VARIABLES, host_ca
from evaluations.images import rootfs
from evaluations.images.errors import ImageError
from evaluations.models import ErrorKind, SandboxStatus
from evaluations.network.egress.relay import direct, proxy_env
from evaluations.pipeline.services import service_env, user_home
from evaluations.pipeline.session import Session
from evaluations.runtime import Mount
from evaluations.runtime.initchannel import InitChannel
from evaluations.sandboxes.spec import SpecError
from evaluations.tasks.compose import MAIN
from evaluations.tasks.spec import Service

READY_WAIT_SECS = 60  # the init's first word, once the root is mounted: bwrap and a fork
INTERNAL_EXECS = 1 << 30  # a service's own execs (its healthcheck) are numbered from here, apart from the API's


class Ending(Exception):
    """How the sandbox ends: its final status, error and error_kind."""

    def __init__(self, status: str, error: str = "", kind: str | None = None):
        super().__init__(error)
        self.status, self.error, self.kind = status, error, kind


class UnknownService(Exception):
    """A request's ``service`` that is neither main nor one of the sandbox's compose services."""

    def __init__(self, sandbox_id: str, name, names: list[str]):
        super().__init__(f"sandbox {sandbox_id} has no service {name!r} (its services: {', '.join(names)})")

    def answer(self) -> dict:
        return {"status": 404, "error": "not_found", "detail": str(self)}


class Sidecar:
    """A compose service of a live sandbox (SPEC §23-24): its own root (``services/<name>/`` of the
    session), its own bubblewrap around our init, in main's network namespace; an exec or a file
    request naming it goes there as main's go to main, as its compose ``user`` (else its image's
    User), from its ``working_dir``, with Docker's variables and the egress proxy's."""

    def __init__(self, service: Service, root, image_config: dict, config):
        self.name = service.name
        self.service = service
        self.root = root
        self.image_config = image_config
        self.workdir = service.workdir or image_config.get("WorkingDir") or "/"
        self.default_user = service.user or image_config.get("User") or "root"
        self.users: dict[str, tuple[int, int, str]] = {}
        self.channel: InitChannel | None = None
        self.process = None  # its sandbox (runtime.background.Background), once started
        self.first_exit: int | None = None  # its first process's exit code, once it ended
        self.stopped = False  # stopped alone (``stop_service``): its root still read and written
        self.healthy = False
        self.internal = itertools.count(INTERNAL_EXECS)
        ca = host_ca(config, sandboxed=True)
        self._extra = dict.fromkeys(CA_VARIABLES, ca.sandbox) if ca is not None else {}
        self.names: list[str] = []  # main's and every service's, straight, not through the proxy
        self.binds: tuple[Mount, ...] = ()  # its compose volumes and Harbor's log folders (``_prepare_volumes``)

    def user(self, name: str) -> tuple[int, int, str]:
        return resolve_user(self.root, name, self.users)

    def command_env(self, home: str) -> dict[str, str]:
        return {**relay_env(self.names), **self._extra, **service_env(self.service, self.image_config, home)}

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.process is not None:
            self.process.stop()


def relay_env(names: list[str]) -> dict[str, str]:
    """The egress relay's variables, the compose services' names reached straight (as the
    evaluations' commands have them, pipeline/context.py): they are on the shared loopback."""
    return {**proxy_env(), **(direct([MAIN, *names]) if names else {})}


def resolve_user(root, name: str, cache: dict) -> tuple[int, int, str]:
    """(uid, gid, home) inside ``root`` for a user name or uid, from the image's /etc/passwd."""
    found = cache.get(name)
    if found is not None:
        return found
    try:
        uid, gid = rootfs.resolve_user(root.rootfs, name)
    except ImageError as exc:
        raise SpecError("user", str(exc)) from None
    home = user_home(root.rootfs, uid, "/root" if uid == 0 else "/")
    cache[name] = found = (uid, gid, home or "/")
    return found


def mount_points(root, binds: tuple[Mount, ...], shown: str) -> tuple[Mount, ...]:
    """``binds`` on real folders of ``root`` made now, as an evaluation's (kinds.mount_points)."""
    try:
        return kinds.mount_points(root, binds, shown)
    except BadEnvironment as exc:
        raise Ending(SandboxStatus.FAILED, str(exc), ErrorKind.INFRASTRUCTURE) from None


def root_folder(session: Session, folder: Path, mode: int) -> None:
    """A folder of the session for a service's root: root's, its group the lease's (0710: the
    sandbox passes to the root, nobody lists it; 0711 for the folder of them all)."""
    try:
        session.make_folder(folder, mode, owner=session.root_passed)
    except OSError as exc:
        raise Ending(SandboxStatus.FAILED, f"could not make {folder.name}/: {exc}", ErrorKind.INFRASTRUCTURE) from None
