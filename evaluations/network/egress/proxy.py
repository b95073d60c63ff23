"""The egress proxy: HTTP CONNECT and plain HTTP forwarding on a Unix socket, one per evaluation.

It lives in the evaluation's own process (threads, no event loop to share):
one thread accepts, each connection gets a thread that reads the request
head, asks the policy, connects to the checked address and then copies one
direction while a second thread copies the other.

Why it is shaped like this:

1. A Unix socket, not a TCP port: a sandbox with ``--unshare-net`` has no
   route out, and the socket file bound into it is its only door. The file
   is the sandbox uid's (0600) and every accepted peer's uid is checked
   (SO_PEERCRED), so another evaluation cannot borrow this one's proxy.
2. The bytes move by ``splice`` through a pipe (the kernel copies page
   references, Python touches no payload), so a download costs little more
   than a direct one; ``recv_into``/``sendall`` where splice is refused.
3. Bounded: ``max_connections`` at once (more get 503), a request head of
   ``max_head_bytes`` read within ``head_timeout``, tunnels closed after
   ``idle_timeout`` without a byte either way, at most ``MAX_RECORDS``
   distinct records (the rest are counted under host ``(other)``).
4. Plain HTTP: the forwarded request says ``Connection: close``, so a client
   cannot send a second request for another host on the same connection.
   When the server's side ends, the connection ends.

Every connection is recorded, refused ones too, aggregated per
(step, host, port, allowed); ``reason`` is the latest one seen for that key.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from evaluations.network.egress.policy import BAD_HOST, EgressPolicy
from evaluations.network.egress.request import BAD_REQUEST, Refusal, Request, answer, authority, parse_request

log = logging.getLogger(__name__)

MAX_RECORDS = 1000
OTHER_HOST = "(other)"
CHUNK = 256 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

# Reasons the proxy adds to the policy's (policy.py has the rest; request.py: BAD_REQUEST).
CONNECT_FAILED = "connect failed"
TOO_MANY = "too many connections"
REFUSAL_LINGER_SECS = 2.0
MAX_LINGERING_REFUSALS = 16
PEER_REFUSED = "peer uid not allowed"


@dataclass
class EgressRecord:
    step: str
    host: str
    port: int
    allowed: bool
    reason: str
    bytes_out: int = 0  # from the sandbox to the destination
    bytes_in: int = 0  # from the destination to the sandbox
    count: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class EgressProxy:
    """``EgressProxy(path, policy, allowed_uid).start()``; ``set_step``, ``records``, ``close``.

    ``allowed_uid``: the uid that may connect (the evaluation's sandbox uid); None means this
    process's own uid (a service not running as root). ``id_range``: the evaluation's range of ids
    for an image's other users (runtime/idmap.py: a verifier run as the image's root while the agent
    is its ``[agent] user``), which may connect too; no other evaluation has an id in it.
    """

    def __init__(
        self,
        socket_path: Path | str,
        policy: EgressPolicy,
        allowed_uid: int | None,
        *,
        id_range: range | None = None,
        step: str = "",
        max_connections: int = 64,
        idle_timeout: float = 300.0,
        head_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        max_head_bytes: int = 32 * 1024,
        use_splice: bool = True,
    ):
        self.socket_path = str(socket_path)
        if len(os.fsencode(self.socket_path)) > 107:
            raise ValueError(f"egress socket path is longer than a Unix socket allows (107 bytes): {self.socket_path}")
        self.policy = policy
        self.allowed_uid = os.geteuid() if allowed_uid is None else allowed_uid
        self.id_range = id_range or range(0)
        self.step = step
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.head_timeout = head_timeout
        self.connect_timeout = connect_timeout
        self.max_head_bytes = max_head_bytes
        self.use_splice = use_splice and hasattr(os, "splice")
        self._lock = threading.Lock()
        self._refusers = threading.BoundedSemaphore(MAX_LINGERING_REFUSALS)
        self._records: dict[tuple[str, str, int, bool], EgressRecord] = {}
        self._live: set[_Connection] = set()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = -1, -1
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- life ------------------------------------------------------------

    def start(self) -> EgressProxy:
        """Listen on the socket (replacing a stale file), owned by ``allowed_uid``, mode 0600 (0666 with
        an ``id_range``: its ids are no owner of the file; the SO_PEERCRED check stands for both)."""
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.socket_path)
            # A peer of another uid that connects before these two lines still meets the SO_PEERCRED check.
            os.chmod(self.socket_path, 0o666 if self.id_range else 0o600)
            if self.allowed_uid != os.geteuid():
                os.chown(self.socket_path, self.allowed_uid, self.allowed_uid)
            listener.listen(128)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._accept_loop, name=f"egress-accept {self.socket_path}", daemon=True)
        self._thread.start()
        return self

    def set_step(self, step: str) -> None:
        """Connections accepted from now on are recorded under ``step``."""
        self.step = step

    def close(self) -> None:
        """Stop accepting, end every live connection, remove the socket file. Safe to call twice."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            live = list(self._live)
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
        for conn in live:
            conn.abort()
        for conn in live:
            conn.join(5)
        if self._listener is not None:
            self._listener.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def records(self) -> list[EgressRecord]:
        """A copy of the aggregated records, byte counts of live tunnels included."""
        with self._lock:
            return [EgressRecord(**asdict(r)) for r in self._records.values()]

    # -- accepting -------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._closing:
                for key, _ in selector.select():
                    if key.fileobj is self._listener:
                        self._accept_one()

    def _accept_one(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        step = self.step
        pid, uid, _gid = struct.unpack("3i", client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != self.allowed_uid and uid not in self.id_range:
            log.warning("egress proxy %s: refused a connection from uid %s (pid %s)", self.socket_path, uid, pid)
            self._record(step, "", 0, False, PEER_REFUSED)
            _close_gently(client)
            return
        with self._lock:
            crowded = len(self._live) >= self.max_connections or self._closing
            if not crowded:
                conn = _Connection(self, client, step)
                self._live.add(conn)
        if crowded:
            self._record(step, "", 0, False, TOO_MANY)
            refusal = answer(503, TOO_MANY, f"more than {self.max_connections} connections at once")
            if self._refusers.acquire(blocking=False):  # a bounded few linger for their client's request
                threading.Thread(target=self._refuse, args=(client, refusal), daemon=True).start()
            else:
                client.setblocking(False)
                try:  # a few hundred bytes into an empty socket buffer: never blocks the accept loop
                    client.send(refusal)
                except OSError:
                    pass
                _close_gently(client)
            return
        conn.start()

    def _refuse(self, client: socket.socket, refusal: bytes) -> None:
        """Answer 503, then wait (briefly) for the client's request and its close: closed before the
        request arrives, the socket would make the client's read fail (ECONNRESET) and lose the 503."""
        try:
            client.settimeout(REFUSAL_LINGER_SECS)
            client.sendall(refusal)
            client.shutdown(socket.SHUT_WR)
            while client.recv(65536):
                pass
        except OSError:
            pass
        finally:
            client.close()
            self._refusers.release()

    # -- records ---------------------------------------------------------

    def _record(self, step: str, host: str, port: int, allowed: bool, reason: str) -> EgressRecord:
        with self._lock:
            key = (step, host, port, allowed)
            record = self._records.get(key)
            if record is None and len(self._records) >= MAX_RECORDS:
                key = (step, OTHER_HOST, 0, allowed)
                record = self._records.get(key)
            if record is None:
                record = self._records[key] = EgressRecord(step, key[1], key[2], allowed, reason)
            record.reason = reason
            record.count += 1
            return record

    def _add_bytes(self, record: EgressRecord, out: int = 0, into: int = 0) -> None:
        with self._lock:
            record.bytes_out += out
            record.bytes_in += into

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._live.discard(conn)


class _Connection:
    """One client connection: read its head, decide, connect, then copy both ways."""

    def __init__(self, proxy: EgressProxy, client: socket.socket, step: str):
        self.proxy = proxy
        self.client = client
        self.step = step
        self.upstream: socket.socket | None = None
        self.last_activity = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="egress-conn", daemon=True)
        self._helper: threading.Thread | None = None

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def abort(self) -> None:
        """Wake every blocked read or write of this connection (from another thread)."""
        for sock in (self.client, self.upstream):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _stop_copying(self) -> None:
        """Wake the copying thread without ending the client's reading: the destination both ways,
        the client's sending side only (its reader sees no end until the counts are in)."""
        for sock, how in ((self.upstream, socket.SHUT_RDWR), (self.client, socket.SHUT_RD)):
            if sock is not None:
                try:
                    sock.shutdown(how)
                except OSError:
                    pass

    def _run(self) -> None:
        proxy = self.proxy
        try:
            try:
                request = self._read_request()
                decision = proxy.policy.decide(request.host, request.port)
                if not decision.allowed:
                    status = 400 if decision.reason == BAD_HOST else 403
                    raise Refusal(status, decision.reason, request.host, request.port)
                self.upstream = self._connect(request, decision.addresses)
            except Refusal as refusal:
                proxy._record(self.step, refusal.host, refusal.port, False, refusal.reason)
                detail = (
                    refusal.detail or f"egress to {authority(refusal.host, refusal.port)} refused: {refusal.reason}"
                )
                self._answer_client(refusal.status, refusal.reason, detail)
                return
            record = proxy._record(self.step, request.host, request.port, True, decision.reason)
            self.client.settimeout(proxy.connect_timeout)
            if request.connect:
                self.client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = request.rest
            else:
                first = request.head + request.rest
            if first:
                self.upstream.sendall(first)
                proxy._add_bytes(record, out=len(first))
            self._tunnel(record)
        except OSError:
            pass  # the client or the destination went away; what was copied is counted
        except Exception:
            log.exception("egress proxy %s: connection failed", proxy.socket_path)
        finally:
            self._stop_copying()
            if self._helper is not None:
                self._helper.join()
            _close_gently(self.client)  # the client sees its end only now, every byte counted
            if self.upstream is not None:
                self.upstream.close()
            proxy._forget(self)

    # -- the request -----------------------------------------------------

    def _read_request(self) -> Request:
        proxy = self.proxy
        deadline = time.monotonic() + proxy.head_timeout
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > proxy.max_head_bytes:
                raise Refusal(400, BAD_REQUEST, detail=f"request head longer than {proxy.max_head_bytes} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Refusal(400, BAD_REQUEST, detail=f"no complete request head within {proxy.head_timeout} s")
            self.client.settimeout(remaining)
            try:
                chunk = self.client.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise Refusal(400, BAD_REQUEST, detail="connection closed before a complete request head")
            data += chunk
        if end + 4 > proxy.max_head_bytes:
            raise Refusal(400, BAD_REQUEST, detail=f"request head longer than {proxy.max_head_bytes} bytes")
        return parse_request(data[:end].decode("latin-1"), data[end + 4 :])

    def _connect(self, request: Request, addresses: tuple[str, ...]) -> socket.socket:
        """A connection to the first checked address that answers; no name is resolved here."""
        last: OSError | None = None
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.proxy.connect_timeout)
                sock.connect((address, request.port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        why = (last.strerror if last and last.strerror else str(last)) or "no address"
        raise Refusal(502, CONNECT_FAILED, request.host, request.port,
                       f"could not connect to {authority(request.host, request.port)}: {why}")  # fmt: skip

    def _answer_client(self, status: int, reason: str, detail: str) -> None:
        try:
            self.client.settimeout(5)
            self.client.sendall(answer(status, reason, detail))
        except OSError:
            pass

    # -- copying ---------------------------------------------------------

    def _tunnel(self, record: EgressRecord) -> None:
        """Client to destination in a helper thread, destination to client here.

        A client that half-closes (has sent everything) keeps getting the answer;
        once the destination's side ends, the whole connection ends.
        """
        assert self.upstream is not None
        proxy = self.proxy
        tick = max(0.05, min(proxy.idle_timeout / 4, 15.0))
        for sock in (self.client, self.upstream):
            sock.settimeout(None)  # blocking: the kernel timeouts below bound each wait
            timeval = struct.pack("ll", int(tick), int((tick % 1) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)

        def outgoing() -> None:
            try:
                self._copy(self.client, self.upstream, lambda n: proxy._add_bytes(record, out=n))
                self.upstream.shutdown(socket.SHUT_WR)
            except OSError:
                self.abort()

        self._helper = threading.Thread(target=outgoing, name="egress-out", daemon=True)
        self._helper.start()
        self._copy(self.upstream, self.client, lambda n: proxy._add_bytes(record, into=n))

    def _idle(self) -> bool:
        return time.monotonic() - self.last_activity >= self.proxy.idle_timeout

    def _copy(self, src: socket.socket, dst: socket.socket, count) -> None:
        """Copy until ``src`` ends, or both ways have been quiet for ``idle_timeout``."""
        if self.proxy.use_splice:
            try:
                self._splice(src, dst, count)
                return
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                # splice refused for this pair (an old kernel's socket type): copy through Python
        buffer = memoryview(bytearray(CHUNK))
        while True:
            try:
                n = src.recv_into(buffer)
            except BlockingIOError:  # SO_RCVTIMEO: a quiet moment
                if self._idle():
                    raise TimeoutError("idle") from None
                continue
            if not n:
                return
            self.last_activity = time.monotonic()
            self._send_all(dst, buffer[:n], count)

    def _send_all(self, dst: socket.socket, view: memoryview, count) -> None:
        """Send all of ``view``, counting each piece as it goes: a connection ended between two
        pieces has counted every byte the destination got."""
        while view:
            try:
                sent = dst.send(view)
                count(sent)
                view = view[sent:]
                self.last_activity = time.monotonic()
            except BlockingIOError:  # SO_SNDTIMEO: the reader is slow
                if self._idle():
                    raise TimeoutError("idle") from None

    def _splice(self, src: socket.socket, dst: socket.socket, count) -> None:
        pipe_r, pipe_w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                fcntl.fcntl(pipe_w, _F_SETPIPE_SZ, CHUNK)
            except OSError:
                pass  # the default 64 KiB pipe works, in more, smaller steps
            src_fd, dst_fd = src.fileno(), dst.fileno()
            while True:
                try:
                    n = os.splice(src_fd, pipe_w, CHUNK)
                except BlockingIOError:
                    if self._idle():
                        raise TimeoutError("idle") from None
                    continue
                if not n:
                    return
                self.last_activity = time.monotonic()
                left = n
                while left:
                    try:
                        sent = os.splice(pipe_r, dst_fd, left)
                        count(sent)  # piece by piece: an end between two pieces loses no count
                        left -= sent
                        self.last_activity = time.monotonic()
                    except BlockingIOError:
                        if self._idle():
                            raise TimeoutError("idle") from None
        finally:
            os.close(pipe_r)
            os.close(pipe_w)


def _close_gently(sock: socket.socket) -> None:
    """Close a Unix socket after dropping what the peer sent and we did not read.

    Closed with unread data, a Unix socket makes the peer's next read fail with
    ECONNRESET instead of ending: the client would not see our answer end cleanly.
    """
    try:
        sock.shutdown(socket.SHUT_WR)
        for _ in range(16):
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                break
    except OSError:
        pass
    sock.close()
