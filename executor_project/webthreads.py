"""gunicorn's ``gthread`` worker, with the API kept to WEB_THREADS requests at once per process.

1. A sync worker serves one request at a time, so an event stream (SPEC §18), which lasts as
   long as its evaluation, would hold one of the few web processes for all that time. Under
   gthread each request has a thread: threads = WEB_THREADS + MAX_EVENT_STREAMS, made only as
   needed (ThreadPoolExecutor), so streams never wait for an API thread, nor the API for a stream's.
2. The API's requests (every one but the streams) pass a semaphore of WEB_THREADS per process,
   held until their response is sent: at most that many render at once, as many as the CPUs
   and memory were sized for, however many streams are open.
3. An idle stream is a thread blocked on an Event: no CPU, its stack mostly untouched (the
   figures, with 200 streams open, are in bench/RESULTS.md, issue 28).
"""

from __future__ import annotations

import re
import threading

STREAM_PATH = re.compile(r"/(?:evaluate|batches)/[^/]+/events")


def limit_api_requests(app, limit: int):
    """``app`` as a WSGI application that lets at most ``limit`` requests other than streams run at once."""
    gate = threading.BoundedSemaphore(limit)

    def application(environ, start_response):
        if STREAM_PATH.fullmatch(environ.get("PATH_INFO", "")):
            return app(environ, start_response)
        gate.acquire()
        try:
            response = app(environ, start_response)
        except BaseException:
            gate.release()
            raise
        return _Gated(response, gate)

    return application


class _Gated:
    """The response's chunks; ``close`` (after the last is sent, or the client went) lets the next request in."""

    def __init__(self, response, gate: threading.BoundedSemaphore):
        self.response = response
        self.gate = gate

    def __iter__(self):
        return iter(self.response)

    def close(self) -> None:
        try:
            if hasattr(self.response, "close"):
                self.response.close()
        finally:
            self.gate.release()
