"""``AsyncClient``: ``Client``'s calls for asyncio, one for one (see client.py for each one's meaning).

Cancelling a call (``asyncio.wait_for`` around an ``exec``, as Harbor does) closes its connection;
the sandbox is not touched.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx

from term_executor_client import _requests as api
from term_executor_client.archives import extract_tar, pack_folder
from term_executor_client.errors import TermExecutorError


class AsyncClient:
    """``AsyncClient(url, token)``; each defaults to ``TERM_EXECUTOR_URL`` / ``TERM_EXECUTOR_TOKEN``.
    Use it with ``async with``, or ``await close()``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = api.DEFAULT_TIMEOUT_SECS,
        **http_options: Any,
    ):
        self.url, headers = api.base_settings(url, token)
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout, **http_options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, request: api.Request) -> Any:
        url = self.url + request.path
        for _ in range(api.MAX_REDIRECTS + 1):
            response = await self._http.request(request.method, url, **request.send_kwargs())
            url = api.redirect_target(response)
            if url is None:
                return api.read(request, response)
        raise TermExecutorError(307, "too_many_redirects", f"more than {api.MAX_REDIRECTS} redirects")

    # -- sandboxes -----------------------------------------------------

    async def create_sandbox(
        self,
        spec: dict,
        context: bytes | str | os.PathLike | None = None,
        *,
        wait: bool = True,
        wait_secs: float = api.DEFAULT_CREATE_WAIT_SECS,
    ) -> dict:
        request = await asyncio.to_thread(api.create, spec, context)  # packing a folder reads the disk
        info = await self._send(request)
        if wait and info.get("status") == "starting":
            try:
                info = await self.wait_ready(info["sandbox_id"], wait_secs)
            except TermExecutorError as error:
                if error.error == "timeout":
                    await self._delete_quietly(info["sandbox_id"])
                raise
        return info

    async def wait_ready(self, sandbox_id: str, wait_secs: float = api.DEFAULT_CREATE_WAIT_SECS) -> dict:
        deadline = time.monotonic() + wait_secs
        for delay in api.poll_delays():
            info = await self.get_sandbox(sandbox_id)
            if api.settled(info):
                return info
            if time.monotonic() >= deadline:
                raise api.still_starting(sandbox_id, wait_secs)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        raise AssertionError("poll_delays never ends")

    async def sandbox(self, spec: dict, context: bytes | str | os.PathLike | None = None, **wait) -> AsyncSandbox:
        return AsyncSandbox(self, await self.create_sandbox(spec, context, **wait))

    async def get_sandbox(self, sandbox_id: str) -> dict:
        return await self._send(api.get(sandbox_id))

    async def list_sandboxes(self) -> list[dict]:
        return await self._send(api.listing())

    async def delete_sandbox(self, sandbox_id: str) -> None:
        await self._send(api.delete(sandbox_id))

    async def _delete_quietly(self, sandbox_id: str) -> None:
        try:
            await self.delete_sandbox(sandbox_id)
        except (TermExecutorError, httpx.HTTPError):
            pass

    # -- inside one sandbox --------------------------------------------

    async def exec(
        self,
        sandbox_id: str,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_secs: float | None = None,
        user: str | int | None = None,
        service: str | None = None,
    ) -> dict:
        request = api.execute(
            sandbox_id, command, cwd=cwd, env=env, timeout_secs=timeout_secs, user=user, service=service
        )
        return await self._send(request)

    async def put_file(self, sandbox_id: str, path: str, data: bytes, service: str | None = None) -> None:
        await self._send(api.put_file(sandbox_id, path, data, service))

    async def put_dir(
        self, sandbox_id: str, path: str, local_folder: str | os.PathLike, service: str | None = None
    ) -> None:
        archive = await asyncio.to_thread(pack_folder, local_folder)
        await self._send(api.put_tar(sandbox_id, path, archive, service))

    async def get_file(self, sandbox_id: str, path: str, service: str | None = None) -> bytes:
        return await self._send(api.get_files(sandbox_id, path, service))

    async def get_dir(
        self, sandbox_id: str, path: str, local_folder: str | os.PathLike, service: str | None = None
    ) -> list[str]:
        archive = await self._send(api.get_files(sandbox_id, path, service))
        return await asyncio.to_thread(extract_tar, archive, local_folder)

    async def set_network(self, sandbox_id: str, mode: str, allowed_hosts: list[str] | None = None) -> dict:
        return await self._send(api.set_network(sandbox_id, mode, allowed_hosts))

    async def stop_service(self, sandbox_id: str, service: str) -> None:
        await self._send(api.stop_service(sandbox_id, service))


class AsyncSandbox:
    """One sandbox and its ``AsyncClient``; deleted on leaving ``async with``."""

    def __init__(self, client: AsyncClient, info: dict):
        self.client = client
        self.info = info
        self.id: str = info["sandbox_id"]

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.delete()

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, status={self.info.get('status')!r})"

    async def refresh(self) -> dict:
        self.info = await self.client.get_sandbox(self.id)
        return self.info

    async def delete(self) -> None:
        await self.client.delete_sandbox(self.id)

    async def exec(self, command: str | list[str], **options) -> dict:
        return await self.client.exec(self.id, command, **options)

    async def put_file(self, path: str, data: bytes) -> None:
        await self.client.put_file(self.id, path, data)

    async def put_dir(self, path: str, local_folder: str | os.PathLike) -> None:
        await self.client.put_dir(self.id, path, local_folder)

    async def get_file(self, path: str) -> bytes:
        return await self.client.get_file(self.id, path)

    async def get_dir(self, path: str, local_folder: str | os.PathLike) -> list[str]:
        return await self.client.get_dir(self.id, path, local_folder)

    async def set_network(self, mode: str, allowed_hosts: list[str] | None = None) -> dict:
        return await self.client.set_network(self.id, mode, allowed_hosts)

    async def stop_service(self, service: str) -> None:
        await self.client.stop_service(self.id, service)
