"""URL checks, and a download that connects only to the address it checked.

Used for ``task_url``, the task's git ``repo`` and ``callback_url``:

1. Only allowed schemes; no user name or password in the URL; 2048 chars at most.
2. The host is resolved once and *every* address is checked, so a name with
   one public and one internal address is refused. IPv4 embedded in IPv6
   (mapped, NAT64, 6to4, Teredo) is unwrapped and checked too.
3. The download connects to one of those checked addresses (no second DNS
   lookup that could answer differently) while the Host header, TLS SNI and
   certificate check use the name. Redirects are followed by hand and every
   ``Location`` is checked again from step 1.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import os
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urljoin, urlsplit

from evaluations.network.rules import forbidden_reason

USER_AGENT = "term-executor"
_REDIRECTS = {301, 302, 303, 307, 308}
_TRANSIENT_STATUSES = {408, 425, 429}  # the server asks to be asked again later (and every 5xx)
_CHUNK = 1 << 16
_TRANSPORT_HELPER = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)::")

MAX_URL_CHARS = 2048  # a task_url, a callback_url, and every URL the pipeline fetches


def verifying_context(cafile: str | None = None) -> ssl.SSLContext:
    """A verifying TLS context for the system's CAs (or ``cafile``'s), one per process and file:
    loading a CA store costs about 17 ms of CPU, which every https task download and every pull
    paid (bench/RESULTS.md). A context is shared by its connections and never changed after it is
    made; a CA file changed on disk (its size or time) is loaded anew."""
    key = None
    if cafile is not None:
        st = os.stat(cafile)
        key = (cafile, st.st_size, st.st_mtime_ns, st.st_ino)
    return _contexts(key)


@functools.lru_cache(maxsize=8)
def _contexts(key: tuple | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=key[0] if key else None)


class FetchError(Exception):
    """A download failed; the message is one human sentence.

    ``transient``: the network or the server failed (unreachable, refused, a name that does not
    resolve, a timeout, a 5xx): another try may succeed. False: what was asked for is wrong
    (a 404, a refused address, over the size cap) and will stay so.
    """

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class URLRefused(FetchError):
    """A URL broke a rule (scheme, host address, form); the message names the rule."""


@dataclass(frozen=True)
class ResolvedURL:
    url: str
    scheme: str
    host: str  # lower case, ASCII (IDNA), no brackets; "" for file:
    port: int | None  # explicit or scheme default; None for file:
    addresses: tuple[str, ...]  # every address of host, all checked; empty if not resolved
    target: str  # request target (path and query) for http(s); the local path for file:

    @property
    def display(self) -> str:
        """The URL without its query (which may hold a signature) for messages."""
        if self.scheme == "file":
            return f"file://{self.target}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port != (443 if self.scheme == "https" else 80):
            host = f"{host}:{self.port}"
        path = self.target.split("?", 1)[0]
        return f"{self.scheme}://{host}{path}"


@dataclass(frozen=True)
class URLPolicy:
    """The URL rules of a deployment, as ``fetch`` and the callers need them."""

    allowed_schemes: tuple[str, ...] = ("http", "https")
    allow_private: bool = False
    allowed_private_hosts: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config) -> URLPolicy:
        """Policy for task_url from an ``executor_project.config.Config``."""
        schemes = ("http", "https", "file") if config.allow_file_urls else ("http", "https")
        return cls(schemes, config.allow_private_urls, tuple(config.allowed_private_hosts))

    def check(self, url: str, *, label: str = "task_url") -> ResolvedURL:
        return check_url(
            url,
            allowed_schemes=self.allowed_schemes,
            allow_private=self.allow_private,
            allowed_private_hosts=self.allowed_private_hosts,
            label=label,
        )


# -- checks -----------------------------------------------------------------


def check_url(
    url: str,
    *,
    allowed_schemes: tuple[str, ...] | list[str],
    allow_private: bool,
    allowed_private_hosts: tuple[str, ...] | list[str],
    label: str = "task_url",
) -> ResolvedURL:
    """Parse ``url``, resolve its host and check every address; raise URLRefused.

    ``allowed_private_hosts`` entries are host names (matched case-insensitively),
    or IP addresses / CIDR networks (matched against the resolved addresses).
    """
    parsed = _parse(url, tuple(allowed_schemes), label)
    if parsed.scheme == "file":
        return parsed
    addresses = _resolve(parsed.host, parsed.port, label)
    if not allow_private and not _host_listed(parsed.host, allowed_private_hosts):
        networks = _listed_networks(allowed_private_hosts)
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
            reason = forbidden_reason(ip)
            if reason and not any(ip in net for net in networks if ip.version == net.version):
                raise URLRefused(f"{label} host {parsed.host} resolves to {reason} ({address})")
    return ResolvedURL(parsed.url, parsed.scheme, parsed.host, parsed.port, addresses, parsed.target)


def check_git_url(
    url: str,
    *,
    allow_file: bool,
    allow_private: bool = False,
    allowed_private_hosts: tuple[str, ...] | list[str] = (),
    resolve: bool = True,
    label: str = "repo",
) -> ResolvedURL:
    """Check a git remote URL (workspace.yaml ``repo``); raise URLRefused.

    http/https only (file:// when ``allow_file``); never a leading ``-`` (git
    would read an option) nor a ``<transport>::`` helper such as ``ext::``.
    With ``resolve=False`` only the form is checked (no DNS): the address
    check then happens at clone time with ``resolve=True``.
    """
    if not isinstance(url, str) or not url.strip():
        raise URLRefused(f"{label} is empty")
    if url.startswith("-"):
        raise URLRefused(f"{label} must not start with '-' ({url[:60]!r})")
    helper = _TRANSPORT_HELPER.match(url)
    if helper:
        raise URLRefused(f"{label} uses the git transport helper '{helper.group(1)}::', which is not allowed")
    schemes = ("http", "https", "file") if allow_file else ("http", "https")
    if not resolve:
        return _parse(url, schemes, label)
    return check_url(
        url,
        allowed_schemes=schemes,
        allow_private=allow_private,
        allowed_private_hosts=allowed_private_hosts,
        label=label,
    )


def git_allow_protocol(allow_file: bool) -> str:
    """The value for ``GIT_ALLOW_PROTOCOL``."""
    return "http:https:file" if allow_file else "http:https"


def git_resolve_pin(resolved: ResolvedURL) -> str | None:
    """A ``http.curloptResolve`` value pinning git's connection to the checked addresses.

    Pass it as ``git -c http.curloptResolve=<value>`` so git (libcurl) does not
    look the name up again; pair it with ``-c http.followRedirects=false``,
    since a redirect to another host would not be pinned.
    """
    if resolved.scheme not in ("http", "https") or not resolved.addresses:
        return None
    addrs = ",".join(f"[{a}]" if ":" in a else a for a in resolved.addresses)
    return f"{resolved.host}:{resolved.port}:{addrs}"


def _parse(url: str, schemes: tuple[str, ...], label: str) -> ResolvedURL:
    """Check the form of ``url`` (no DNS); addresses are left empty."""
    if not isinstance(url, str) or not url:
        raise URLRefused(f"{label} is empty")
    if len(url) > MAX_URL_CHARS:
        raise URLRefused(f"{label} is longer than {MAX_URL_CHARS} characters")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise URLRefused(f"{label} contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise URLRefused(f"{label} is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    allowed = ", ".join(schemes)
    if not scheme:
        raise URLRefused(f"{label} is not an absolute URL (allowed schemes: {allowed})")
    if scheme not in schemes:
        raise URLRefused(f"{label} scheme '{scheme}' is not allowed (allowed: {allowed})")
    if "@" in parts.netloc:
        raise URLRefused(f"{label} must not contain a user name or password")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise URLRefused(f"{label} must be file:///absolute/path")
        return ResolvedURL(url, scheme, "", None, (), unquote(parts.path))
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise URLRefused(f"{label} has no host")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise URLRefused(f"{label} host is not a valid name") from None
    if port == 0:
        raise URLRefused(f"{label} has an invalid port")
    port = port or (443 if scheme == "https" else 80)
    target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~")
    if parts.query:
        target += "?" + quote(parts.query, safe="/%:@!$&'()*+,;=~?")
    return ResolvedURL(url, scheme, host, port, (), target)


def _resolve(host: str, port: int, label: str) -> tuple[str, ...]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise URLRefused(f"{label} host {host} cannot be resolved ({reason})", transient=True) from None
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise URLRefused(f"{label} host {host} resolves to no address")
    return addresses


def _host_listed(host: str, allowed: tuple[str, ...] | list[str]) -> bool:
    names = {h.strip().strip("[]").rstrip(".").lower() for h in allowed}
    return host.lower() in names


def _listed_networks(allowed) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for entry in allowed:
        try:
            networks.append(ipaddress.ip_network(entry.strip().strip("[]"), strict=False))
        except ValueError:
            continue  # a host name, matched by _host_listed
    return networks


# -- download ---------------------------------------------------------------


def fetch(
    url: str,
    dest_path: Path | str,
    *,
    max_bytes: int,
    timeout_secs: float,
    max_redirects: int = 5,
    policy: URLPolicy,
    label: str = "task_url",
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Download ``url`` to ``dest_path`` under the policy, a byte cap and a deadline.

    Raises FetchError (URLRefused for a rule broken, redirects included).
    ``dest_path`` is removed again if the download fails.
    """
    deadline = time.monotonic() + timeout_secs
    current = url
    try:
        for _hop in range(max_redirects + 1):
            resolved = policy.check(current, label=label)
            if resolved.scheme == "file":
                _copy_local(resolved, dest_path, max_bytes, label)
                return
            location = _download(resolved, dest_path, max_bytes, deadline, timeout_secs, label, ssl_context)
            if location is None:
                return
            current = urljoin(current, location)
            scheme = urlsplit(current).scheme.lower()
            if scheme not in ("http", "https"):
                raise URLRefused(
                    f"{label} {resolved.display} redirected to a '{scheme}:' URL, "
                    "only http and https redirects are followed"
                )
        raise FetchError(f"{label} redirected more than {max_redirects} times")
    except BaseException:
        try:
            os.unlink(dest_path)
        except OSError:
            pass
        raise


def _download(resolved, dest_path, max_bytes, deadline, timeout_secs, label, ssl_context) -> str | None:
    """One request. Returns the Location of a redirect, or None once the body is saved."""
    remaining = deadline - time.monotonic()
    timed_out = f"{label} download from {resolved.host} did not finish within {timeout_secs} s"
    if remaining <= 0:
        raise FetchError(timed_out, transient=True)
    conn = pinned_connection(resolved, timeout_secs=remaining, ssl_context=ssl_context)
    # The socket timeout bounds each wait; the watchdog bounds the total, so a
    # server dripping one byte at a time cannot stretch the download.
    watchdog = threading.Timer(remaining, conn.abort)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request(
            "GET",
            resolved.target,
            headers={
                "User-Agent": USER_AGENT,
                "Accept": "*/*",
                "Accept-Encoding": "identity",
                "Connection": "close",
            },
        )
        response = conn.getresponse()
        if response.status in _REDIRECTS:
            location = response.getheader("Location")
            if not location:
                raise FetchError(f"{label} {resolved.display} answered HTTP {response.status} without a Location")
            return location
        if not 200 <= response.status < 300:
            reason = " ".join(str(response.reason).split())[:80]  # the server's text: keep it short
            raise FetchError(
                f"{label} {resolved.display} answered HTTP {response.status} {reason}".rstrip(),
                transient=response.status >= 500 or response.status in _TRANSIENT_STATUSES,
            )
        declared = _content_length(response)
        if declared is not None and declared > max_bytes:
            raise FetchError(f"{label} is larger than the limit of {max_bytes} bytes (Content-Length {declared})")
        got = _save(response, dest_path, max_bytes, label)
        if conn.aborted or time.monotonic() >= deadline:
            raise FetchError(timed_out, transient=True)
        if declared is not None and got < declared:
            raise FetchError(
                f"{label} {resolved.display}: connection closed after {got} of {declared} bytes", transient=True
            )
        return None
    except FetchError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if conn.aborted or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
            raise FetchError(timed_out, transient=True) from None
        # Refused, reset, unreachable, TLS, or our own disk full while saving: not the archive's fault.
        raise FetchError(f"{label} {resolved.display}: {_describe(exc)}", transient=True) from None
    finally:
        watchdog.cancel()
        conn.close()


def pinned_connection(
    resolved: ResolvedURL, *, timeout_secs: float, ssl_context: ssl.SSLContext | None = None
) -> http.client.HTTPConnection:
    """An http.client connection to ``resolved``'s checked addresses (e.g. for a callback POST).

    It never resolves the name again; the Host header, TLS SNI and certificate
    check use the name. Redirects are the caller's to refuse or re-check.
    """
    if resolved.scheme not in ("http", "https") or not resolved.addresses:
        raise URLRefused(f"{resolved.display} is not a checked http(s) URL")
    if resolved.scheme == "https":
        context = ssl_context or verifying_context()
        return _PinnedHTTPSConnection(resolved.host, resolved.port, resolved.addresses, timeout_secs, context)
    return _PinnedHTTPConnection(resolved.host, resolved.port, resolved.addresses, timeout_secs)


def _save(response: http.client.HTTPResponse, dest_path, max_bytes: int, label: str) -> int:
    got = 0
    out = os.open(dest_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        while True:
            chunk = response.read1(_CHUNK)
            if not chunk:
                return got
            got += len(chunk)
            if got > max_bytes:
                raise FetchError(f"{label} is larger than the limit of {max_bytes} bytes")
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
    finally:
        os.close(out)


def _copy_local(resolved: ResolvedURL, dest_path, max_bytes: int, label: str) -> None:
    path = resolved.target
    try:
        src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FetchError(f"{label} file {path} does not exist") from None
    except OSError as exc:
        raise FetchError(f"{label} file {path} cannot be read ({_describe(exc)})") from None
    try:
        st = os.fstat(src)
        if not (st.st_mode & 0o170000) == 0o100000:
            raise FetchError(f"{label} file {path} is not a regular file")
        if st.st_size > max_bytes:
            raise FetchError(f"{label} is larger than the limit of {max_bytes} bytes ({st.st_size} bytes)")
        with open(src, "rb", closefd=False) as source:
            _save(source, dest_path, max_bytes, label)
    finally:
        os.close(src)


def _content_length(response: http.client.HTTPResponse) -> int | None:
    raw = response.getheader("Content-Length")
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw.strip())


def _connect_any(addresses: tuple[str, ...], port: int, timeout: float) -> socket.socket:
    """Connect to the first checked address that answers; never resolve again."""
    last: OSError | None = None
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((address, port))
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError("no address to connect to")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to a pre-checked address; Host header from the name."""

    def __init__(self, host: str, port: int, addresses: tuple[str, ...], timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses
        self.aborted = False
        # getresponse() drops self.sock once the answer says "close", while the
        # response keeps reading from it: abort() needs its own reference.
        self.live_sock: socket.socket | None = None

    def connect(self) -> None:
        self.sock = _connect_any(self._addresses, self.port, self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.live_sock = self.sock
        if self.aborted:  # the watchdog fired while connecting
            self.sock.close()
            raise TimeoutError("deadline passed")

    def abort(self) -> None:
        """Called by the watchdog thread: unblock any read or write."""
        self.aborted = True
        sock = self.live_sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    """HTTPS to a pre-checked address; SNI and certificate checked against the name."""

    default_port = http.client.HTTPS_PORT

    def __init__(self, host, port, addresses, timeout, context: ssl.SSLContext):
        super().__init__(host, port, addresses, timeout)
        self._context = context

    def connect(self) -> None:
        super().connect()
        self.sock = self.live_sock = self._context.wrap_socket(self.sock, server_hostname=self.host)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed ({exc.verify_message})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.HTTPException):
        return f"invalid HTTP answer ({type(exc).__name__}: {str(exc)[:120]})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)[:200] or type(exc).__name__
