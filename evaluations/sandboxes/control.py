"""How the API reaches the process that owns a sandbox: one Unix socket per sandbox, on its host.

The socket is in the abstract namespace, named by the service (its DATA_DIR) and the sandbox: no
file to leave behind or to clean after a crash, and no sandbox can reach it (each has a network
namespace of its own, where the host's abstract sockets do not exist). The owner accepts only peers
of its own uid (``SO_PEERCRED``): the service's web processes.

One request per connection. The caller sends a line of JSON (``op`` and its arguments, and
``length``, the bytes of body that follow), then the body. The owner answers a line of JSON
(``status``, and what the op returns; ``length`` when bytes follow, or ``stream``: bytes until the
connection closes), then those bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
from pathlib import Path

MAX_HEADER = 1 << 20  # a header line: an exec's command and environment, at most
_CHUNK = 1 << 16


class OwnerUnreachable(Exception):
    """No process answers for the sandbox on this host (it ended, or its process died)."""


def address(data_dir: Path, sandbox_id: str) -> str:
    service = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return f"\0term-executor-{service}-sandbox-{sandbox_id}"


def listen(data_dir: Path, sandbox_id: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    listener.bind(address(data_dir, sandbox_id))
    listener.listen(64)
    return listener


def peer_is_us(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.geteuid()


class Connection:
    """One request to a sandbox's owner, from the API's side."""

    def __init__(self, data_dir: Path, sandbox_id: str, timeout: float | None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(address(data_dir, sandbox_id))
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            self.sock.close()
            raise OwnerUnreachable(str(exc)) from None
        self.reader = self.sock.makefile("rb")

    def send(self, header: dict, body=None, length: int = 0) -> None:
        """The request: ``header`` and ``length`` bytes read from ``body`` (a file-like object)."""
        line = json.dumps({**header, "length": length}).encode() + b"\n"
        left = length
        try:
            self.sock.sendall(line)
            while left > 0:
                chunk = body.read(min(left, _CHUNK))
                if not chunk:
                    raise ValueError(f"the request body ended {left} bytes early")
                self.sock.sendall(chunk)
                left -= len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the owner answered before reading it all (a refusal): ``answer`` reads why

    def answer(self) -> dict:
        """The owner's answer line (unbounded: it is our own process; an exec's is its two streams,
        each capped at MAX_OUTPUT_BYTES, as JSON)."""
        try:
            line = self.reader.readline()
        except OSError as exc:
            raise OwnerUnreachable(str(exc)) from None
        if not line.endswith(b"\n"):
            raise OwnerUnreachable("the sandbox's process closed the connection without an answer")
        return json.loads(line)

    def body(self, length: int | None):
        """The answer's bytes, in chunks: ``length`` of them, or (None) until the owner closes."""
        left = length
        while left is None or left > 0:
            chunk = self.reader.read(_CHUNK if left is None else min(left, _CHUNK))
            if not chunk:
                break
            if left is not None:
                left -= len(chunk)
            yield chunk
        self.close()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def call(data_dir: Path, sandbox_id: str, header: dict, *, body=None, length: int = 0, timeout=None) -> dict:
    """One request whose answer is its header alone."""
    conn = Connection(data_dir, sandbox_id, timeout)
    try:
        conn.send(header, body, length)
        return conn.answer()
    finally:
        conn.close()


class Request:
    """One request, from the owner's side: its header and a reader for its body."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.reader = conn.makefile("rb")
        line = self.reader.readline(MAX_HEADER)
        if not line.endswith(b"\n"):
            raise ValueError("no request")
        self.header = json.loads(line)
        self.length = int(self.header.get("length") or 0)

    def reply(self, header: dict) -> None:
        self.conn.sendall(json.dumps(header).encode() + b"\n")

    def close(self) -> None:
        self.reader.close()
        self.conn.close()


# -- readiness: the sandbox's process tells the API that waits for it ----------------------------


def _ready_address(data_dir: Path, sandbox_id: str) -> str:
    return address(data_dir, sandbox_id).replace("-sandbox-", "-ready-", 1)


def ready_listener(data_dir: Path, sandbox_id: str) -> socket.socket:
    """What POST /sandboxes waits on (bound before the row exists): one datagram when the sandbox
    is ready or has failed. Only a wake-up: the row says which."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    listener.bind(_ready_address(data_dir, sandbox_id))
    return listener


def announce_ready(data_dir: Path, sandbox_id: str) -> None:
    """Wake the API waiting for this sandbox, if one is (best effort: it also reads the row)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sender:
        try:
            sender.sendto(b"!", _ready_address(data_dir, sandbox_id))
        except OSError:
            pass  # nobody waits (the answer was 202, or it was made on another path)
