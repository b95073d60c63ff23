"""``TermExecutorEnvironment``: a Harbor environment (Harbor 0.25) whose container is a term-executor
live sandbox (SPEC §24)::

    harbor run -p TASK -a oracle -e term_executor_client.harbor:TermExecutorEnvironment \\
        --ek url=http://127.0.0.1:8000 --ek token=TOKEN

It does what Harbor's own docker/podman backend does, read from its code (harbor 0.25.0,
``environments/docker/docker.py`` and ``docker_unix.py``), through the API instead of ``docker
compose``:

1. ``start``: the task's ``environment/`` folder is the build context (``Dockerfile`` in it), or the
   task's ``docker_image`` when Harbor's own rule (``should_use_prebuilt_docker_image``) picks the
   image; the task's cpus, memory_mb and storage_mb are the sandbox's limits; its network policy
   the sandbox's first one; its ``env`` the sandbox's environment. Then ``/logs/agent``,
   ``/logs/verifier`` and ``/logs/artifacts`` are made (``mkdir -p`` and ``chmod 777`` as root, as
   Harbor's ``ensure_dirs``), and a prebuilt image's loose ``environment/`` files are uploaded.
2. ``exec``: ``bash -c COMMAND`` (docker's main service runs bash too); cwd the call's, else the
   task's ``workdir``, else the image's; env Harbor's ``_merge_env`` (task env < trial env < the
   call's < scoped overlays); user the call's, else ``default_user`` (the phase's agent or verifier
   user), else the image's. A command past ``timeout_sec`` raises ``RuntimeError`` as docker's does
   (the service has killed it and its children).
3. ``upload_dir`` copies a folder's contents into the target folder (one tar; files owned by root,
   as ``docker cp`` leaves them); ``download_dir`` the reverse, with the client's safe unpacking.
4. ``stop(delete=True)`` deletes the sandbox; ``stop(delete=False)`` (``--no-delete``) leaves it
   running for inspection (the service's idle timeout reaps it), as Daytona's backend does.
5. ``environment/docker-compose.yaml`` (SPEC §23-24): sent with the context as the spec's
   ``environment.compose``; the service starts every service of it besides ``main`` beside the
   sandbox, on main's loopback. ``service_exec`` runs ``sh -c COMMAND`` in a sidecar as docker's
   does (no main's workdir, user or variables), ``service_download_file``/``_dir`` read its files;
   ``stop_service`` stops one (``POST .../services/NAME/stop``, as ``docker compose stop NAME``: its
   processes killed, its files still readable), which Harbor's trial does to main before it collects
   the sidecars' evidence for a separate verifier. The compose file's volumes (named, and Harbor's log
   folders in a sidecar) are the service's: nothing to send for them.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import httpx
from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import (
    COMPOSE_FILE_NAME,
    DOCKERFILE_NAME,
    require_agent_environment_definition,
    should_use_prebuilt_docker_image,
)
from harbor.models.task.config import NetworkPolicy
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import EnvironmentPaths, TrialPaths

from term_executor_client.aio import AsyncClient
from term_executor_client.errors import TermExecutorError

ENVIRONMENT_TYPE = "term-executor"


class TermExecutorEnvironment(BaseEnvironment):
    """Harbor's constructor arguments, plus (from ``--ek``) ``url`` and ``token`` (else
    ``TERM_EXECUTOR_URL`` and ``TERM_EXECUTOR_TOKEN``), and optionally ``idle_timeout_secs`` and
    ``max_lifetime_secs`` for the sandbox."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: Any,
        *args: Any,
        url: str | None = None,
        token: str | int | None = None,
        idle_timeout_secs: int | None = None,
        max_lifetime_secs: int | None = None,
        **kwargs: Any,
    ):
        # --ek values arrive parsed as JSON: a token of digits is an int.
        self._client = AsyncClient(None if url is None else str(url), None if token is None else str(token))
        self._lifetimes = {
            name: int(value)
            for name, value in (("idle_timeout_secs", idle_timeout_secs), ("max_lifetime_secs", max_lifetime_secs))
            if value is not None
        }
        self._sandbox_id: str | None = None
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config, *args, **kwargs)
        if self._host_mounts:
            raise ValueError(
                "term-executor cannot bind folders of this machine into a sandbox: remove the environment's mounts"
            )

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def sandbox_id(self) -> str | None:
        return self._sandbox_id

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # Limits are cgroup ceilings (cpu.max, memory.max); nothing is reserved ahead.
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # Every connection leaves through the egress proxy, which applies the sandbox's policy
        # (names, *.domain, IPv4 and IPv6 addresses and networks) and can be changed at any time (PUT /network).
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv6_cidrs=True,
            dynamic_network_policy=True,
            docker_compose=True,  # environment/docker-compose.yaml's services, beside main (SPEC §23-24)
        )

    @property
    def _uses_compose(self) -> bool:
        return (self.environment_dir / COMPOSE_FILE_NAME).exists()

    def _validate_definition(self) -> None:
        if self.extra_docker_compose_paths:
            raise ValueError(
                "term-executor runs the task's environment/docker-compose.yaml only: "
                "--extra-docker-compose files are not sent to the service"
            )
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    # -- life ----------------------------------------------------------

    def _create_spec(self, force_build: bool) -> dict:
        config = self.task_env_config
        prebuilt = should_use_prebuilt_docker_image(
            self.environment_dir, docker_image=config.docker_image, force_build=force_build
        )
        environment: dict[str, str] = {"image": config.docker_image} if prebuilt else {"dockerfile": DOCKERFILE_NAME}
        if self._uses_compose:
            environment["compose"] = COMPOSE_FILE_NAME  # in the context: environment/ is sent with it
        spec: dict[str, Any] = {
            "environment": environment,
            "network": _network(self.network_policy),
            **self._lifetimes,
        }
        limits = {
            "cpus": self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT),
            "memory_mb": self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT),
            "storage_mb": self._effective_storage_mb,
            "workdir": config.workdir,
            "env": self._startup_env() or None,
        }
        spec.update({name: value for name, value in limits.items() if value is not None})
        return spec

    async def start(self, force_build: bool) -> None:
        spec = self._create_spec(force_build)
        sent = spec["environment"]
        context = self.environment_dir if "dockerfile" in sent or "compose" in sent else None
        try:
            info = await self._client.create_sandbox(spec, context, wait=False)
            self._sandbox_id = info["sandbox_id"]  # known before the wait, so stop() can delete it
            self.logger.debug(f"term-executor sandbox {self._sandbox_id} is {info.get('status')}")
            if info.get("status") == "starting":
                await self._client.wait_ready(self._sandbox_id, self.task_env_config.build_timeout_sec)
        except TermExecutorError as error:
            if error.error == "task_invalid":  # a Dockerfile that does not build: retrying cannot help
                raise SandboxBuildFailedError(str(error)) from error
            raise
        paths = EnvironmentPaths.for_os(self.os)
        log_dirs = [*self._mount_targets(writable_only=True), paths.agent_dir, paths.verifier_dir, paths.artifacts_dir]
        await self.ensure_dirs(list(dict.fromkeys(str(path) for path in log_dirs)))
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        try:
            if self._sandbox_id is None:
                return
            if not delete:
                self.logger.info(f"keeping term-executor sandbox {self._sandbox_id} (delete=False)")
                return
            try:
                await self._client.delete_sandbox(self._sandbox_id)
            except TermExecutorError as error:
                if error.status not in (404, 410):  # already gone: nothing to free
                    self.logger.warning(f"deleting sandbox {self._sandbox_id} failed: {error}")
            except httpx.HTTPError as error:  # as docker's stop: warn, the trial's result stands
                self.logger.warning(f"deleting sandbox {self._sandbox_id} failed: {error!r}")
            self._sandbox_id = None
        finally:
            await self._client.close()

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        policy = _network(network_policy)
        await self._client.set_network(self._started(), policy["mode"], policy["allowed_hosts"])

    def _started(self) -> str:
        if self._sandbox_id is None:
            raise RuntimeError("the term-executor sandbox is not started: call start() first")
        return self._sandbox_id

    # -- commands and files --------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        result = await self._client.exec(
            self._started(),
            ["bash", "-c", command],
            cwd=cwd or self.task_env_config.workdir,
            env=self._merge_env(env),
            timeout_secs=timeout_sec or None,  # docker's rule: 0 is no timeout
            user=self._resolve_user(user),
        )
        if result.get("timed_out"):
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        if result.get("oom_killed"):
            self.logger.warning(f"a command was killed for memory in sandbox {self._sandbox_id}: {command[:200]}")
        return ExecResult(stdout=result.get("stdout"), stderr=result.get("stderr"), return_code=result["exit_code"])

    async def service_exec(
        self,
        command: str,
        *,
        service: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self.is_main_service(service):
            return await self.exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        # As docker's: ``sh -c`` (a sidecar's image may lack bash), none of main's workdir, user or variables.
        result = await self._client.exec(
            self._started(),
            ["sh", "-c", command],
            cwd=cwd,
            env=env or None,
            timeout_secs=timeout_sec or None,
            user=user,
            service=service,
        )
        if result.get("timed_out"):
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=result.get("stdout"), stderr=result.get("stderr"), return_code=result["exit_code"])

    async def service_download_file(
        self, source_path: str, target_path: Path | str, *, service: str | None = None
    ) -> None:
        if self.is_main_service(service):
            await self.download_file(source_path, target_path)
            return
        await self._download_file(source_path, target_path, service)

    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        if self.is_main_service(service):
            await self.download_dir(source_dir, target_dir)
            return
        await self._download_dir(source_dir, target_dir, service)

    async def stop_service(self, service: str) -> None:
        await self._client.stop_service(self._started(), service)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        if target_path.endswith("/"):
            target_path += Path(source_path).name
        await self._client.put_file(self._started(), target_path, Path(source_path).read_bytes())

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._client.put_dir(self._started(), str(PurePosixPath(target_dir)), source_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._download_file(source_path, target_path, None)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._download_dir(source_dir, target_dir, None)

    async def _download_file(self, source_path: str, target_path: Path | str, service: str | None) -> None:
        data = await self._client.get_file(self._started(), source_path, service)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def _download_dir(self, source_dir: str, target_dir: Path | str, service: str | None) -> None:
        refused = await self._client.get_dir(self._started(), source_dir, target_dir, service)
        where = "" if service is None else f" (service {service})"
        for line in refused:
            self.logger.warning(f"not copied from {source_dir}{where}: {line}")


def _network(policy: NetworkPolicy) -> dict:
    """Harbor's ``NetworkPolicy`` as the API's ``network``: the modes have the same names."""
    return {"mode": policy.network_mode.value, "allowed_hosts": list(policy.allowed_hosts)}
