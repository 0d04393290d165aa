"""Give the memory of cut clients back to the operating system.

Why this module exists: a client that stops reading a stream is cut after the idle
timeout (:mod:`kvpool.gateway.upstream`), and what was buffered for it is freed at once -
but glibc's allocator keeps freed heap pages mapped (its mmap threshold grows with the
large buffers a relay frees), so the gateway's RSS stayed at its peak: 40 stalled 5 MiB
streams took it from 84 to 191 MiB, where it stayed after every one of them was released.
:class:`MemoryTrimmer` calls ``malloc_trim(0)`` (which also returns free pages in the
middle of the heap) shortly after a request ended other than ``ok`` (a client cut or
gone, a stream broken or timed out: when the relay stalls, the engine side's idle timeout
may fire before the client write's), at most once per ``interval``; a few milliseconds
on a heap of a few hundred MiB. Where there is no glibc (musl, macOS) it
does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import Literal

log = logging.getLogger("kvpool.gateway")


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class MemoryTrimmer:
    """Schedules ``malloc_trim(0)`` on the running loop, coalesced.

    Every request for a trim is followed by a trim at least ``delay`` later (the cut
    connections' buffers are freed in between), and trims are at least ``interval`` apart.
    A request that comes while a trim is already scheduled is not dropped: if it comes
    less than ``delay`` before that trim runs, another trim follows. Before, such requests
    were ignored, and when the last of 300 cut streams freed its buffers after the one
    scheduled trim had run, nothing trimmed again (CI once read 599 MiB of 90 after 15 s).
    """

    def __init__(
        self,
        delay: float = 0.5,
        interval: float = 1.0,
        trim: Callable[[int], int] | Literal["libc"] | None = "libc",
        on_trim: Callable[[], None] = lambda: None,
    ) -> None:
        self.delay = delay  # after the latest request for a trim
        self.interval = interval  # at most one trim per interval
        self._trim = _load_malloc_trim() if trim == "libc" else trim
        self._scheduled: asyncio.TimerHandle | None = None
        self._last = float("-inf")  # when the latest trim ran
        self._wanted = float("-inf")  # when the latest trim was asked for
        self.trims = 0
        self._on_trim = on_trim  # e.g. a metric's inc

    def soon(self) -> None:
        """Trim a little later (buffers of the cut connections are freed meanwhile)."""
        if self._trim is None:
            return
        loop = asyncio.get_running_loop()
        self._wanted = loop.time()
        if self._scheduled is None:
            self._schedule(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        when = max(self._wanted + self.delay, self._last + self.interval)
        self._scheduled = loop.call_at(when, self._run)

    def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._scheduled = None
        self._last = loop.time()
        if self._trim is not None:
            self._trim(0)
            self.trims += 1
            self._on_trim()
        if self._wanted + self.delay > self._last:  # asked for since: its buffers may be live
            self._schedule(loop)

    def cancel(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
