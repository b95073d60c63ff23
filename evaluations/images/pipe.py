"""The uncompressed stream of a layer, from the thread reading it (and hashing, decompressing) to
the thread reading the tar (images/unpack.py).

1. At most READ_AHEAD chunks wait: the reading thread waits for the tar's, never more than that
   far ahead (a layer's bytes are not staged, on disk or in memory).
2. The stream's end, or the exception that ended it, is met by the tar's thread where the stream
   had it: what one thread reading both would have met, in the same order.
3. A tar thread that gives up abandons the pipe: ``put`` then returns False at once, and the
   reading thread stops.
"""

from __future__ import annotations

import threading
from collections import deque

READ_AHEAD = 8  # chunks the reading thread may be ahead of the tar's


class Pipe:
    """The uncompressed stream from the caller's thread to the tar's: chunks, then b"" (its end) or
    the exception that ended it; at most READ_AHEAD chunks waiting. ``put`` is False once the tar's
    thread has given up (``abandon``)."""

    def __init__(self):
        self._ready = threading.Condition()
        self._chunks: deque = deque()
        self._abandoned = False
        self._head, self._offset = b"", 0
        self._end: BaseException | bool = False  # True: b"" came; an exception: it came

    def put(self, item: bytes | BaseException) -> bool:
        with self._ready:
            while len(self._chunks) >= READ_AHEAD and not self._abandoned:
                self._ready.wait()
            if self._abandoned:
                return False
            self._chunks.append(item)
            self._ready.notify_all()
            return True

    def abandon(self) -> None:
        with self._ready:
            self._abandoned = True
            self._chunks.clear()
            self._ready.notify_all()

    def read(self, size: int = -1) -> bytes:
        if self._offset >= len(self._head):
            if self._end is not False:
                if self._end is True:
                    return b""
                raise self._end
            with self._ready:
                while not self._chunks:
                    self._ready.wait()
                item = self._chunks.popleft()
                self._ready.notify_all()
            if isinstance(item, BaseException) or not item:
                self._end = item if item else True
                return self.read(size)
            self._head, self._offset = item, 0
        end = len(self._head) if size is None or size < 0 else self._offset + size
        data = self._head[self._offset : end]
        self._offset += len(data)
        return data
