"""The egress proxy with real sockets: its Unix socket, HTTP servers on 127.0.0.1, bounded waits.

The clients here speak to the proxy's socket directly (what socat relays to
inside a sandbox; tests/network/test_sandbox.py goes through the real relay).
"""

from __future__ import annotations

import os
import socket
import ssl
import stat
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from evaluations.network.egress import EgressPolicy, EgressProxy
from evaluations.network.egress import proxy as proxy_module
from tests.helpers.httpserver import TestHTTPServer, make_tls_files, server_tls_context

ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    (root / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))

    def echo_headers(req):
        body = "".join(f"{k}: {v}\n" for k, v in req.headers.items()).encode()
        req.send_response(200)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def count_upload(req):
        got = len(req.rfile.read(int(req.headers["Content-Length"])))
        body = str(got).encode()
        req.send_response(200)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    with TestHTTPServer(root) as server:
        server.route("/headers", echo_headers)
        server.route("/upload", count_upload)
        yield server


@pytest.fixture
def folder():
    path = Path(tempfile.mkdtemp(prefix="te-egress-", dir="/tmp"))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def start(folder):
    """start(allow="", deny="", **options) -> a started EgressProxy for this process's uid."""
    started: list[EgressProxy] = []

    def make(allow: str = "", deny: str = "", uid: int | None = None, **options) -> EgressProxy:
        path = folder / f"egress{len(started)}.sock"
        proxy = EgressProxy(path, EgressPolicy.from_strings(allow, deny), uid, **options).start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.close()


def connect(proxy: EgressProxy) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(proxy.socket_path)
    return client


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data


def exchange(proxy: EgressProxy, request: bytes) -> bytes:
    with connect(proxy) as client:
        client.sendall(request)
        return read_all(client)


def refused_unanswered(proxy: EgressProxy, request: bytes) -> bool:
    """The proxy closed the connection without a byte: before the request was sent (a broken pipe
    here, as under load) or after it."""
    with connect(proxy) as client:
        try:
            client.sendall(request)
            return read_all(client) == b""
        except (BrokenPipeError, ConnectionResetError):
            return True


def split(response: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return lines[0], headers, body


def only_record(proxy: EgressProxy):
    records = proxy.records()
    assert len(records) == 1, records
    return records[0]


# -- allowed ------------------------------------------------------------------------


@pytest.mark.parametrize("use_splice", [True, False])
def test_connect_tunnel_downloads_and_counts_every_byte(start, www, use_splice):
    proxy = start(f"127.0.0.1:{www.port}", use_splice=use_splice)
    request = b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(proxy) as client:
        client.sendall(f"CONNECT 127.0.0.1:{www.port} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() + request)
        received = read_all(client)
    assert received.startswith(ESTABLISHED)
    status, headers, body = split(received[len(ESTABLISHED) :])
    assert status.endswith("200 OK")
    assert body == (www.root / "big.bin").read_bytes()
    record = only_record(proxy)
    assert (record.host, record.port, record.allowed, record.reason) == ("127.0.0.1", www.port, True,
                                                                         "allowed by EGRESS_ALLOW")  # fmt: skip
    assert (record.bytes_out, record.bytes_in, record.count) == (len(request), len(received) - len(ESTABLISHED), 1)


def test_plain_http_is_forwarded_with_the_urls_host_and_connection_close(start, www):
    proxy = start(f"127.0.0.1:{www.port}")
    url = f"http://127.0.0.1:{www.port}/headers?q=1"
    request = (f"GET {url} HTTP/1.1\r\nHost: other.example\r\nProxy-Connection: keep-alive\r\n"
               "Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
               "X-Kept: yes\r\n\r\n").encode()  # fmt: skip
    status, _, body = split(exchange(proxy, request))
    assert status.endswith("200 OK")
    seen = body.decode()
    assert f"Host: 127.0.0.1:{www.port}\n" in seen and "X-Kept: yes\n" in seen and "Connection: close\n" in seen
    assert "Proxy-" not in seen and "X-Drop" not in seen and "keep-alive" not in seen
    assert www.requests[-1]["path"] == "/headers?q=1"
    record = only_record(proxy)
    assert record.allowed and record.count == 1 and record.bytes_out > 0 and record.bytes_in > len(body)


def test_an_upload_through_a_tunnel_is_counted_as_bytes_out(start, www):
    proxy = start(f"127.0.0.1:{www.port}")
    payload = os.urandom(1024 * 1024)
    request = f"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload
    with connect(proxy) as client:
        client.sendall(f"CONNECT 127.0.0.1:{www.port} HTTP/1.1\r\n\r\n".encode())
        assert client.recv(len(ESTABLISHED)) == ESTABLISHED
        client.sendall(request)
        _, _, body = split(read_all(client))
    assert body == str(len(payload)).encode()
    assert only_record(proxy).bytes_out == len(request)


@pytest.mark.parametrize("use_splice", [True, False])
def test_the_client_sees_the_end_only_after_every_byte_is_counted(start, www, monkeypatch, use_splice):
    """CI caught the upload's last piece counted after the client had read the end (the tunnel shut
    the client's socket before the copying thread had counted): a slow count makes that certain."""
    counted = EgressProxy._add_bytes

    def slow_count(self, record, out=0, into=0):
        if out:
            threading.Event().wait(0.05)  # the copying thread is late, as under load
        counted(self, record, out=out, into=into)

    monkeypatch.setattr(EgressProxy, "_add_bytes", slow_count)
    proxy = start(f"127.0.0.1:{www.port}", use_splice=use_splice)
    payload = os.urandom(256 * 1024)
    request = f"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload
    with connect(proxy) as client:
        client.sendall(f"CONNECT 127.0.0.1:{www.port} HTTP/1.1\r\n\r\n".encode() + request)
        assert client.recv(len(ESTABLISHED)) == ESTABLISHED
        _, _, body = split(read_all(client))
    assert body == str(len(payload)).encode()
    assert only_record(proxy).bytes_out == len(request)


def test_https_through_a_tunnel_checks_the_certificate_by_name(start, tmp_path):
    ca, cert, key = make_tls_files(tmp_path / "tls", ("localhost",))
    with TestHTTPServer(tmp_path, ssl_context=server_tls_context(cert, key)) as server:
        server.respond("/hello", body=b"over tls")
        proxy = start(f"localhost:{server.port}")  # allowed by name: the proxy resolves it itself
        with connect(proxy) as client:
            client.sendall(f"CONNECT localhost:{server.port} HTTP/1.1\r\n\r\n".encode())
            assert client.recv(len(ESTABLISHED)) == ESTABLISHED
            context = ssl.create_default_context(cafile=str(ca))
            with context.wrap_socket(client, server_hostname="localhost") as tls:
                tls.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                _, _, body = split(read_all(tls))
    assert body == b"over tls"
    record = only_record(proxy)
    assert (record.host, record.allowed, record.reason) == ("localhost", True, "allowed by EGRESS_ALLOW")


# -- refused ----------------------------------------------------------------------------


def own_address() -> str:
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.skip("no non-loopback IPv4 address here")


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("CONNECT 127.0.0.1:5432", "loopback address"),  # PostgreSQL listens there on this machine
        ("GET http://127.0.0.1:5432/", "loopback address"),
        ("CONNECT [::1]:5432", "loopback address"),
        ("CONNECT [::ffff:127.0.0.1]:5432", "loopback address"),
        ("CONNECT localhost:5432", "loopback address"),
        ("CONNECT 10.0.0.1:80", "private address"),
        ("GET http://192.168.1.1/", "private address"),
        ("CONNECT 169.254.169.254:80", "link-local address"),
        ("GET http://169.254.169.254/latest/meta-data/", "link-local address"),
        ("CONNECT 0.0.0.0:5432", "unspecified address"),
        ("CONNECT 224.0.0.1:80", "multicast address"),
        ("CONNECT OWN:5432", "host's own address"),
    ],
)
def test_refused_destinations_get_403_with_the_reason_and_are_recorded(start, target, reason):
    proxy = start()
    target = target.replace("OWN", own_address()) if "OWN" in target else target
    status, headers, body = split(exchange(proxy, f"{target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()))
    assert status == "HTTP/1.1 403 Forbidden"
    assert headers["X-Egress-Reason"] == reason
    assert body.endswith(f"refused: {reason}\n".encode()) and body.count(b"\n") == 1
    record = only_record(proxy)
    assert (record.allowed, record.reason, record.count, record.bytes_out, record.bytes_in) == (False, reason, 1, 0, 0)


def test_deny_beats_allow_at_the_proxy(start, www):
    proxy = start(f"127.0.0.1:{www.port}", deny="127.0.0.0/8")
    status, headers, _ = split(exchange(proxy, f"CONNECT 127.0.0.1:{www.port} HTTP/1.1\r\n\r\n".encode()))
    assert (status, headers["X-Egress-Reason"]) == ("HTTP/1.1 403 Forbidden", "denied by EGRESS_DENY")


def test_an_allowed_destination_that_does_not_answer_gets_502(start):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    proxy = start(f"127.0.0.1:{closed_port}")
    status, headers, body = split(exchange(proxy, f"CONNECT 127.0.0.1:{closed_port} HTTP/1.1\r\n\r\n".encode()))
    assert (status, headers["X-Egress-Reason"]) == ("HTTP/1.1 502 Bad Gateway", "connect failed")
    assert b"Connection refused" in body
    record = only_record(proxy)
    assert (record.allowed, record.reason) == (False, "connect failed")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"hello\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",  # origin form: someone thinks this is a server
        b"GET https://example.com/ HTTP/1.1\r\n\r\n",
        b"GET ftp://example.com/ HTTP/1.1\r\n\r\n",
        b"GET http://user@example.com/ HTTP/1.1\r\n\r\n",
        b"GET http:///nohost HTTP/1.1\r\n\r\n",
        b"CONNECT example.com HTTP/1.1\r\n\r\n",
        b"CONNECT example.com:0 HTTP/1.1\r\n\r\n",
        b"CONNECT example.com:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT [::1:443 HTTP/1.1\r\n\r\n",
        b"CONNECT bad_host!:443 HTTP/1.1\r\n\r\n",
        b"CONNECT example.com:443 HTTP/2.0\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\nno colon here\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\n folded: header\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\nX: " + b"a" * 40000 + b"\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\n",  # then the client closes its side
    ],
)
def test_bad_requests_get_400_and_are_recorded(start, request_bytes):
    proxy = start()
    with connect(proxy) as client:
        client.sendall(request_bytes)
        client.shutdown(socket.SHUT_WR)
        status, headers, body = split(read_all(client))
    assert status == "HTTP/1.1 400 Bad Request", body
    assert body.count(b"\n") == 1
    record = only_record(proxy)
    assert (record.allowed, record.count) == (False, 1)
    assert record.reason in ("bad request", "bad host")


def test_a_request_head_that_never_ends_gets_400_after_the_head_timeout(start):
    proxy = start(head_timeout=0.3)
    with connect(proxy) as client:
        client.sendall(b"CONNECT example.com:443 HTTP/1.1\r\n")
        status, _, body = split(read_all(client))
    assert status == "HTTP/1.1 400 Bad Request" and b"within 0.3 s" in body


# -- bounds -----------------------------------------------------------------------------------


def test_connections_over_the_cap_get_503(start):
    proxy = start(max_connections=2)
    waiting = [connect(proxy), connect(proxy)]  # both stay in the head phase
    try:
        status, headers, _ = split(exchange(proxy, b"CONNECT example.com:443 HTTP/1.1\r\n\r\n"))
        assert (status, headers["X-Egress-Reason"]) == ("HTTP/1.1 503 Service Unavailable", "too many connections")
    finally:
        for sock in waiting:
            sock.close()


@pytest.fixture
def silent_server():
    """A TCP server on 127.0.0.1 that accepts and never says anything."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    listener.close()
    for sock in accepted:
        sock.close()


def test_a_silent_tunnel_is_closed_after_the_idle_timeout(start, silent_server):
    proxy = start(f"127.0.0.1:{silent_server}", idle_timeout=0.3)
    with connect(proxy) as client:
        client.sendall(f"CONNECT 127.0.0.1:{silent_server} HTTP/1.1\r\n\r\n".encode())
        assert read_all(client) == ESTABLISHED  # then EOF, well before the client's own 10 s timeout


def test_close_ends_live_tunnels_and_removes_the_socket(start, silent_server):
    proxy = start(f"127.0.0.1:{silent_server}")
    client = connect(proxy)
    client.sendall(f"CONNECT 127.0.0.1:{silent_server} HTTP/1.1\r\n\r\n".encode())
    assert client.recv(len(ESTABLISHED)) == ESTABLISHED
    proxy.close()
    assert client.recv(10) == b""
    client.close()
    assert not os.path.exists(proxy.socket_path)
    proxy.close()  # twice is fine


def test_a_proxy_that_is_down_fails_the_connection(start):
    proxy = start()
    proxy.close()
    with pytest.raises((FileNotFoundError, ConnectionRefusedError)):
        connect(proxy)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(proxy.socket_path)  # a socket file nobody listens on
    stale.close()
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)


def test_records_are_per_step_and_distinct_keys_are_capped(start, monkeypatch):
    monkeypatch.setattr(proxy_module, "MAX_RECORDS", 3)
    proxy = start(step="installing_deps")
    exchange(proxy, b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")
    exchange(proxy, b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")
    proxy.set_step("agent")
    for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"):
        exchange(proxy, f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
    summary = sorted((r.step, r.host, r.count) for r in proxy.records())
    # Three distinct keys, then the rest of the step under "(other)".
    assert summary == [("agent", "(other)", 2), ("agent", "10.0.0.1", 1), ("agent", "10.0.0.2", 1),
                       ("installing_deps", "10.0.0.1", 2)]  # fmt: skip
    assert all(r.reason == "private address" and not r.allowed for r in proxy.records())
    assert proxy.records()[0].as_dict().keys() == {"step", "host", "port", "allowed", "reason", "bytes_out",
                                                   "bytes_in", "count"}  # fmt: skip


# -- who may connect ----------------------------------------------------------------------------


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give the socket to another uid")
def test_the_socket_belongs_to_the_sandbox_uid_and_other_peers_are_refused(start):
    proxy = start(uid=65534)
    info = os.stat(proxy.socket_path)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 65534
    assert refused_unanswered(proxy, b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")  # root may open the file: not talk
    record = only_record(proxy)
    assert (record.host, record.allowed, record.reason) == ("", False, "peer uid not allowed")


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give the socket to another uid")
def test_the_evaluations_id_range_may_connect_and_no_other_id(start):
    """An image's other users (a verifier run as its root while the agent is [agent] user) are ids of
    the evaluation's range: they may talk to its proxy (0666, the peer's uid checked); an id outside
    the range and the lease's may not. Root (this process) stands for a peer of the range."""
    inside = start(uid=65534, id_range=range(0, 1))
    assert stat.S_IMODE(os.stat(inside.socket_path).st_mode) == 0o666
    with connect(inside) as client:
        client.sendall(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")
        assert read_all(client).startswith(b"HTTP/1.1 403")  # talked to: refused by the policy, not the peer check
    outside = start(uid=65534, id_range=range(100000, 165536))
    assert refused_unanswered(outside, b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")
    assert only_record(outside).reason == "peer uid not allowed"


def test_a_socket_path_too_long_for_unix_sockets_is_refused(folder):
    with pytest.raises(ValueError, match="longer than a Unix socket allows"):
        EgressProxy(folder / ("x" * 120), EgressPolicy(), None)
