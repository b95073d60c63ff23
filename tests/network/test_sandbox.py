"""The proxy reached from inside real bubblewrap sandboxes with ``--unshare-net``: the relay, the bound socket.

Commands run through the spawner with the Bubblewrap runtime, network off
(so ``--unshare-net``), the proxy's socket bound at /run/egress.sock with a
``Mount``, the init's folder bound at /run/egress-relay, ``relay_wrapper(RELAY)`` before the command
and ``proxy_env()`` in its environment: what ``policy.render`` does for a step with network on.

The local servers listen on the host's 127.0.0.1, which ``NO_PROXY`` sends
direct (where the sandbox has nothing): tests that reach them set NO_PROXY to
"" for that command. The registry tests use the real names and variables.
PyPI and npm resolve to 203.0.113.80 here, a TEST-NET address refused by
default: those tests allow the registry by name, as an operator would.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import socket
import tempfile
from pathlib import Path

import psutil
import pytest

from evaluations.network.egress import SANDBOX_SOCKET, EgressPolicy, EgressProxy, proxy_env, relay_wrapper
from evaluations.network.egress.relay import RELAY_TARGET
from evaluations.runtime import Mount, initbin
from tests.helpers.gitrepos import make_bare_served, make_repo
from tests.helpers.httpserver import TestHTTPServer, respond_with
from tests.runtime.support import UID

pytestmark = pytest.mark.slow
PYPI = "pypi.org,files.pythonhosted.org"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    (root / "file.txt").write_text("through the proxy\n")
    with TestHTTPServer(root) as server:
        yield server


@pytest.fixture
def socket_folder():
    """Where the proxy's socket lives: root's, traversable (0711), not writable by the sandbox."""
    path = Path(tempfile.mkdtemp(prefix="te-egress-sock-", dir="/tmp"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def egress(socket_folder):
    """egress(allow="", deny="") -> a started proxy whose socket only the sandbox uid may use."""
    started: list[EgressProxy] = []

    def start(allow: str = "", deny: str = "") -> EgressProxy:
        policy = EgressPolicy.from_strings(allow, deny)
        path = socket_folder / f"egress{len(started)}.sock"
        started.append(EgressProxy(path, policy, UID, step="agent").start())
        return started[-1]

    yield start
    for proxy in started:
        proxy.close()


RELAY = f"{RELAY_TARGET}/{initbin.NAME}"


def relay_mounts(proxy: EgressProxy, socket_folder: Path) -> list[Mount]:
    """The proxy's socket and the init's folder (the relay's program), as render binds them."""
    return [
        Mount(Path(proxy.socket_path), SANDBOX_SOCKET, writable=True),
        Mount(initbin.ensure_init(socket_folder), RELAY_TARGET),
    ]


def run_relayed(sp, proxy: EgressProxy, script: str, *, timeout_secs: float = 20, **env: str):
    """``script`` under bash in the sandbox, behind the relay, with the proxy variables."""
    environment = sp.env(**{**proxy_env(), **env})
    argv = [*relay_wrapper(RELAY), "bash", "-c", script]
    mounts = relay_mounts(proxy, Path(proxy.socket_path).parent)
    return sp.run(argv, env=environment, mounts=mounts, timeout_secs=timeout_secs)


def records(proxy: EgressProxy) -> set[tuple]:
    return {(r.step, r.host, r.port, r.allowed, r.reason) for r in proxy.records()}


def own_address() -> str:
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.skip("no non-loopback IPv4 address here")


# -- the local server, allowed ----------------------------------------------------------------


def test_curl_reaches_an_allowed_server_through_the_relay_both_ways(bwrap_sp, egress, www):
    proxy = egress(f"127.0.0.1:{www.port}")
    url = www.url("/file.txt")
    script = f"curl -sS {url} && curl -sS --proxytunnel {url} && echo exit=$?"
    result = run_relayed(bwrap_sp, proxy, script, NO_PROXY="", no_proxy="")
    assert result.output == "through the proxy\n" * 2 + "exit=0\n"
    (record,) = proxy.records()
    assert (record.step, record.host, record.port, record.allowed, record.count) == ("agent", "127.0.0.1",
                                                                                      www.port, True, 2)  # fmt: skip
    assert record.bytes_out > 0 and record.bytes_in > 2 * len("through the proxy\n")


def test_all_proxy_alone_is_enough_for_curl(bwrap_sp, egress, www):
    proxy = egress(f"127.0.0.1:{www.port}")
    unset = "-u HTTP_PROXY -u http_proxy -u HTTPS_PROXY -u https_proxy"
    result = run_relayed(bwrap_sp, proxy, f"env {unset} curl -sS {www.url('/file.txt')}", NO_PROXY="", no_proxy="")
    assert result.output == "through the proxy\n"


# -- refused, and no way around ----------------------------------------------------------------


def test_postgresql_and_the_metadata_address_are_refused_with_403(bwrap_sp, egress):
    proxy = egress()
    fmt = "-o /dev/null -w '%{http_code}\\n'"
    script = (f"curl -sS {fmt} http://127.0.0.1:5432/; curl -sS {fmt} http://169.254.169.254/latest/; "
              f"curl -sS -p {fmt} http://127.0.0.1:5432/; curl -sS -p {fmt} http://{own_address()}:8000/")  # fmt: skip
    result = run_relayed(bwrap_sp, proxy, script, NO_PROXY="", no_proxy="")
    assert result.output.split("\n")[:2] == ["403", "403"]
    assert "CONNECT tunnel failed, response 403" in result.output
    assert records(proxy) == {
        ("agent", "127.0.0.1", 5432, False, "loopback address"),
        ("agent", "169.254.169.254", 80, False, "link-local address"),
        ("agent", own_address(), 8000, False, "host's own address"),
    }


def test_without_the_proxy_nothing_is_reachable(bwrap_sp, egress, www):
    proxy = egress(f"127.0.0.1:{www.port}")  # allowed through the proxy, and still not directly
    direct = (
        f"curl -sS --noproxy '*' --max-time 5 {www.url('/file.txt')}; echo curl=$?; "
        "python3 -c 'import socket,sys\n"
        "try: socket.create_connection((sys.argv[1], 8000), timeout=5)\n"
        'except OSError as e: print("python:", e.strerror)\' ' + own_address()
    )
    before = len(www.requests)
    result = run_relayed(bwrap_sp, proxy, direct)
    assert "curl=7\n" in result.output  # could not connect: the sandbox's loopback has no server
    assert "python: Network is unreachable" in result.output
    assert len(www.requests) == before and proxy.records() == []


def test_a_proxy_that_is_down_fails_the_command_connections(bwrap_sp, egress, www):
    proxy = egress(f"127.0.0.1:{www.port}")
    before = len(www.requests)
    proxy.close()  # the socket file is gone: bind an empty stand-in where it was
    Path(proxy.socket_path).touch()
    os.chown(proxy.socket_path, UID, UID)
    result = run_relayed(bwrap_sp, proxy, f"curl -sS {www.url('/file.txt')}; echo curl=$?", NO_PROXY="", no_proxy="")
    assert "curl=56" in result.output or "curl=52" in result.output, result.output
    assert "through the proxy" not in result.output and len(www.requests) == before


def test_with_the_port_taken_the_command_runs_behind_the_relay_already_there(bwrap_sp, egress, www, socket_folder):
    """A second relay on the same loopback (a network namespace shared with the phase before): it
    waits for the port (5 s), then says so in one line and runs the command, whose connections go
    through the relay that holds the port."""
    proxy = egress(f"127.0.0.1:{www.port}")
    environment = bwrap_sp.env(**{**proxy_env(), "NO_PROXY": "", "no_proxy": ""})
    argv = [*relay_wrapper(RELAY), *relay_wrapper(RELAY), "curl", "-sS", www.url("/file.txt")]
    result = bwrap_sp.run(argv, env=environment, mounts=relay_mounts(proxy, socket_folder))
    assert result.exit_code == 0, result.output
    assert result.output == (
        "egress relay: 127.0.0.1:3128 is taken (a process of this network namespace listens there): "
        "the command runs without a relay of its own\nthrough the proxy\n"
    )


def test_a_relay_that_cannot_listen_runs_nothing(bwrap_sp, egress, socket_folder):
    """No descriptor left for its socket (three open, three allowed): one line, exit 125, nothing run."""
    proxy = egress()
    relay = shlex.join([*relay_wrapper(RELAY), "touch", "ran"])
    argv = ["bash", "-c", f"ulimit -n 3 && exec {relay}"]
    result = bwrap_sp.run(argv, env=bwrap_sp.env(), mounts=relay_mounts(proxy, socket_folder))
    assert result.exit_code == 125 and not (bwrap_sp.session / "ran").exists(), result.output
    assert result.output == "egress relay: cannot make a socket: Too many open files\n", result.output


def test_the_relay_is_not_the_commands_child(bwrap_sp, egress, www, socket_folder):
    """The command has no child to wait for: the relay is a grandchild of the prefix, gone to the
    sandbox's pid 1 (a command that reaps "all its children" never waits for it)."""
    proxy = egress(f"127.0.0.1:{www.port}")
    script = (
        "python3 -c 'import os\ntry: os.waitpid(-1, 0)\nexcept ChildProcessError: print(\"no child\")'; "
        f"ps -o comm= -p $(pgrep -x te-relay); curl -sS {www.url('/file.txt')}"
    )
    environment = bwrap_sp.env(**{**proxy_env(), "NO_PROXY": "", "no_proxy": ""})
    mounts = relay_mounts(proxy, socket_folder)
    result = bwrap_sp.run([*relay_wrapper(RELAY), "bash", "-c", script], env=environment, mounts=mounts)
    assert result.output == "no child\nte-relay\nthrough the proxy\n", result.output


def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(bwrap_sp, egress, www):
    proxy = egress(f"127.0.0.1:{www.port}")
    client = (
        "import socket\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        f"s.sendall(b'GET {www.url('/file.txt')} HTTP/1.0\\r\\n\\r\\n')\n"
        "s.shutdown(socket.SHUT_WR)\n"
        "answer = b''\n"
        "while chunk := s.recv(65536): answer += chunk\n"
        "print(answer.split(b'\\r\\n\\r\\n', 1)[1].decode(), end='')\n"
    )
    result = run_relayed(bwrap_sp, proxy, f'python3 -c "{client}"')
    assert result.output == "through the proxy\n", result.output


def test_a_large_body_crosses_the_relay_intact_both_ways(bwrap_sp, egress, tmp_path):
    """8 MiB down and 8 MiB up, one connection each (more than the relay's 256 KiB reads and the
    sockets' buffers): each side gets exactly the bytes the other sent."""
    body = os.urandom(8 << 20)
    (tmp_path / "big.bin").write_bytes(body)

    def digest_of_upload(req) -> None:
        received = hashlib.sha256(req.rfile.read(int(req.headers["Content-Length"]))).hexdigest().encode()
        respond_with(200, received)(req)

    with TestHTTPServer(tmp_path) as server:
        server.routes["/up"] = digest_of_upload
        proxy = egress(f"127.0.0.1:{server.port}")
        script = (
            f"curl -sS {server.url('/big.bin')} | sha256sum | cut -c1-64; "
            f"head -c 8388608 /dev/urandom | tee up.bin | curl -sS --data-binary @- {server.url('/up')}; echo; "
            "sha256sum up.bin | cut -c1-64; rm up.bin"
        )
        result = run_relayed(bwrap_sp, proxy, script, NO_PROXY="", no_proxy="", timeout_secs=60)
    down, up_received, up_sent = result.output.splitlines()
    assert down == hashlib.sha256(body).hexdigest(), result.output
    assert up_received == up_sent and len(up_sent) == 64, result.output


def test_the_command_keeps_its_exit_status_and_arguments(bwrap_sp, egress, socket_folder):
    proxy = egress()
    argv = [*relay_wrapper(RELAY), "bash", "-c", 'printf "%s|" "$0" "$@"; exit 7', "zero", "a b", "", "$HOME"]
    result = bwrap_sp.run(argv, env=bwrap_sp.env(), mounts=relay_mounts(proxy, socket_folder))
    assert (result.exit_code, result.output) == (7, "zero|a b||$HOME|")


# -- real registries and real clients ------------------------------------------------------------


def test_pip_download_from_pypi_with_the_registry_allowed(bwrap_sp, egress):
    proxy = egress(PYPI)
    script = (f"python3 -m pip download six --no-deps --cert {CA_BUNDLE} -d dl -q "
              "--disable-pip-version-check --no-cache-dir && ls dl")  # fmt: skip
    result = run_relayed(bwrap_sp, proxy, script, timeout_secs=120)
    assert result.exit_code == 0 and result.output.startswith("six-"), result.output
    allowed = {(r.host, r.port, r.reason) for r in proxy.records() if r.allowed}
    assert allowed == {("pypi.org", 443, "allowed by EGRESS_ALLOW"),
                       ("files.pythonhosted.org", 443, "allowed by EGRESS_ALLOW")}  # fmt: skip
    assert all(r.bytes_in > 0 and r.bytes_out > 0 for r in proxy.records())


def test_pip_cannot_reach_pypi_by_default_and_deny_beats_allow(bwrap_sp, egress):
    for allow, deny, reason in (("", "", "private address"), (PYPI, "pypi.org", "denied by EGRESS_DENY")):
        proxy = egress(allow, deny)
        script = f"python3 -m pip download six --no-deps -d dl --retries 0 --timeout 5 --cert {CA_BUNDLE}"
        result = run_relayed(bwrap_sp, proxy, script, timeout_secs=60)
        assert result.exit_code != 0 and not list(bwrap_sp.session.glob("dl/six-*")), result.output
        assert ("agent", "pypi.org", 443, False, reason) in records(proxy)


def test_requests_httpx_npm_and_git_honour_the_variables(bwrap_sp, egress, tmp_path):
    proxy = egress(f"{PYPI},registry.npmjs.org")
    install = (f"python3 -m pip install -q --target lib --cert {CA_BUNDLE} --disable-pip-version-check "
               "--no-cache-dir requests httpx")  # fmt: skip
    assert run_relayed(bwrap_sp, proxy, install, timeout_secs=180).exit_code == 0
    clients = (
        "PYTHONPATH=lib python3 -c '"
        'import requests, httpx; u = "https://pypi.org/simple/six/"; '
        'print("requests", requests.get(u, timeout=30).status_code); print("httpx", httpx.get(u, timeout=30).status_code)'
        "'; npm view is-number name --cache npm-cache 2>&1"
    )
    result = run_relayed(bwrap_sp, proxy, clients, timeout_secs=120)
    assert result.output.splitlines()[:3] == ["requests 200", "httpx 200", "is-number"], result.output
    assert ("agent", "registry.npmjs.org", 443, True, "allowed by EGRESS_ALLOW") in records(proxy)
    make_repo(tmp_path / "src", [{"README": "hello\n"}])
    with make_bare_served(tmp_path / "src", tmp_path / "served") as url:
        git_proxy = egress(url.split("/")[2])  # 127.0.0.1:<port>, plain HTTP through the proxy
        clone = f"git clone -q {url} clone && cat clone/README"
        result = run_relayed(bwrap_sp, git_proxy, clone, timeout_secs=60, NO_PROXY="", no_proxy="")
    assert result.output == "hello\n", result.output
    assert all(r.allowed for r in git_proxy.records()) and git_proxy.records()[0].count >= 2
