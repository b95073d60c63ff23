"""What unpack.py's threads hand each other: the uncompressed stream (``Pipe``, from the thread
reading it to the thread reading the tar) and the files to make (``Writers``, from the tar's thread
to the threads making them).

1. ``Pipe`` holds at most READ_AHEAD chunks: the stream's thread waits for the tar's, never the
   other way round for longer than a chunk. The stream's end, or the exception that ended it, is
   met by the tar's thread where the stream had it. A tar thread that gives up abandons the pipe,
   so the stream's thread stops feeding it.
2. ``Writers`` keeps the stream's order for every path: before the tar's thread looks at a path,
   at a folder above it, or removes a folder with something pending below, what is pending there
   is finished (``settle``, ``settle_path``, ``settle_below``). What is pending is bounded (PENDING).
3. A failed write is raised by the next call of the tar's thread, as the earliest failure in the
   stream's order (the one a single thread would have met first); ``close`` joins every thread.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

READ_AHEAD = 8  # chunks the stream's thread may be ahead of the tar's
PENDING = (256, 32 << 20)  # at most so many writes, of so many bytes, pending at once


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


class Writers:
    """Regular files and symbolic links made by ``threads`` threads (none: at once, in the caller's)
    while the tar is read on. Each path's operations keep the stream's order (``settle``); the
    pending ones are bounded by PENDING. Used by the tar's thread only."""

    def __init__(self, threads: int):
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="unpack-writer") if threads > 0 else None
        self.pending: dict[tuple[str, ...], Future] = {}  # the latest write at each path
        self.queue: deque[tuple[tuple[str, ...], Future, int]] = deque()  # in the stream's order
        self.bytes = 0
        self.failed = threading.Event()  # a write raised: the next call raises the earliest failure

    def submit(self, parts: tuple[str, ...], size: int, make, dir_fd: int, *args) -> None:
        """``make(own_fd, *args)``, which makes what is at ``parts`` in the folder ``dir_fd`` (``own_fd``:
        a duplicate of it, which ``make`` closes), with ``size`` bytes of data held meanwhile."""
        if self.pool is None:
            make(os.dup(dir_fd), *args)
            return
        if self.failed.is_set():
            self.close()
        while self.queue and (
            self.queue[0][1].done() or len(self.queue) >= PENDING[0] or self.bytes + size > PENDING[1]
        ):
            self._retire()
        own_fd = os.dup(dir_fd)
        try:
            future = self.pool.submit(make, own_fd, *args)
        except BaseException:
            os.close(own_fd)
            raise
        future.add_done_callback(self._done)
        self.pending[parts] = future
        self.queue.append((parts, future, size))
        self.bytes += size

    def settle(self, parts: tuple[str, ...]) -> None:
        """What is pending at ``parts`` made (a member is about to look there)."""
        future = self.pending.pop(parts, None) if self.pending else None
        if future is not None:
            self._wait(future)

    def settle_path(self, parts: list[str]) -> None:
        """What is pending at ``parts`` or at any folder above it made."""
        if self.pending:
            for depth in range(1, len(parts) + 1):
                self.settle(tuple(parts[:depth]))

    def settle_below(self, parts: list[str]) -> None:
        """What is pending anywhere below the folder ``parts`` made (it is about to be removed)."""
        size = len(parts)
        for path in [path for path in self.pending if list(path[:size]) == parts]:
            self.settle(path)

    def _done(self, future: Future) -> None:
        if future.exception() is not None:
            self.failed.set()

    def _wait(self, future: Future) -> None:
        try:
            future.result()
        except BaseException:
            self.close()  # raises the earliest failure: this one or one before it
            raise

    def _retire(self) -> None:
        parts, future, size = self.queue[0]
        self._wait(future)
        self.queue.popleft()
        self.bytes -= size
        if self.pending.get(parts) is future:
            del self.pending[parts]

    def close(self) -> None:
        """Every pending write finished (each may fail for an earlier member than the one the caller
        is failing on: none is dropped), the threads joined; the earliest failure raised."""
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        pool.shutdown(wait=True)
        queue, self.queue = self.queue, deque()
        self.pending.clear()
        for _, future, _ in queue:
            if future.exception() is not None:
                raise future.exception()
