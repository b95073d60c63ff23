"""A real HTTP server on 127.0.0.1 that answers what a test told it to and records what it received.

For the client's own tests: they check the requests the client really puts on the wire (method,
path, query, headers, body) and how it reads real answers. It plays no sandbox: the service's own
behaviour is tested against the real service (tests/sandboxes/ in the repository).

    with RecordingServer() as server:
        server.answer("POST", "/sandboxes", 201, {"sandbox_id": "sb1", "status": "ready"})
        server.answer_in_turn("GET", "/sandboxes/sb1", [(200, STARTING), (200, READY)])  # the last repeats
        ...
        server.requests[-1].json()

A path with no answer gets 404 and the service's envelope ``{"error": "not_found", ...}``; an
answer of status 0 hangs up without a word.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from urllib.parse import parse_qs, urlsplit


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self):
        return json.loads(self.body)

    def parts(self) -> dict[str, tuple[str | None, bytes]]:
        """A multipart/form-data body: part name -> (its file name, its bytes)."""
        head = f"Content-Type: {self.headers['content-type']}\r\n\r\n".encode()
        message = BytesParser(policy=HTTP).parsebytes(head + self.body)
        assert message.is_multipart(), self.headers["content-type"]
        found = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            found[name] = (part.get_filename(), part.get_payload(decode=True))
        return found


@dataclass
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] | None = None


Responder = Callable[[Recorded], Answer]


def as_answer(status: int, body=None, headers: dict[str, str] | None = None) -> Answer:
    if isinstance(body, bytes):
        return Answer(status, body, headers)
    if body is None:
        return Answer(status, b"", headers)
    return Answer(status, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})})


class RecordingServer:
    def __init__(self):
        self.requests: list[Recorded] = []
        self._answers: dict[tuple[str, str], list[Answer] | Responder] = {}
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, method: str, path: str, status: int, body=None, headers: dict[str, str] | None = None) -> None:
        """Answer every ``method path`` with ``status`` and ``body`` (JSON unless bytes or None)."""
        self._answers[(method, path)] = [as_answer(status, body, headers)]

    def answer_in_turn(self, method: str, path: str, answers: list[tuple[int, object]]) -> None:
        """Answer ``method path`` with each ``(status, body)`` in turn, the last one repeating."""
        self._answers[(method, path)] = [as_answer(status, body) for status, body in answers]

    def respond(self, method: str, path: str, responder: Responder) -> None:
        """Answer ``method path`` with whatever ``responder(request)`` returns."""
        self._answers[(method, path)] = responder

    def received(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if (method is None or r.method == method) and (path is None or r.path == path)]

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        split = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        recorded = Recorded(
            handler.command,
            split.path,
            {key: values[-1] for key, values in parse_qs(split.query).items()},
            {key.lower(): value for key, value in handler.headers.items()},
            body,
        )
        with self._lock:
            self.requests.append(recorded)
            answers = self._answers.get((handler.command, split.path))
            if answers is None:
                answer = as_answer(
                    404, {"error": "not_found", "detail": f"no answer for {handler.command} {split.path}"}
                )
            elif callable(answers):
                answer = None
            else:
                answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer is None:
            answer = answers(recorded)
        if answer.status == 0:  # hang up without answering, as a service that died mid-request
            handler.close_connection = True
            return
        try:
            handler.send_response(answer.status)
            for key, value in (answer.headers or {}).items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(answer.body)))
            handler.end_headers()
            handler.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a cancelled request): nothing to tell it

    def __enter__(self) -> RecordingServer:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            do_GET = do_POST = do_PUT = do_DELETE = lambda self: owner._handle(self)  # noqa: E731

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
