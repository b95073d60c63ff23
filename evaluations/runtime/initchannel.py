"""The host's end of the sandbox init's socket (``init.c`` says the protocol).

``InitChannel()`` makes the socket pair; ``init_fd`` goes to the sandbox (``Spawner.run``'s
``pass_fds``) and is closed here once the init said it runs (``wait_ready``). ``start`` asks the
init to start one exec with the descriptors given (its stdin, stdout, stderr: the host's own pipes,
so what the exec prints never passes through the init) and returns once it started or could not;
``Exec.wait`` waits for its end; ``signal`` reaches its process group. One reader thread hears
every answer and hands it to the exec it names; when the init's end closes (the sandbox ended),
every exec still waiting learns it.

What the init answers is the sandbox's own word (DESIGN: root in the sandbox can ptrace it): an
exit status the caller shows, never something the host's own safety rests on.
"""

from __future__ import annotations

import os
import socket
import threading


def exec_request(uid: int, gid: int, cwd: str, argv: list[str], env: dict[str, str]) -> int:
    """An exec's fields as the init reads them (init.c), in a memfd the caller closes once sent."""
    fields = [str(uid), str(gid), cwd, str(len(argv)), *argv, str(len(env)), *(f"{k}={v}" for k, v in env.items())]
    payload = b"".join(field.encode("utf-8", "surrogateescape") + b"\0" for field in fields)
    request = os.memfd_create("sandbox-exec", os.MFD_CLOEXEC)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(request, view) :]
    except BaseException:
        os.close(request)
        raise
    return request


class InitGone(Exception):
    """The init's end closed: the sandbox has ended (or never started)."""


class ExecStartError(OSError):
    """The init could not start the exec (fork failed, a malformed request, too many at once)."""


class Exec:
    def __init__(self, exec_id: int):
        self.id = exec_id
        self.pid: int | None = None
        self.start_errno: int | None = None
        self.status: int | None = None  # waitpid's status once ended
        self.gone = False  # the sandbox ended before this exec did
        self._started = threading.Event()
        self._ended = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        """True once it ended (``status``) or the sandbox did (``gone``)."""
        return self._ended.wait(timeout)


class InitChannel:
    def __init__(self):
        self._host, self._init = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._init.set_inheritable(True)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._execs: dict[int, Exec] = {}
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="sandbox-init-reader", daemon=True)
        self._reader.start()

    @property
    def init_fd(self) -> int:
        return self._init.fileno()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def wait_ready(self, timeout: float) -> bool:
        """True once the init said it runs; then our copy of its end is closed, so that its exit
        is this channel's end of file."""
        if not self._ready.wait(timeout):
            return False
        self.close_init_end()
        return True

    def close_init_end(self) -> None:
        """Close our copy of the init's end once the sandbox holds its own (started): then an init
        that dies before it is ready is this channel's end of file at once, not a timeout."""
        if self._init.fileno() >= 0:
            self._init.close()

    def start(self, exec_id: int, request: int, stdin: int, stdout: int, stderr: int, *, wait: bool = True) -> Exec:
        """Ask the init to start exec ``exec_id`` (``request``: a memfd of its fields); wait for its answer.

        ``wait=False``: return once asked; a start that failed then ends the exec at once, with
        ``start_errno`` (a live sandbox's exec reads its pipes meanwhile: one hand-off less)."""
        entry = Exec(exec_id)
        with self._lock:
            if self._closed.is_set():
                raise InitGone("the sandbox has ended")
            self._execs[exec_id] = entry
        try:
            self._send(f"E {exec_id}".encode(), [request, stdin, stdout, stderr])
        except OSError:
            self._forget(exec_id)
            raise InitGone("the sandbox has ended") from None
        if not wait:
            return entry
        while not entry._started.wait(1.0):
            if self._closed.is_set():
                break
        if entry.start_errno is not None:
            self._forget(exec_id)
            raise ExecStartError(entry.start_errno, os.strerror(entry.start_errno))
        if entry.pid is None:
            self._forget(exec_id)
            raise InitGone("the sandbox ended before the exec started")
        return entry

    def signal(self, exec_id: int, signum: int) -> None:
        """Signal the exec's process group (nothing if it already ended or the sandbox did)."""
        try:
            self._send(f"K {exec_id} {signum}".encode(), [])
        except OSError:
            pass

    def forget(self, entry: Exec) -> None:
        self._forget(entry.id)

    def close(self) -> None:
        """Close our end: the init exits, and with it the sandbox."""
        for sock in (self._host, self._init):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._reader.join(timeout=5)

    def _send(self, message: bytes, fds: list[int]) -> None:
        with self._send_lock:
            if fds:
                socket.send_fds(self._host, [message], fds)
            else:
                self._host.send(message)

    def _forget(self, exec_id: int) -> None:
        with self._lock:
            self._execs.pop(exec_id, None)

    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self._host.recv(256)
                except OSError:
                    break
                if not message:
                    break
                self._dispatch(message)
        finally:
            with self._lock:
                self._closed.set()
                waiting = list(self._execs.values())
                self._execs.clear()
            self._ready.set()
            for entry in waiting:
                entry.gone = True
                entry._started.set()
                entry._ended.set()

    def _dispatch(self, message: bytes) -> None:
        try:
            kind, exec_id, value = message.decode("ascii").split(" ")
            exec_id, value = int(exec_id), int(value)
        except ValueError:
            return  # not the protocol: the sandbox's own word, ignored
        if kind == "R":
            self._ready.set()
            return
        with self._lock:
            entry = self._execs.get(exec_id)
            if entry is not None and kind == "X":
                del self._execs[exec_id]
        if entry is None:
            return
        if kind == "S":
            entry.pid = value
            entry._started.set()
        elif kind == "F":
            with self._lock:
                self._execs.pop(exec_id, None)
            entry.start_errno = value or 22
            entry._started.set()
            entry._ended.set()
        elif kind == "X":
            entry.status = value
            entry._started.set()
            entry._ended.set()
