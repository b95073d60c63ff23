"""The relay inside the sandbox: 127.0.0.1:3128 there, the proxy's Unix socket behind it.

A command with network runs as ``relay_wrapper(...) + argv`` with
``proxy_env()`` in its environment. The wrapper is a few lines of ``sh``:
start socat in the background, wait (bounded) until it listens, then
``exec`` the command, so the command keeps its pid, exit status and signals.
socat is started through a subshell that exits at once, so it is not the
command's child (a command reaping "all its children" never waits for it);
it dies with the sandbox (its pid namespace ends with the command).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

SOCAT = "/usr/bin/socat"
RELAY_SHELL = "/bin/sh"  # what runs the relay's few lines, in the sandbox's root
# Where a socat bundle (``make_socat_bundle``) is bound in a root that has no socat of its own.
BUNDLE_TARGET = "/run/egress-relay"
RELAY_PORT = 3128
SANDBOX_SOCKET = "/run/egress.sock"
NO_PROXY = "localhost,127.0.0.1,::1"
# socat's own default is 8 KiB per read: a large download would cost 4x the system calls.
_SOCAT_BUFFER = 256 * 1024
# After one side ends, how long socat waits for the other: its 0.5 s default would cut the
# answer to a client that half-closes after sending its request.
_SOCAT_HALF_CLOSE_SECS = 60
# The wait for socat to listen: 5 ms steps, about 5 s in all on a loaded host.
_WAIT_STEPS = 1000
RELAY_FAILED_EXIT = 125

_PRELUDE = """\
[ -x {socat} ] || {{ echo "egress relay: {socat} is missing in this sandbox" >&2; exit {failed}; }}
({socat_argv} </dev/null >/dev/null &)
ready= n=0
until [ -n "$ready" ]; do
  while read -r _ local _ state _; do
    if [ "$local" = {listen_hex} ] && [ "$state" = 0A ]; then ready=1; break; fi
  done </proc/net/tcp
  if [ -z "$ready" ]; then
    n=$((n + 1))
    [ "$n" -le {steps} ] || {{ echo "egress relay: socat did not listen on 127.0.0.1:{port}" >&2; exit {failed}; }}
    sleep 0.005
  fi
done
exec "$@"
"""


_PRELUDE_NO_WAIT = """\
[ -x {socat} ] || {{ echo "egress relay: {socat} is missing in this sandbox" >&2; exit {failed}; }}
({socat_argv} </dev/null >/dev/null &)
exec "$@"
"""


def direct(names) -> dict[str, str]:
    """NO_PROXY (both cases) with ``names`` beside the loopback's own: hosts reached straight, not
    through the relay (a compose environment's services, on the shared loopback: SPEC §23)."""
    bypass = ",".join([NO_PROXY, *names])
    return {"NO_PROXY": bypass, "no_proxy": bypass}


def proxy_env(port: int = RELAY_PORT) -> dict[str, str]:
    """The variables that send a command's HTTP(S) through the relay.

    curl, git (libcurl), pip, npm, Python's requests and httpx read these;
    libcurl reads only the lower-case ``http_proxy`` (httpoxy), hence both
    cases. ``NODE_USE_ENV_PROXY``: Node 24+ then routes ``fetch`` and ``http``
    through them too (older Node ignores it; its fetch then fails, closed).
    """
    url = f"http://127.0.0.1:{port}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    env["NODE_USE_ENV_PROXY"] = "1"
    return env


def relay_wrapper(socket_in_sandbox: str = SANDBOX_SOCKET, port: int = RELAY_PORT,
                  socat: Sequence[str] = (SOCAT,), *, wait: bool = True) -> list[str]:  # fmt: skip
    """The argv to put before a command: ``[*relay_wrapper(), *argv]``.

    ``socat``: how to start socat inside the sandbox; its first word must be
    an executable path there (see ``docs/security.md``, "Network by policy", for a
    root without socat). Exit 125 with one line on stderr if the relay cannot start.
    ``wait=False``: the command starts at once, socat beside it (a live sandbox's init,
    which waits for the relay to listen before its first exec: runtime/init.c).
    """
    if not 1 <= port <= 65535:
        raise ValueError(f"relay port must be 1-65535, got {port}")
    if not socket_in_sandbox.startswith("/") or any(c in socket_in_sandbox for c in ",:!\n"):
        raise ValueError(f"socket path must be absolute, without ',', ':' or '!' (socat syntax): {socket_in_sandbox!r}")
    socat_argv = [
        *socat,
        "-lp", "egress-relay",  # its error lines (e.g. the proxy is down) name it
        "-b", str(_SOCAT_BUFFER),
        "-t", str(_SOCAT_HALF_CLOSE_SECS),
        # backlog: socat's own is 5, and npm opens 16 connections at once
        f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay,backlog=128",
        f"UNIX-CONNECT:{socket_in_sandbox}",
    ]  # fmt: skip
    prelude = _PRELUDE if wait else _PRELUDE_NO_WAIT
    script = prelude.format(
        socat=shlex.quote(socat[0]),
        socat_argv=shlex.join(socat_argv),
        listen_hex=f"0100007F:{port:04X}",
        port=port,
        steps=_WAIT_STEPS,
        failed=RELAY_FAILED_EXIT,
    )
    return [RELAY_SHELL, "-c", script, "egress-relay"]


def bundle_prefix(folder: Path | str) -> list[str]:
    """The socat prefix of a bundle ``make_socat_bundle`` made in ``folder`` (bound at BUNDLE_TARGET)."""
    loaders = [name for name in os.listdir(Path(folder) / "lib") if name.startswith("ld-linux")]
    if len(loaders) != 1:
        raise RuntimeError(f"{folder}: not a socat bundle (no single loader in lib/)")
    return [f"{BUNDLE_TARGET}/lib/{loaders[0]}", "--library-path", f"{BUNDLE_TARGET}/lib", f"{BUNDLE_TARGET}/socat"]


def ensure_socat_bundle(folder: Path | str, socat: str = SOCAT) -> Path:
    """``folder`` holding a socat bundle: made once per host, reused by every later process."""
    folder = Path(folder)
    if not (folder / "socat").is_file():
        try:
            make_socat_bundle(folder, socat, replace=False)
        except FileExistsError:
            pass  # another process made it meanwhile
    return folder


def make_socat_bundle(folder: Path | str, socat: str = SOCAT, *, replace: bool = True) -> list[str]:
    """Copy the host's socat, its libraries and its loader into ``folder``; return the socat prefix.

    For a sandbox whose root is another system (a debootstrap environment)
    without socat, or with other libraries: bind ``folder`` read-only at
    ``BUNDLE_TARGET`` and pass the returned list as ``relay_wrapper(socat=...)``.
    The host's own loader runs it with ``--library-path``, so nothing of the
    sandbox's ``/usr`` is used (about 10 MB; made once, e.g. at start-up).
    """
    folder = Path(folder)
    listed = subprocess.run(["ldd", socat], capture_output=True, text=True, check=True).stdout
    libraries = re.findall(r"=> (/\S+)", listed)
    loaders = re.findall(r"^\s*(/\S*ld-linux\S*)", listed, re.MULTILINE)
    if len(loaders) != 1:
        raise RuntimeError(f"cannot find the loader of {socat} in ldd's answer: {listed[:300]!r}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    (staging / "lib").mkdir()
    for source in [*libraries, loaders[0]]:
        shutil.copy(source, staging / "lib" / os.path.basename(source))  # follows the .so links
    shutil.copy(socat, staging / "socat")
    for path in (staging, staging / "lib"):
        os.chmod(path, 0o755)
    if replace:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rename(staging, folder)  # a complete bundle appears at once
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if not replace and folder.is_dir():
            raise FileExistsError(folder) from exc
        raise
    loader = f"{BUNDLE_TARGET}/lib/{os.path.basename(loaders[0])}"
    return [loader, "--library-path", f"{BUNDLE_TARGET}/lib", f"{BUNDLE_TARGET}/socat"]
