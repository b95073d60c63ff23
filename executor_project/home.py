"""What a person opening the service's root in a browser gets: a short page, and an icon.

The service has no site of its own; its pages are the API's docs and the admin.
"""

from __future__ import annotations

import struct
import zlib

from django.http import HttpResponse

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>term-executor</title>
<link rel="icon" href="/favicon.ico"></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto; line-height: 1.5">
<h1>term-executor</h1>
<p>A remote evaluation executor for coding agents. This service has an HTTP API and an admin:</p>
<ul>
<li><a href="/api/docs">/api/docs</a>: the API, every route and field (<a href="/api/schema">OpenAPI document</a>)</li>
<li><a href="/admin/">/admin/</a>: the operators' view of evaluations and workers</li>
<li><a href="/health">/health</a>, <a href="/status">/status</a>, <a href="/metrics">/metrics</a></li>
</ul>
</body></html>
"""


def home(request):
    return HttpResponse(PAGE, content_type="text/html; charset=utf-8")


def _png(size: int, rgb: tuple[int, int, int]) -> bytes:
    """A square of one colour: the smallest icon a browser accepts, made here rather than kept as a binary file."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _ico(png: bytes, size: int) -> bytes:
    """An ICO holding one PNG image (Windows Vista's format, which every browser reads)."""
    directory = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", size, size, 0, 0, 1, 32, len(png), 6 + 16)
    return directory + entry + png


FAVICON = _ico(_png(16, (0x41, 0x76, 0x8C)), 16)  # the admin header's blue-grey


def favicon(request):
    response = HttpResponse(FAVICON, content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
