"""What each call of the API sends and what it expects back: data, no I/O.

``Client`` and ``AsyncClient`` differ only in how they send a ``Request``; everything else (paths,
bodies, timeouts, reading the answer, the wait for a starting sandbox) is written here once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urljoin, urlsplit

import httpx

from term_executor_client.archives import pack_folder
from term_executor_client.errors import TermExecutorError

DEFAULT_TIMEOUT_SECS = 60.0
# Creating (the service holds its answer up to SANDBOX_CREATE_WAIT_SECS), deleting (it waits for the
# sandbox's teardown, up to 180 s) and moving files (up to 600 s) may take longer than a look.
SLOW_TIMEOUT_SECS = 600.0
# An exec's answer comes after its command ends or is killed at ``timeout_secs``; the reader waits
# this much longer for the kill and the answer.
EXEC_ANSWER_MARGIN_SECS = 30.0
DEFAULT_CREATE_WAIT_SECS = 600.0
MAX_REDIRECTS = 5
NETWORK_MODES = ("public", "no-network", "allowlist")

Expect = Literal["json", "bytes", "nothing"]  # "nothing": any body of a 2xx is ignored


@dataclass
class Request:
    method: str
    path: str
    expect: Expect = "json"
    params: dict[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    data: dict[str, str] | None = None
    files: dict[str, tuple[str, bytes, str]] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: Any = httpx.USE_CLIENT_DEFAULT  # or seconds, or None for no bound

    def send_kwargs(self) -> dict[str, Any]:
        """httpx's ``request()`` arguments. The body is bytes every time, so a 307 can send it again;
        ``params`` too, merged into a Location's own query (same keys, same values)."""
        kwargs: dict[str, Any] = {"params": self.params, "headers": self.headers, "timeout": self.timeout}
        for name in ("json", "content", "data", "files"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs


def base_settings(url: str | None, token: str | None) -> tuple[str, dict[str, str]]:
    """The service's URL (without a trailing ``/``) and the headers every request carries."""
    url = url or os.environ.get("TERM_EXECUTOR_URL")
    token = token if token is not None else os.environ.get("TERM_EXECUTOR_TOKEN")
    if not url:
        raise ValueError("no service URL: pass url= or set TERM_EXECUTOR_URL (e.g. http://127.0.0.1:8000)")
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"the service URL must be http:// or https://, not {url!r}")
    headers = {"Accept": "application/json", "User-Agent": "term-executor-client"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return url.rstrip("/"), headers


def redirect_target(response: httpx.Response) -> str | None:
    """Where a 307/308 sends the request again, or None for any other answer.

    A sandbox lives on the host that made it; another host of the fleet answers 307 to that host's
    URL. httpx's own ``follow_redirects`` re-sends method and body for 307, but drops the
    Authorization header when the origin changes, which every fleet redirect does (another host or
    port), so the clients follow these themselves with the same headers.
    """
    if response.status_code not in (307, 308):
        return None
    location = response.headers.get("location")
    if not location:
        raise TermExecutorError(response.status_code, "bad_redirect", "a redirect without a Location header")
    target = urljoin(str(response.request.url), location)
    if urlsplit(target).scheme not in ("http", "https"):
        raise TermExecutorError(response.status_code, "bad_redirect", f"a redirect to {target!r}")
    return target


def read(request: Request, response: httpx.Response) -> Any:
    """The answer's JSON or bytes, or ``TermExecutorError`` from its envelope."""
    if not 200 <= response.status_code < 300:
        raise TermExecutorError.from_response(response.status_code, response.content)
    if request.expect == "nothing":
        return None
    if request.expect == "bytes":
        return response.content
    try:
        return response.json()
    except ValueError:
        raise TermExecutorError(response.status_code, "bad_answer", "the service's answer is not JSON") from None


def _sandbox(sandbox_id: str, tail: str = "") -> str:
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise ValueError(f"a sandbox id is a non-empty string, not {sandbox_id!r}")
    return f"/sandboxes/{quote(sandbox_id, safe='')}{tail}"


def _absolute(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"a path in a sandbox is absolute, not {path!r}")
    return path


def _context_bytes(context: bytes | str | os.PathLike) -> bytes:
    """A build context as a tar: bytes as given (a tar, gzip allowed), a folder packed, a file read."""
    if isinstance(context, bytes | bytearray):
        return bytes(context)
    path = Path(context)
    if path.is_dir():
        return pack_folder(path, compress=True)
    if path.is_file():
        return path.read_bytes()
    raise FileNotFoundError(f"no build context at {path}: give a folder, a tar file or bytes")


def create(spec: dict, context: bytes | str | os.PathLike | None) -> Request:
    if not isinstance(spec, dict):
        raise TypeError(f"the sandbox spec is a dict, not {type(spec).__name__}")
    if context is None:
        return Request("POST", "/sandboxes", json=spec, timeout=SLOW_TIMEOUT_SECS)
    archive = _context_bytes(context)
    return Request(
        "POST",
        "/sandboxes",
        data={"spec": json.dumps(spec)},
        files={"context": ("context.tar", archive, "application/x-tar")},
        timeout=SLOW_TIMEOUT_SECS,
    )


def get(sandbox_id: str) -> Request:
    return Request("GET", _sandbox(sandbox_id))


def listing() -> Request:
    return Request("GET", "/sandboxes")


def delete(sandbox_id: str) -> Request:
    return Request("DELETE", _sandbox(sandbox_id), expect="nothing", timeout=SLOW_TIMEOUT_SECS)


def execute(
    sandbox_id: str,
    command: str | list[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    timeout_secs: float | None = None,
    user: str | int | None = None,
    service: str | None = None,
) -> Request:
    if isinstance(command, list):
        if not command or not all(isinstance(arg, str) for arg in command):
            raise ValueError("an argv command is a non-empty list of strings")
    elif not isinstance(command, str):
        raise TypeError(f"a command is a string (for sh -c) or a list of strings, not {type(command).__name__}")
    if timeout_secs is not None and not timeout_secs > 0:
        raise ValueError(f"timeout_secs must be positive, not {timeout_secs!r}")
    body: dict[str, Any] = {"command": command}
    for name, value in (
        ("cwd", cwd),
        ("env", env),
        ("timeout_secs", timeout_secs),
        ("user", user),
        ("service", service),
    ):
        if value is not None:
            body[name] = value
    # No timeout_secs: the command may run as long as the service lets it; so may the reader.
    reader = None if timeout_secs is None else timeout_secs + EXEC_ANSWER_MARGIN_SECS
    return Request("POST", _sandbox(sandbox_id, "/exec"), json=body, timeout=reader)


def _where(path: str, service: str | None, **more: str) -> dict[str, str]:
    """A files request's query: the path, and the compose service it is in (None: main)."""
    return {"path": _absolute(path), **more, **({"service": service} if service is not None else {})}


def put_file(sandbox_id: str, path: str, data: bytes, service: str | None = None) -> Request:
    if not isinstance(data, bytes | bytearray):
        raise TypeError(f"a file's content is bytes, not {type(data).__name__}")
    return Request(
        "PUT",
        _sandbox(sandbox_id, "/files"),
        expect="nothing",
        params=_where(path, service),
        content=bytes(data),
        headers={"Content-Type": "application/octet-stream"},
        timeout=SLOW_TIMEOUT_SECS,
    )


def put_tar(sandbox_id: str, path: str, archive: bytes, service: str | None = None) -> Request:
    return Request(
        "PUT",
        _sandbox(sandbox_id, "/files"),
        expect="nothing",
        params=_where(path, service, extract="tar"),
        content=archive,
        headers={"Content-Type": "application/x-tar"},
        timeout=SLOW_TIMEOUT_SECS,
    )


def get_files(sandbox_id: str, path: str, service: str | None = None) -> Request:
    return Request(
        "GET",
        _sandbox(sandbox_id, "/files"),
        params=_where(path, service),
        expect="bytes",
        timeout=SLOW_TIMEOUT_SECS,
    )


def stop_service(sandbox_id: str, service: str) -> Request:
    if not isinstance(service, str) or not service:
        raise ValueError(f"a service is named by a non-empty string, not {service!r}")
    path = _sandbox(sandbox_id, f"/services/{quote(service, safe='')}/stop")
    return Request("POST", path, expect="nothing", timeout=SLOW_TIMEOUT_SECS)


def set_network(sandbox_id: str, mode: str, allowed_hosts: list[str] | None) -> Request:
    if mode not in NETWORK_MODES:
        raise ValueError(f"network mode {mode!r} is none of {', '.join(NETWORK_MODES)}")
    hosts = list(allowed_hosts or [])
    if mode != "allowlist" and hosts:
        raise ValueError(f"allowed_hosts is for mode 'allowlist', not {mode!r}")
    return Request("PUT", _sandbox(sandbox_id, "/network"), json={"mode": mode, "allowed_hosts": hosts})


def poll_delays():
    """Seconds between two looks at a starting sandbox: 0.1, 0.2, 0.4, 0.8, then 1 s."""
    delay = 0.1
    while True:
        yield delay
        delay = min(delay * 2, 1.0)


def settled(info: dict) -> bool:
    """Whether a sandbox's status is past ``starting``: ``ready`` returns, any other raises."""
    status = info.get("status")
    if status == "starting":
        return False
    if status == "ready":
        return True
    raise TermExecutorError(
        None,
        info.get("error_kind") or f"sandbox_{status}",
        f"sandbox {info.get('sandbox_id')} is {status}: {info.get('error') or 'no reason given'}",
    )


def still_starting(sandbox_id: str, wait_secs: float) -> TermExecutorError:
    return TermExecutorError(None, "timeout", f"sandbox {sandbox_id} was still starting after {wait_secs:g} s")
