"""The proxy's side of HTTP: reading a proxy request's head, and its short error answers.

Two forms are accepted: ``CONNECT host:port`` (a tunnel) and a plain HTTP
request in absolute form (``GET http://host/path``), whose head is rewritten
for the destination: origin-form target, ``Host`` from the URL (not the
client's), hop-by-hop and ``Proxy-*`` headers dropped, ``Connection: close``.
Anything else is a ``Refusal`` with status 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

BAD_REQUEST = "bad request"
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
               "trailer", "upgrade"}  # fmt: skip
_STATUS = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}


class Refusal(Exception):
    def __init__(self, status: int, reason: str, host: str = "", port: int = 0, detail: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.host, self.port, self.detail = status, reason, host, port, detail


@dataclass
class Request:
    host: str
    port: int
    connect: bool  # CONNECT (a tunnel) rather than a forwarded plain HTTP request
    head: bytes  # for plain HTTP: the head to send upstream
    rest: bytes  # bytes the client sent after its head


def parse_request(head: str, rest: bytes) -> Request:
    """The proxy request in ``head`` (without its blank line); raise Refusal(400) for anything else."""
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refusal(400, BAD_REQUEST, detail="the request line is not 'METHOD target HTTP/1.x'")
    method, target, version = parts
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise Refusal(400, BAD_REQUEST, detail="a malformed header line")
        headers.append((name, value.strip()))
    if method == "CONNECT":
        host, port = _split_authority(target)
        return Request(host.lower(), port, True, b"", rest)
    if target.startswith("/"):
        raise Refusal(400, BAD_REQUEST, detail="this is a proxy: send absolute URLs (http://host/...) or CONNECT")
    try:
        url = urlsplit(target)
        port = url.port or 80
    except ValueError:
        raise Refusal(400, BAD_REQUEST, detail="the request target is not a valid URL") from None
    if url.scheme.lower() != "http":
        raise Refusal(
            400,
            BAD_REQUEST,
            detail=f"only http:// URLs are forwarded ('{url.scheme}:' asked); https goes through CONNECT",
        )
    if not url.hostname or "@" in url.netloc:
        raise Refusal(400, BAD_REQUEST, detail="the URL has no host, or has a user name")
    host = url.hostname
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    named = {
        value.strip().lower() for name, value in headers if name.lower() == "connection" for value in value.split(",")
    }
    kept = [(n, v) for n, v in headers if n.lower() not in _HOP_BY_HOP | named and n.lower() != "host"]
    shown = authority(host, port) if port != 80 else authority(host, None)
    out = [f"{method} {path} {version}", f"Host: {shown}", *(f"{n}: {v}" for n, v in kept), "Connection: close"]
    return Request(host, port, False, ("\r\n".join(out) + "\r\n\r\n").encode("latin-1"), rest)


def _split_authority(target: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` of a CONNECT; the port is required."""
    if target.startswith("["):
        host, bracket, rest = target[1:].partition("]")
        port_text = rest[1:] if bracket and rest.startswith(":") else ""
    else:
        host, _, port_text = target.rpartition(":")
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise Refusal(400, BAD_REQUEST, detail="CONNECT needs host:port with a port from 1 to 65535")
    return host, int(port_text)


def authority(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def answer(status: int, reason: str, detail: str) -> bytes:
    body = (" ".join(detail.split())[:300] + "\n").encode("utf-8", "replace")
    return (
        f"HTTP/1.1 {status} {_STATUS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"X-Egress-Reason: {reason}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1") + body
