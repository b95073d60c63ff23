"""A live sandbox's compose services (SPEC §23-24), the part of ``LiveSandbox`` (host.py) that
prepares, starts, checks and stops them: each service's image pulled or built and its root mounted
in ``services/<name>/``, one network namespace for them and main, the compose file's volumes
(pipeline/volumes.py, as an evaluation's), each service a bubblewrap of its own around our init in
``depends_on`` order with its healthcheck awaited, and one service stopped alone (Harbor's
``stop_service``)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from django.db import connections

from evaluations import lifecycle, livelog
from evaluations.environments import kinds
from evaluations.environments.toolchains import host_ca
from evaluations.images import rootfs
from evaluations.images.errors import ImageError
from evaluations.images.store import ImageStore
from evaluations.models import ErrorKind, SandboxStatus
from evaluations.pipeline.context import StepFailed
from evaluations.pipeline.services import SERVICES_DIR, check_until_healthy, service_argv, write_hosts
from evaluations.pipeline.volumes import make_volumes
from evaluations.runtime import Mount, SandboxPolicy, initbin
from evaluations.runtime.idmap import image_id_base
from evaluations.runtime.initchannel import InitChannel
from evaluations.runtime.monitor import Monitor
from evaluations.runtime.netns import NetworkUnavailable, SharedNetwork
from evaluations.runtime.sandbox import SYSTEM_PATH
from evaluations.runtime.types import CommandResult, Limit
from evaluations.sandboxes.boxes import READY_WAIT_SECS, Ending, Sidecar, UnknownService, mount_points, root_folder
from evaluations.sandboxes.spec import SpecError
from evaluations.tasks.compose import MAIN
from evaluations.tasks.spec import AGENT_LOGS, ARTIFACTS_DIR, Service

logger = logging.getLogger("term_executor.sandboxes")


class ComposeServices:
    """``LiveSandbox``'s compose services: its ``sidecars`` (name -> Sidecar, in start order), made
    by ``_prepare_sidecars`` and ``_prepare_volumes``, started by ``_start_sidecars``."""

    def _take_services(self, services: tuple[Service, ...], main_volumes, task_root: Path) -> None:
        """The compose file's services besides main, started beside it (``_start_sidecars``), and the
        volumes main binds (``_prepare_volumes``)."""
        self.compose, self.main_volumes, self.task_root = tuple(services), tuple(main_volumes), task_root

    def _prepare_sidecars(self, store: ImageStore) -> list[dict]:
        """SPEC §23-24: each compose service's image pulled or built as main's is, pinned, and its root
        mounted in ``services/<name>/`` of the session (as main's, root in name only); every root's
        /etc/hosts naming main and each service at 127.0.0.1; the network namespace they will share."""
        config, uid = self.config, self.lease.uid
        try:
            self.netns = SharedNetwork.create()
        except NetworkUnavailable as exc:
            raise Ending(SandboxStatus.FAILED, str(exc), ErrorKind.INFRASTRUCTURE) from None
        self.closing.callback(self.netns.close)
        parent = self.session.root / SERVICES_DIR
        root_folder(self.session, parent, 0o711)
        ca = host_ca(config, sandboxed=True)
        records = []
        for service in self.compose:
            shown = f"service {service.name!r}"
            try:
                result = self._pull_or_build(service.environment, self.task_root, store)
            except ImageError as exc:
                raise Ending(SandboxStatus.FAILED, f"{shown}'s image: {exc}", exc.kind) from None
            self.closing.enter_context(store.pin(result.record.digest, f"{self.tag}.{service.name}"))
            image_config = dict(result.record.config or {})
            folder = parent / service.name
            root_folder(self.session, folder, 0o710)
            try:
                root = kinds.mount_image(
                    store,
                    result.record,
                    folder,
                    lease=uid,
                    id_base=image_id_base(config.image_uid_base, uid, config.sandbox_uid),
                    workdir=service.workdir or image_config.get("WorkingDir") or "/",
                    ca_host=ca.host if ca is not None else None,
                    as_root=True,
                )
            finally:
                self.closing.callback(rootfs.unmount_root, folder)
            sidecar = self.sidecars[service.name] = Sidecar(service, root, image_config, config)
            try:
                sidecar.user(sidecar.default_user)
            except SpecError as exc:
                raise Ending(
                    SandboxStatus.FAILED, f"environment/docker-compose.yaml: {shown}: {exc}", ErrorKind.TASK_INVALID
                ) from None
            kind = "image" if service.environment.image is not None else "dockerfile"
            records.append(
                {
                    "name": service.name,
                    "kind": kind,
                    "ref": service.environment.ref,
                    "digest": result.record.digest,
                    "cached": result.cached,
                    "state": "starting",
                }
            )
        names = [MAIN, *self.sidecars]
        for sidecar in self.sidecars.values():
            sidecar.names = [*self.sidecars]
        for root in (self.root, *(sidecar.root for sidecar in self.sidecars.values())):
            try:
                write_hosts(root, names)
            except StepFailed as exc:
                raise Ending(SandboxStatus.FAILED, str(exc), exc.kind) from None
        return records

    def _prepare_volumes(self) -> None:
        """SPEC §23-24: the compose file's named volumes, folders of the session (pipeline/volumes.py, as
        an evaluation's), bound in main and in each service naming them; a service's Harbor log folders
        (``${HOST_ARTIFACTS_PATH}:${ENV_ARTIFACTS_PATH}``) the session's folders then bound at main's
        /logs/agent and /logs/artifacts too, so what the service writes there is in main's."""

        def log_folders() -> dict[str, Path]:
            # 0777 as Harbor's client makes them (ensure_dirs): a service's user is any id of the range
            folders = {AGENT_LOGS: self.session.agent_logs, ARTIFACTS_DIR: self.session.agent_artifacts}
            for folder in folders.values():
                self.session.make_folder(folder, 0o777, owner=self.session.uid_owner)
            return folders

        try:
            made = make_volumes(self.session, self.main_volumes, self.compose, log_folders)
        except StepFailed as exc:
            raise Ending(SandboxStatus.FAILED, str(exc), exc.kind) from None
        if made is None:
            return
        self.binds = (*made.main, *(Mount(folder, inside, writable=True) for inside, folder in made.logs.items()))
        for name, sidecar in self.sidecars.items():
            sidecar.binds = made.services[name]

    # -- a compose file's services (SPEC §23-24) ----------------------------------------------

    def _start_sidecars(self) -> None:
        """Each service in ``depends_on`` order, after what it waits for (``service_healthy``: its
        check passed), then every health check, as ``docker compose up --wait``: a service that never
        becomes healthy, or ends before it does, fails the sandbox (``task_invalid``)."""
        for sidecar in self.sidecars.values():  # in start order (tasks/compose.py)
            for other, condition in sidecar.service.depends_on.items():
                if condition == "service_healthy" and other in self.sidecars:
                    self._await_healthy(self.sidecars[other])
            self._start_sidecar(sidecar)
        for sidecar in self.sidecars.values():
            self._await_healthy(sidecar)

    def _start_sidecar(self, sidecar: Sidecar) -> None:
        """Its sandbox: bubblewrap around our init, as main's, beside it (``Spawner.background``: the
        sandbox's uid, cgroup, tag and kill), in main's network namespace, with no egress socket of its
        own (main's relay on the shared 127.0.0.1 carries its connections through the sandbox's proxy);
        then its first process (its compose ``command``/``entrypoint``) as its exec 0."""
        shown = f"service {sidecar.name!r}"
        try:
            argv = service_argv(sidecar.service, sidecar.image_config)
        except StepFailed as exc:
            raise Ending(SandboxStatus.FAILED, str(exc), ErrorKind.TASK_INVALID) from None
        ca = host_ca(self.config, sandboxed=True)
        policy = SandboxPolicy(
            image=sidecar.root,
            image_tmp=True,
            mounts=mount_points(sidecar.root, sidecar.binds, shown),
            ca_bundle=ca.host if ca is not None else None,
            netns=self.netns.path,
        )
        sidecar.channel = InitChannel()
        binary = initbin.open_binary(self.config.workspace_base)
        try:
            sidecar.process = self.spawner.background(
                f"{self.tag}.{sidecar.name}",
                [initbin.exec_path(binary), str(sidecar.channel.init_fd)],  # main's relay listens already
                cwd=Path("/"),
                env={"PATH": SYSTEM_PATH},
                limits=self.limits,
                policy=policy,
                pass_fds=(sidecar.channel.init_fd, binary),
            )
        finally:
            os.close(binary)
        self.closing.callback(sidecar.stop)  # before its root's unmount (closing runs last first)
        if not sidecar.channel.wait_ready(READY_WAIT_SECS) or sidecar.channel.closed:
            output = sidecar.process.output().strip().splitlines()
            raise Ending(
                SandboxStatus.FAILED,
                f"{shown} did not start" + (f": {output[-1][:300]}" if output else ""),
                ErrorKind.INFRASTRUCTURE,
            )
        self._set_state(sidecar, "running")
        if argv is not None:
            self._run_first(sidecar, argv, sidecar.default_user, shown)

    def _await_healthy(self, sidecar: Sidecar) -> None:
        """The service's compose healthcheck passed (once; nothing without one), Docker's timing, each
        check an exec of its own in the service (``check_until_healthy``, the evaluations' loop)."""
        healthcheck = sidecar.service.healthcheck
        if healthcheck is None or sidecar.healthy:
            return
        shown = f"service {sidecar.name!r}"
        request = {"command": list(healthcheck.run_argv), "service": sidecar.name}

        def check() -> CommandResult:
            argv, cwd, env, _timeout, user, _box = self._exec_request(request)
            started = time.monotonic()
            outcome = self._run_exec(next(sidecar.internal), argv, cwd, env, healthcheck.timeout_sec, user, sidecar)
            if "status" in outcome:
                raise Ending(SandboxStatus.FAILED, f"{shown}: {outcome['detail']}", ErrorKind.INFRASTRUCTURE)
            output = outcome["stdout"] + outcome["stderr"]
            return CommandResult(
                outcome["exit_code"],
                output,
                len(output),
                int((time.monotonic() - started) * 1000),
                Limit.TIMEOUT if outcome["timed_out"] else None,
            )

        def wait(seconds: float) -> None:
            if self.cancel.wait(seconds) or self.ending is not None:
                raise Ending(SandboxStatus.STOPPED)

        def ended() -> str | None:
            if sidecar.channel.closed:
                return "its sandbox ended"
            code = sidecar.first_exit
            return None if code is None else f"its process exited with code {code}"

        try:
            check_until_healthy(healthcheck, check, wait, shown, wait_first=True, ended=ended)
        except StepFailed as exc:
            raise Ending(SandboxStatus.FAILED, str(exc), exc.kind) from None
        sidecar.healthy = True
        with contextlib.suppress(OSError):
            livelog.append_text(self.session.log, f"{shown}: healthy\n")

    def _set_state(self, sidecar: Sidecar, state: str, exit_code: int | None = None) -> None:
        """A service's state in the row's ``environment`` (GET /sandboxes/{id} lists them)."""
        with self.environment_lock:  # a write of the whole record, never one made of an older copy
            for record in self.environment.get("services", ()):
                if record["name"] == sidecar.name:
                    record["state"] = state
                    if exit_code is not None:
                        record["exit_code"] = exit_code
            if self.environment.get("services"):
                lifecycle.sandbox_environment(self.id, self.environment)

    # -- one service stopped (Harbor's stop_service) ------------------------------------------

    def stop_service(self, header: dict) -> dict:
        """``docker compose stop NAME`` (Harbor's ``stop_service``, which its trial calls for main
        before it collects the sidecars' evidence): every process of that service killed with its pid
        namespace (its init's socket closed: the init exits, and bubblewrap ends the namespace); its
        root stays mounted, so its files can still be read (and written, as ``docker cp`` to a
        stopped container); exec in it is refused (409); the rest of the sandbox runs on. Stopping a
        stopped service does nothing, as Docker's."""
        try:
            box = self.box(header)
        except UnknownService as exc:
            return exc.answer()
        with self._lock:
            if box.stopped:
                return {"status": 204}
            box.stopped = True
        logger.info("sandbox %s: stopping service %s", self.id, box.name)
        if box is self:
            self.channel.close()  # main's init exits: its pid namespace ends (its egress relay too)
            self._init_thread.join(timeout=60)
            self._watch_without_main()
            with self.environment_lock:
                self.environment["state"] = "stopped"
                lifecycle.sandbox_environment(self.id, self.environment)
            connections.close_all()  # this thread's
        else:
            box.stop()
            self._set_state(box, "stopped")
            connections.close_all()
        with contextlib.suppress(OSError):
            livelog.append_text(self.session.log, f"service {box.name!r}: stopped\n")
        return {"status": 204}

    def _watch_without_main(self) -> None:
        """Main's sandbox was the spawner's command, whose monitor watched the whole sandbox; with main
        stopped, the same watch (runtime/monitor.py: the session's disk and files, the cgroup's memory
        and processes) goes on over what is left (its services, its volumes) until the sandbox ends: a
        limit crossed ends it, as before."""
        monitor = Monitor(
            limits=self.limits,
            session_dir=self.session.root,
            cancel_event=None,
            started_at=time.monotonic(),
            on_verdict=lambda verdict: self.end(Ending(SandboxStatus.FAILED, verdict.detail, ErrorKind.LIMIT_EXCEEDED)),
            cgroup=self.spawner.cgroup,
        )
        monitor.start()
        self.closing.callback(monitor.stop)
