"""gunicorn's sync worker, whose event streams (SPEC §18) are written by threads of their own.

1. The API keeps the sync worker: one request at a time per process, each on a connection of
   its own, accepted by whichever process is free. Under gunicorn's ``gthread`` worker (a
   thread per request) the API's GET cost ~0.4 ms more CPU and its p99 under 32 clients was
   2.5 times as long: kept-alive connections stay with the process that accepted them, busy
   or not (bench/RESULTS.md, issue 28).
2. A stream's request is served as any other up to its headers: the token, the checks, the
   slot (evaluations/api/events.py). A 200 ``text/event-stream`` response is then handed to
   a thread of the process, which writes it on a duplicate of the connection while the sync
   worker goes back to accepting: it takes none of the few synchronous workers for longer
   than its checks.
3. From the hand-off on, gunicorn's own writes and its closing half-shutdown on its socket
   are no-ops (``HandOffSocket``): the access log still has its line, and the client gets
   one response, written by the thread: HTTP/1.1, ``Connection: close``, the body as the
   events come (delimited by the connection's end: SSE needs no chunking).
4. A write blocks at most EVENT_SEND_TIMEOUT_SECS (SO_SNDTIMEO, set by the view on the
   socket both ends share); then the stream ends, its slot is freed and the connection
   closed. Threads are daemons: SIGTERM ends the streams first (evaluations/events/hub.py
   stop_streams), and whatever still blocks in a write does not hold the process's exit.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from http import HTTPStatus

from gunicorn import util
from gunicorn.workers.sync import SyncWorker

logger = logging.getLogger("term_executor.api")

STREAM_PATH = re.compile(r"/(?:evaluate|batches)/[^/]+/events")


class HandOffSocket(socket.socket):
    """gunicorn's client socket; ``take`` gives a duplicate to a stream's thread, and from then on
    gunicorn's writes and its closing shutdown and drain do nothing (the thread owns the connection)."""

    handed_off = False

    def take(self) -> socket.socket:
        duplicate = socket.socket(self.family, self.type, self.proto, fileno=os.dup(self.fileno()))
        self.handed_off = True
        return duplicate

    def sendall(self, data, *args):
        return None if self.handed_off else super().sendall(data, *args)

    def send(self, data, *args):
        return len(data) if self.handed_off else super().send(data, *args)

    def shutdown(self, how):
        if not self.handed_off:
            super().shutdown(how)

    def recv(self, size, *args):
        return b"" if self.handed_off else super().recv(size, *args)


class StreamingSyncWorker(SyncWorker):
    """SyncWorker accepting into a HandOffSocket; ``hand_off_streams`` (installed in post_worker_init) hands."""

    def accept(self, listener):
        client, addr = listener.accept()
        client = HandOffSocket(client.family, client.type, client.proto, fileno=client.detach())
        client.setblocking(1)
        util.close_on_exec(client)
        self.handle(listener, client, addr)


def hand_off_streams(app):
    """``app`` as a WSGI application whose 200 event-stream responses a thread writes (see the module)."""

    def application(environ, start_response):
        client = environ.get("gunicorn.socket")
        if (
            not isinstance(client, HandOffSocket)
            or environ.get("REQUEST_METHOD") != "GET"
            or not STREAM_PATH.fullmatch(environ.get("PATH_INFO", ""))
        ):
            return app(environ, start_response)
        reply: dict = {}

        def keep(status, headers, exc_info=None):
            reply.update(status=status, headers=headers)
            return lambda data: None  # the write() of WSGI 1: Django never calls it

        body = app(environ, keep)
        start_response(reply["status"], reply["headers"])  # gunicorn's access line and its (void) writes
        if not reply["status"].startswith(f"{HTTPStatus.OK.value} "):
            return body  # a refusal, a 204: gunicorn writes it as any response
        head = _head(environ, reply["status"], reply["headers"])
        connection = client.take()
        threading.Thread(target=_write, args=(connection, head, body), name="event-stream", daemon=True).start()
        return []

    return application


def _head(environ, status: str, headers) -> bytes:
    lines = [f"{environ.get('SERVER_PROTOCOL', 'HTTP/1.1')} {status}"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in ("connection", "content-length")]
    lines += ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _write(connection: socket.socket, head: bytes, body) -> None:
    """The response, event by event; then close the body (its slot and subscription) and the connection."""
    try:
        connection.sendall(head)
        for chunk in body:
            if chunk:
                connection.sendall(chunk)
    except OSError:
        pass  # the client went, or stopped reading for EVENT_SEND_TIMEOUT_SECS: the stream ends
    except Exception:  # the database went away mid-stream: the client reconnects with Last-Event-ID
        logger.exception("event stream ended by an error")
    finally:
        try:
            if hasattr(body, "close"):
                body.close()
        finally:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()
