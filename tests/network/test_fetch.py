"""fetch(): downloads through a real HTTP(S) server on 127.0.0.1 (SPEC sections 5 and 7)."""

from __future__ import annotations

import shutil
import ssl
import threading

import pytest

from evaluations.network.urlguard import FetchError, URLPolicy, URLRefused, check_git_url, fetch, pinned_connection
from tests.helpers.httpserver import TestHTTPServer, drip_body, make_tls_files, server_tls_context

pytestmark = pytest.mark.slow  # runs a server (in-process, each test well under a second)


def test_fetch_downloads_from_an_allowed_loopback_host(http_server, www, tmp_path, loopback_policy):
    (www / "task.tar.gz").write_bytes(b"archive-bytes" * 1000)
    dest = tmp_path / "task.bin"
    fetch(http_server.url("/task.tar.gz"), dest, max_bytes=10**6, timeout_secs=10, policy=loopback_policy)
    assert dest.read_bytes() == b"archive-bytes" * 1000
    assert http_server.requests[-1]["host"] == f"127.0.0.1:{http_server.port}"


def test_fetch_refuses_loopback_by_default(http_server, www, tmp_path):
    (www / "task.tar.gz").write_bytes(b"x")
    with pytest.raises(URLRefused, match="task_url host 127.0.0.1 resolves to a loopback address"):
        fetch(http_server.url("/task.tar.gz"), tmp_path / "d", max_bytes=100, timeout_secs=5, policy=URLPolicy())
    assert http_server.requests == []  # refused before connecting
    assert not (tmp_path / "d").exists()


def test_fetch_by_name_connects_to_the_checked_address_with_the_name_as_host(http_server, www, tmp_path):
    (www / "t.tar").write_bytes(b"by-name")
    policy = URLPolicy(allowed_private_hosts=("localhost",))
    dest = tmp_path / "d"
    fetch(http_server.url("/t.tar", host="localhost"), dest, max_bytes=100, timeout_secs=10, policy=policy)
    assert dest.read_bytes() == b"by-name"
    assert http_server.requests[-1]["host"] == f"localhost:{http_server.port}"


def test_fetch_follows_redirects_and_checks_each(http_server, www, tmp_path, loopback_policy):
    (www / "real.tar.gz").write_bytes(b"real")
    http_server.redirect("/a", "/b", status=301)
    http_server.redirect("/b", http_server.url("/real.tar.gz"), status=307)
    dest = tmp_path / "d"
    fetch(http_server.url("/a"), dest, max_bytes=100, timeout_secs=10, policy=loopback_policy)
    assert dest.read_bytes() == b"real"
    assert [r["path"] for r in http_server.requests] == ["/a", "/b", "/real.tar.gz"]


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("http://169.254.169.254/latest/meta-data/", "host 169.254.169.254 resolves to a link-local address"),
        ("http://127.0.0.2:1/x", "host 127.0.0.2 resolves to a loopback address (127.0.0.2)"),
        ("http://[::1]:1/x", "host ::1 resolves to a loopback address"),
        ("http://user:pw@127.0.0.1/x", "must not contain a user name or password"),
    ],
)
def test_fetch_refuses_a_redirect_to_a_refused_address(http_server, tmp_path, loopback_policy, location, message):
    http_server.redirect("/go", location)
    with pytest.raises(URLRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
        fetch(http_server.url("/go"), tmp_path / "d", max_bytes=100, timeout_secs=5, policy=loopback_policy)


def test_fetch_never_follows_a_redirect_to_file(http_server, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s")
    http_server.redirect("/go", f"file://{secret}")
    policy = URLPolicy(("http", "https", "file"), allowed_private_hosts=("127.0.0.1",))
    with pytest.raises(URLRefused, match="redirected to a 'file:' URL"):
        fetch(http_server.url("/go"), tmp_path / "d", max_bytes=100, timeout_secs=5, policy=policy)


def test_fetch_redirect_loop_stops_at_the_limit(http_server, tmp_path, loopback_policy):
    http_server.redirect("/a", "/b")
    http_server.redirect("/b", "/a")
    with pytest.raises(FetchError, match="task_url redirected more than 5 times"):
        fetch(http_server.url("/a"), tmp_path / "d", max_bytes=100, timeout_secs=5, policy=loopback_policy)
    assert len(http_server.requests) == 6
    http_server.requests.clear()
    with pytest.raises(FetchError, match="more than 2 times"):
        fetch(
            http_server.url("/a"),
            tmp_path / "d",
            max_bytes=100,
            timeout_secs=5,
            max_redirects=2,
            policy=loopback_policy,
        )
    assert len(http_server.requests) == 3


def test_fetch_stops_a_streamed_body_at_the_cap(http_server, tmp_path, loopback_policy):
    """The client hangs up at the cap: the server got to send the cap and what the socket buffers
    hold, not the 256 MiB it had (a fetch that read on, then checked, would take them all)."""
    sent, done = [0], threading.Event()

    def endless(req):
        req.send_response(200)
        req.end_headers()
        try:
            while sent[0] < 256 << 20:
                req.wfile.write(b"x" * 65536)
                sent[0] += 65536
        except OSError:  # the client went
            pass
        finally:
            done.set()

    http_server.route("/endless", endless)
    dest = tmp_path / "d"
    with pytest.raises(FetchError, match="task_url is larger than the limit of 1000000 bytes"):
        fetch(http_server.url("/endless"), dest, max_bytes=10**6, timeout_secs=60, policy=loopback_policy)
    assert done.wait(60), "the fetch left the connection open"
    assert sent[0] < 64 << 20, f"the server sent {sent[0] >> 20} MiB for a 1 MB cap"
    assert not dest.exists()  # the partial file is removed


def test_fetch_body_exactly_at_the_cap_is_fine(http_server, www, tmp_path, loopback_policy):
    (www / "f").write_bytes(b"y" * 500)
    fetch(http_server.url("/f"), tmp_path / "d", max_bytes=500, timeout_secs=5, policy=loopback_policy)
    assert (tmp_path / "d").stat().st_size == 500


def test_fetch_refuses_an_over_cap_content_length_before_reading(http_server, tmp_path, loopback_policy):
    http_server.respond("/huge", body=b"tiny", headers={"Content-Length": str(10**12)})
    with pytest.raises(FetchError, match=r"larger than the limit of 1000 bytes \(Content-Length 1000000000000\)"):
        fetch(http_server.url("/huge"), tmp_path / "d", max_bytes=1000, timeout_secs=5, policy=loopback_policy)


def test_fetch_notices_a_truncated_body(http_server, tmp_path, loopback_policy):
    http_server.respond("/short", body=b"0123456789", headers={"Content-Length": "100"})
    with pytest.raises(FetchError, match="connection closed after 10 of 100 bytes"):
        fetch(http_server.url("/short"), tmp_path / "d", max_bytes=1000, timeout_secs=5, policy=loopback_policy)


@pytest.mark.parametrize(("status", "reason"), [(404, "Not Found"), (500, "Internal Server Error"), (403, "Forbidden")])
def test_fetch_names_a_non_2xx_status(http_server, tmp_path, loopback_policy, status, reason):
    http_server.respond("/x.tar.gz", status=status, body=b"nope")
    with pytest.raises(FetchError) as info:
        fetch(
            http_server.url("/x.tar.gz?token=secret"),
            tmp_path / "d",
            max_bytes=100,
            timeout_secs=5,
            policy=loopback_policy,
        )
    assert str(info.value) == (f"task_url http://127.0.0.1:{http_server.port}/x.tar.gz answered HTTP {status} {reason}")
    assert "secret" not in str(info.value)


def test_fetch_missing_file_is_a_404(http_server, tmp_path, loopback_policy):
    with pytest.raises(FetchError, match="answered HTTP 404"):
        fetch(http_server.url("/absent.tar.gz"), tmp_path / "d", max_bytes=100, timeout_secs=5, policy=loopback_policy)


def test_fetch_overall_deadline_beats_a_slow_drip(http_server, tmp_path, loopback_policy):
    # A byte every 0.2 s never trips a per-read timeout: without the overall deadline the
    # 300 bytes (60 s) arrive whole and the fetch succeeds.
    http_server.route("/slow", drip_body(interval=0.2, total=300))
    with pytest.raises(FetchError, match=r"did not finish within 1\.5 s"):
        fetch(http_server.url("/slow"), tmp_path / "d", max_bytes=10**6, timeout_secs=1.5, policy=loopback_policy)


def test_fetch_deadline_without_content_length_is_not_mistaken_for_the_end(http_server, tmp_path, loopback_policy):
    http_server.route("/slow", drip_body(interval=0.2, content_length=False))
    with pytest.raises(FetchError, match="did not finish within"):
        fetch(http_server.url("/slow"), tmp_path / "d", max_bytes=10**6, timeout_secs=1, policy=loopback_policy)
    assert not (tmp_path / "d").exists()


def test_fetch_connection_refused_is_a_fetch_error(tmp_path, loopback_policy):
    with TestHTTPServer() as server:
        url = server.url("/x")
    with pytest.raises(FetchError, match="connection refused"):
        fetch(url, tmp_path / "d", max_bytes=100, timeout_secs=5, policy=loopback_policy)


def test_fetch_file_urls(tmp_path):
    source = tmp_path / "task.tar.gz"
    source.write_bytes(b"local" * 100)
    dest = tmp_path / "d"
    with pytest.raises(URLRefused, match="scheme 'file' is not allowed"):
        fetch(f"file://{source}", dest, max_bytes=10**6, timeout_secs=5, policy=URLPolicy())
    allowed = URLPolicy(("http", "https", "file"))
    fetch(f"file://{source}", dest, max_bytes=10**6, timeout_secs=5, policy=allowed)
    assert dest.read_bytes() == b"local" * 100
    with pytest.raises(FetchError, match="larger than the limit of 10 bytes"):
        fetch(f"file://{source}", dest, max_bytes=10, timeout_secs=5, policy=allowed)
    with pytest.raises(FetchError, match="does not exist"):
        fetch(f"file://{tmp_path}/absent", dest, max_bytes=10, timeout_secs=5, policy=allowed)
    with pytest.raises(FetchError, match="is not a regular file"):
        fetch(f"file://{tmp_path}", dest, max_bytes=10, timeout_secs=5, policy=allowed)


# -- HTTPS: pinned address, name-checked certificate ------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl command not available")
    return make_tls_files(tmp_path_factory.mktemp("tls"), names=("localhost",))


def test_fetch_https_checks_the_certificate_against_the_name(tls_files, tmp_path, www):
    ca, cert, key = tls_files
    (www / "t.tar.gz").write_bytes(b"over tls")
    policy = URLPolicy(allowed_private_hosts=("localhost", "127.0.0.1"))
    trusting = ssl.create_default_context(cafile=str(ca))
    with TestHTTPServer(www, ssl_context=server_tls_context(cert, key)) as server:
        dest = tmp_path / "d"
        fetch(
            server.url("/t.tar.gz", host="localhost"),
            dest,
            max_bytes=100,
            timeout_secs=10,
            policy=policy,
            ssl_context=trusting,
        )
        assert dest.read_bytes() == b"over tls"
        # Same server by address: the certificate names localhost, not 127.0.0.1.
        with pytest.raises(FetchError, match="TLS certificate verification failed"):
            fetch(server.url("/t.tar.gz"), dest, max_bytes=100, timeout_secs=10, policy=policy, ssl_context=trusting)
        # The system trust store does not know the test CA.
        with pytest.raises(FetchError, match="TLS certificate verification failed"):
            fetch(server.url("/t.tar.gz", host="localhost"), dest, max_bytes=100, timeout_secs=10, policy=policy)


def test_pinned_connection_for_other_requests(http_server, www, loopback_policy):
    (www / "hook").write_bytes(b"pong")
    resolved = loopback_policy.check(http_server.url("/hook"), label="callback_url")
    conn = pinned_connection(resolved, timeout_secs=5)
    try:
        conn.request("GET", resolved.target)
        assert conn.getresponse().read() == b"pong"
    finally:
        conn.close()
    unresolved = check_git_url(http_server.url("/r.git"), allow_file=False, resolve=False)
    with pytest.raises(URLRefused, match="is not a checked http"):
        pinned_connection(unresolved, timeout_secs=5)
