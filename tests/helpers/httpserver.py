"""A real threaded HTTP(S) server on 127.0.0.1 for tests.

It serves a folder (``root``) and, ahead of it, routes added per test::

    with TestHTTPServer(tmp_path) as server:
        server.redirect("/old", "/task.tar.gz")
        server.respond("/missing", status=404)
        server.route("/endless", endless_body())
        url = server.url("/old")

Every request is recorded in ``server.requests`` (path and Host header) so a
test can check what the client really sent. ``make_tls_files`` writes a CA
and a server certificate (with the openssl command) for HTTPS tests.
"""

from __future__ import annotations

import http.server
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler stuck in a slow drip must not block stop()


class _Server6(_Server):
    address_family = socket.AF_INET6


class TestHTTPServer:
    __test__ = False  # not a pytest test class

    def __init__(
        self,
        root: Path | None = None,
        *,
        host: str = "127.0.0.1",
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.root = Path(root) if root else None
        self.host = host
        self.ssl_context = ssl_context
        self.routes: dict[str, Handler] = {}
        self.requests: list[dict[str, str]] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- routes ---------------------------------------------------------

    def route(self, path: str, handler: Handler) -> None:
        self.routes[path] = handler

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.route(path, respond_with(status, b"", {"Location": location}))

    def respond(self, path: str, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.route(path, respond_with(status, body, headers))

    # -- life -----------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context else "http"

    def url(self, path: str = "/", *, host: str | None = None) -> str:
        host = host or self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}{path}"

    def start(self) -> TestHTTPServer:
        server_cls = _Server6 if ":" in self.host else _Server
        self._server = server_cls((self.host, 0), self._handler_class())
        if self.ssl_context:
            self._server.socket = self.ssl_context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> TestHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler_class(self):
        owner = self

        class RequestHandler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                owner.requests.append({"method": self.command, "path": self.path, "host": self.headers.get("Host", "")})
                handler = owner.routes.get(path)
                if handler is not None:
                    try:
                        handler(self)
                    except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                        pass  # the client hung up, as tests that cap bodies expect
                    return
                if owner.root is None:
                    self.send_error(404)
                    return
                super().do_GET()

            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] not in owner.routes:
                    self.send_error(405)
                    return
                self.do_GET()  # routes see self.command and read the body themselves

        return partial(RequestHandler, directory=str(self.root or "."))


# -- route handlers ---------------------------------------------------------


def respond_with(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Handler:
    """A fixed answer; Content-Length is the body's unless ``headers`` sets it."""

    def handle(req: http.server.BaseHTTPRequestHandler) -> None:
        req.send_response(status)
        sent = {k.lower() for k in (headers or {})}
        for name, value in (headers or {}).items():
            req.send_header(name, value)
        if "content-length" not in sent:
            req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    return handle


def endless_body(chunk: bytes = b"x" * 65536, limit: int = 1 << 30) -> Handler:
    """200 with no Content-Length, streaming until the client goes (or ``limit`` bytes)."""

    def handle(req: http.server.BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.end_headers()
        sent = 0
        while sent < limit:
            req.wfile.write(chunk)
            sent += len(chunk)

    return handle


def drip_body(interval: float = 0.2, total: int = 10_000, content_length: bool = True) -> Handler:
    """200 sending one byte every ``interval`` seconds: a slow-loris server."""

    def handle(req: http.server.BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        if content_length:
            req.send_header("Content-Length", str(total))
        req.end_headers()
        for _ in range(total):
            req.wfile.write(b"x")
            req.wfile.flush()
            time.sleep(interval)

    return handle


def make_tls_files(folder: Path, names: tuple[str, ...] = ("localhost",)) -> tuple[Path, Path, Path]:
    """(ca.pem, server cert.pem, server key.pem) for ``names`` (DNS SANs), made with openssl."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = folder / "ca.key", folder / "ca.pem"
    key, csr, cert = folder / "server.key", folder / "server.csr", folder / "server.pem"
    ext = folder / "ext.cnf"
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=" + ",".join(f"DNS:{n}" for n in names) + "\n"
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
            "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={names[0]}", "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "2", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key


def server_tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
