"""The relay inside the sandbox: 127.0.0.1:3128 there, the proxy's Unix socket behind it.

A command with network runs as ``relay_wrapper(program) + argv`` with ``proxy_env()`` in its
environment. The wrapper is the sandbox's own static init (runtime/init.c, ``--relay``), from its
folder bound read-only at RELAY_TARGET in every root (the host's system, an environment, an image):
it listens on the sandbox's loopback, starts the relay as a process of its own (not the command's
child: a command reaping "all its children" never waits for it), and ``exec``s the command, so the
command keeps its pid, exit status and signals, and its first connection finds the relay
listening. The relay dies with the sandbox (its pid namespace ends with the command). Nothing of
the root is loaded: a root without any of our programs, or with another libc, relays the same.
"""

from __future__ import annotations

# Where the init's folder (runtime/initbin.ensure_init) is bound, read-only, in a sandbox with network.
RELAY_TARGET = "/run/egress-relay"
RELAY_PORT = 3128
SANDBOX_SOCKET = "/run/egress.sock"
NO_PROXY = "localhost,127.0.0.1,::1"
# The relay's processes' name (init.c): the phase's sandbox keeps them through a clear (phase.py).
RELAY_NAME = "te-relay"


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


def relay_wrapper(program: str, socket_in_sandbox: str = SANDBOX_SOCKET, port: int = RELAY_PORT) -> list[str]:
    """The argv to put before a command: ``[*relay_wrapper(program), *argv]``.

    ``program``: the init's path inside the sandbox (``RELAY_TARGET``/te-init, runtime/policy.py).
    Exit 125 with one line on stderr if the relay cannot listen (nothing runs then).
    """
    if not 1 <= port <= 65535:
        raise ValueError(f"relay port must be 1-65535, got {port}")
    if not socket_in_sandbox.startswith("/") or "\n" in socket_in_sandbox:
        raise ValueError(f"socket path must be absolute: {socket_in_sandbox!r}")
    return [program, "--relay", str(port), socket_in_sandbox, "--"]
