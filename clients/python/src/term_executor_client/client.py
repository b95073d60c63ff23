"""``Client``: the live-sandbox API of a term-executor service, synchronous (SPEC §24).

Every method is one request (``create_sandbox`` may add a few ``GET``s while a sandbox starts, and
``put_dir``/``get_dir`` a tar on this side). Answers are the service's JSON as dicts; a refusal is a
``TermExecutorError`` with the envelope's status, code and sentence.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from term_executor_client import _requests as api
from term_executor_client.archives import extract_tar, pack_folder
from term_executor_client.errors import TermExecutorError


class Client:
    """``Client(url, token)``; each defaults to ``TERM_EXECUTOR_URL`` / ``TERM_EXECUTOR_TOKEN``.

    ``timeout`` bounds each look (get, list, network); creating, deleting and files have 600 s, as
    the service's own bounds on them; ``exec`` its own ``timeout_secs`` plus a margin, or none.
    ``http_options`` go to ``httpx.Client`` (``verify=``, ``proxy=``). Use it as a context manager,
    or call ``close()``.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = api.DEFAULT_TIMEOUT_SECS,
        **http_options: Any,
    ):
        self.url, headers = api.base_settings(url, token)
        self._http = httpx.Client(headers=headers, timeout=timeout, **http_options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, request: api.Request) -> Any:
        url = self.url + request.path
        for _ in range(api.MAX_REDIRECTS + 1):
            response = self._http.request(request.method, url, **request.send_kwargs())
            url = api.redirect_target(response)
            if url is None:
                return api.read(request, response)
        raise TermExecutorError(307, "too_many_redirects", f"more than {api.MAX_REDIRECTS} redirects")

    # -- sandboxes -----------------------------------------------------

    def create_sandbox(
        self,
        spec: dict,
        context: bytes | str | os.PathLike | None = None,
        *,
        wait: bool = True,
        wait_secs: float = api.DEFAULT_CREATE_WAIT_SECS,
    ) -> dict:
        """``POST /sandboxes``: JSON, or multipart with ``context`` (tar bytes, a tar file or a folder).

        With ``wait`` a sandbox answered ``starting`` (202) is polled until ``ready``; ``failed``
        raises with its ``error_kind`` and ``error``, and so does a wait past ``wait_secs`` (the
        sandbox is then deleted, since the caller never learns its id).
        """
        info = self._send(api.create(spec, context))
        if wait and info.get("status") == "starting":
            try:
                info = self.wait_ready(info["sandbox_id"], wait_secs)
            except TermExecutorError as error:
                if error.error == "timeout":
                    self._delete_quietly(info["sandbox_id"])
                raise
        return info

    def wait_ready(self, sandbox_id: str, wait_secs: float = api.DEFAULT_CREATE_WAIT_SECS) -> dict:
        """Poll ``GET /sandboxes/{id}`` until the sandbox leaves ``starting``; its info once ``ready``."""
        deadline = time.monotonic() + wait_secs
        for delay in api.poll_delays():
            info = self.get_sandbox(sandbox_id)
            if api.settled(info):
                return info
            if time.monotonic() >= deadline:
                raise api.still_starting(sandbox_id, wait_secs)
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        raise AssertionError("poll_delays never ends")

    def sandbox(self, spec: dict, context: bytes | str | os.PathLike | None = None, **wait) -> Sandbox:
        """``create_sandbox`` as a ``Sandbox``: ``with client.sandbox(spec) as box: box.exec("ls")``."""
        return Sandbox(self, self.create_sandbox(spec, context, **wait))

    def get_sandbox(self, sandbox_id: str) -> dict:
        return self._send(api.get(sandbox_id))

    def list_sandboxes(self) -> list[dict]:
        return self._send(api.listing())

    def delete_sandbox(self, sandbox_id: str) -> None:
        """``DELETE /sandboxes/{id}``: every process stopped, everything freed."""
        self._send(api.delete(sandbox_id))

    def _delete_quietly(self, sandbox_id: str) -> None:
        try:
            self.delete_sandbox(sandbox_id)
        except (TermExecutorError, httpx.HTTPError):
            pass

    # -- inside one sandbox --------------------------------------------

    def exec(
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
        """Run ``command`` (a string for ``sh -c``, or an argv list); the service's
        ``{exit_code, stdout, stderr, timed_out, truncated, duration_ms, oom_killed}``."""
        request = api.execute(
            sandbox_id, command, cwd=cwd, env=env, timeout_secs=timeout_secs, user=user, service=service
        )
        return self._send(request)

    def put_file(self, sandbox_id: str, path: str, data: bytes, service: str | None = None) -> None:
        """Write ``data`` as the file ``path`` (absolute; missing parent folders made)."""
        self._send(api.put_file(sandbox_id, path, data, service))

    def put_dir(self, sandbox_id: str, path: str, local_folder: str | os.PathLike, service: str | None = None) -> None:
        """Copy the contents of ``local_folder`` into the folder ``path`` (made if missing), as one tar."""
        self._send(api.put_tar(sandbox_id, path, pack_folder(local_folder), service))

    def get_file(self, sandbox_id: str, path: str, service: str | None = None) -> bytes:
        """The bytes of the file ``path`` (a folder answers a tar of it: use ``get_dir``)."""
        return self._send(api.get_files(sandbox_id, path, service))

    def get_dir(
        self, sandbox_id: str, path: str, local_folder: str | os.PathLike, service: str | None = None
    ) -> list[str]:
        """Copy the contents of the folder ``path`` into ``local_folder`` (made if missing).

        Unpacked by ``archives.extract_tar``: nothing lands outside ``local_folder``, and no link
        kept there leads out of it. Returns the members refused, ``"name: why"``.
        """
        return extract_tar(self._send(api.get_files(sandbox_id, path, service)), local_folder)

    def set_network(self, sandbox_id: str, mode: str, allowed_hosts: list[str] | None = None) -> dict:
        """``PUT /sandboxes/{id}/network``: the egress policy of later connections."""
        return self._send(api.set_network(sandbox_id, mode, allowed_hosts))

    def stop_service(self, sandbox_id: str, service: str) -> None:
        """``POST /sandboxes/{id}/services/{service}/stop`` (``main`` or a compose service), as
        ``docker compose stop``: its processes killed, its files still readable, exec in it refused."""
        self._send(api.stop_service(sandbox_id, service))


class Sandbox:
    """One sandbox and its client: the same calls without the id. As a context manager it is
    deleted on exit."""

    def __init__(self, client: Client, info: dict):
        self.client = client
        self.info = info
        self.id: str = info["sandbox_id"]

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info) -> None:
        self.delete()

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, status={self.info.get('status')!r})"

    def refresh(self) -> dict:
        self.info = self.client.get_sandbox(self.id)
        return self.info

    def delete(self) -> None:
        self.client.delete_sandbox(self.id)

    def exec(self, command: str | list[str], **options) -> dict:
        return self.client.exec(self.id, command, **options)

    def put_file(self, path: str, data: bytes) -> None:
        self.client.put_file(self.id, path, data)

    def put_dir(self, path: str, local_folder: str | os.PathLike) -> None:
        self.client.put_dir(self.id, path, local_folder)

    def get_file(self, path: str) -> bytes:
        return self.client.get_file(self.id, path)

    def get_dir(self, path: str, local_folder: str | os.PathLike) -> list[str]:
        return self.client.get_dir(self.id, path, local_folder)

    def set_network(self, mode: str, allowed_hosts: list[str] | None = None) -> dict:
        return self.client.set_network(self.id, mode, allowed_hosts)

    def stop_service(self, service: str) -> None:
        self.client.stop_service(self.id, service)
