"""The egress proxy's cost: a 100 MB download direct and through it, and the relay's per-command cost.

    .venv/bin/python -m bench.egress [MB] [RUNS]     # prints a table, then JSON

Download (median of RUNS, curl to /dev/null, from a sendfile server on 127.0.0.1
in a process of its own):

- direct            curl on the host straight to the server;
- proxy http        curl on the host, plain HTTP through the relay's socat (on the host) and the proxy;
- proxy connect     the same through a CONNECT tunnel;
- sandbox http      curl in a bubblewrap sandbox with --unshare-net, through the relay (socat) and
                    the socket bound into the sandbox: the real path of a command;
- sandbox connect   the same with a CONNECT tunnel;
- python direct/proxy  a Python client (in a process of its own) straight to the server, and
                    through the proxy's socket without socat: the proxy's own share.

Runs are interleaved (one of each, round after round). Per command (median of 5 x RUNS): ``bwrap ... /bin/true`` without and with the relay prelude.
The proxy runs in this process, in threads, as it will in an evaluation's process.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evaluations.network.egress import EgressPolicy, EgressProxy, proxy_env, relay_wrapper
from evaluations.runtime import Bubblewrap, Mount, probe_bwrap, sandbox_uid
from evaluations.runtime.killer import TAG_VAR

MB = 1024 * 1024
SANDBOX_SOCKET = "/run/egress.sock"

# A server that costs as little as it can (sendfile), so the figures show the proxy, not the server.
SERVER = r"""
import os, socket, sys, threading
path = sys.argv[1]
size = os.path.getsize(path)
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
def serve(conn):
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        with open(path, "rb") as f:
            conn.sendfile(f)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


# A client reading to the end and throwing the bytes away, straight or through the proxy's socket
# (no socat): what the proxy alone costs. argv: <port or socket path> <request target> <size>.
CLIENT = r"""
import socket, sys
if sys.argv[1].startswith("/"):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
else:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET " + sys.argv[2].encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
buf = memoryview(bytearray(1 << 18)); n = 0
while (k := s.recv_into(buf)): n += k
sys.exit(0 if n > int(sys.argv[3]) else 1)
"""


def interleaved(calls: dict, runs: int) -> dict[str, float]:
    """Median seconds of each call, run in turn (round after round), so a busy moment hits them all alike."""
    for call in calls.values():
        call()  # warm up: page cache, socat's libraries
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def curl(*args: str, owner: dict | None = None, expect: int) -> None:
    done = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", *args],
                          capture_output=True, text=True, **(owner or {}))  # fmt: skip
    if done.returncode != 0 or done.stdout.strip() != str(expect):
        raise RuntimeError(f"curl {args}: exit {done.returncode}, {done.stdout!r} {done.stderr.strip()}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port: int) -> None:
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError(f"the relay did not listen on port {port}")


def relay_socat_argv(wrapper: list[str]) -> list[str]:
    """The socat command line inside the relay prelude's script."""
    line = next(line for line in wrapper[2].splitlines() if line.startswith("("))
    return shlex.split(line[1 : line.index(" <")])


def sandbox_argv(uid: int | None, folder: Path, socket_path: str, command: list[str], env: dict) -> tuple[list, dict]:
    """bwrap's argv as the runtime builds it (network off, the socket bound), without the pid report."""
    launch = Bubblewrap(uid).launch(
        command,
        session_dir=folder,
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", TAG_VAR: f"bench-egress-{os.getpid()}", **env},
        network=False,
        writable=[folder],
        mounts=[Mount(Path(socket_path), SANDBOX_SOCKET, writable=True)],
    )
    launch.close()
    at = launch.argv.index("--info-fd")
    return launch.argv[:at] + launch.argv[at + 2 :], launch.env


def python_client(where: str, target: str, size: int, owner: dict | None = None) -> None:
    # The system Python: the sandbox uid may not reach this one (a venv under /root).
    subprocess.run(["/usr/bin/python3", "-c", CLIENT, where, target, str(size)], check=True, **(owner or {}))


def sandboxed(argv: list[str], env: dict, owner: dict, expect: str):
    def run() -> None:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, **owner)
        if done.returncode != 0 or done.stdout.strip() != expect:
            raise RuntimeError(f"sandboxed command: exit {done.returncode}, {done.stdout!r} {done.stderr.strip()}")

    return run


def measure(size_mb: int, runs: int) -> dict[str, float]:
    uid = sandbox_uid()
    owner = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    figures: dict[str, float] = {"size_mb": size_mb}
    with tempfile.TemporaryDirectory(prefix="te-bench-egress-", dir="/tmp") as tmp:
        folder = Path(tmp)
        os.chmod(folder, 0o711)
        big = folder / "big"
        with open(big, "wb") as out:
            block = os.urandom(MB)
            for _ in range(size_mb):
                out.write(block)
        size = size_mb * MB
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(big)], stdout=subprocess.PIPE, text=True)
        try:
            port = int(server.stdout.readline())
            url = f"http://127.0.0.1:{port}/big"
            sock = str(folder / "egress.sock")
            policy = EgressPolicy.from_strings(f"127.0.0.1:{port}")
            with EgressProxy(sock, policy, uid):
                relay_port = free_port()
                # The relay's own socat command, run on the host (curl 7.88 ignores --proxy with --unix-socket).
                relay = subprocess.Popen(relay_socat_argv(relay_wrapper(sock, relay_port)), **owner)
                try:
                    wait_listening(relay_port)
                    via = ["--proxy", f"http://127.0.0.1:{relay_port}"]
                    downloads = {
                        "direct": lambda: curl(url, expect=size),
                        "proxy_http": lambda: curl(*via, url, expect=size),
                        "proxy_connect": lambda: curl(*via, "-p", url, expect=size),
                        "python_direct": lambda: python_client(str(port), "/big", size),
                        "python_proxy": lambda: python_client(sock, url, size, owner),
                    }
                    commands = {}
                    if probe_bwrap(uid)[0]:
                        session = folder / "session"
                        session.mkdir()
                        if uid is not None:
                            os.chown(session, uid, uid)
                        # NO_PROXY off for this one test: the server is on the host's 127.0.0.1.
                        env = {**proxy_env(), "NO_PROXY": "", "no_proxy": ""}
                        for mode, extra in (("http", []), ("connect", ["-p"])):
                            cmd = ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", *extra, url]
                            argv, outer = sandbox_argv(uid, session, sock, [*relay_wrapper(), *cmd], env)
                            downloads[f"sandbox_{mode}"] = sandboxed(argv, outer, owner, str(size))
                        bare, outer = sandbox_argv(uid, session, sock, ["/bin/true"], {})
                        relayed, _ = sandbox_argv(uid, session, sock, [*relay_wrapper(), "/bin/true"], {})
                        commands = {"bwrap_true": sandboxed(bare, outer, owner, ""),
                                    "bwrap_relay_true": sandboxed(relayed, outer, owner, "")}  # fmt: skip
                    figures.update(interleaved(downloads, runs))
                    figures.update(interleaved(commands, runs * 5))
                finally:
                    relay.kill()
                    relay.wait()
        finally:
            server.kill()
            server.wait()
    return figures


def main() -> None:
    size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    f = measure(size_mb, runs)
    print(f"{size_mb} MB download, median of {runs} (s, MB/s, x direct):")
    for name in ("direct", "proxy_http", "proxy_connect", "sandbox_http", "sandbox_connect"):
        if name in f:
            print(f"  {name:<16} {f[name]:.3f} s  {size_mb / f[name]:7.0f} MB/s  {f[name] / f['direct']:.2f}x")
    for name in ("python_direct", "python_proxy"):
        ratio = f[name] / f["python_direct"]
        print(f"  {name:<16} {f[name]:.3f} s  {size_mb / f[name]:7.0f} MB/s  {ratio:.2f}x python_direct")
    for name in ("sandbox_http", "sandbox_connect"):
        if name in f:  # the download alone: less the sandbox's and the relay's start
            transfer = f[name] - f["bwrap_relay_true"]
            print(f"  {name + ' transfer':<24} {transfer:.3f} s  {transfer / f['direct']:.2f}x direct")
    if "bwrap_true" in f:
        cost = (f["bwrap_relay_true"] - f["bwrap_true"]) * 1000
        print(f"per command: bwrap true {f['bwrap_true'] * 1000:.1f} ms, with the relay "
              f"{f['bwrap_relay_true'] * 1000:.1f} ms (+{cost:.1f} ms)")  # fmt: skip
    print(json.dumps(f))


if __name__ == "__main__":
    main()
