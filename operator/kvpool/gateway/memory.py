"""Give the memory of cut clients back to the operating system.

Why this module exists: a client that stops reading a stream is cut after the idle
timeout (:mod:`kvpool.gateway.upstream`), and what was buffered for it is freed at once -
but glibc's allocator keeps freed heap pages mapped (its mmap threshold grows with the
large buffers a relay frees), so the gateway's RSS stayed at its peak: 40 stalled 5 MiB
streams took it from 84 to 191 MiB, where it stayed after every one of them was released.
:class:`MemoryTrimmer` calls ``malloc_trim(0)`` (which also returns free pages in the
middle of the heap) shortly after clients were cut, at most once per ``interval``; a few
milliseconds on a heap of a few hundred MiB. Where there is no glibc (musl, macOS) it
does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

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
    """Schedules ``malloc_trim(0)`` on the running loop, coalesced."""

    def __init__(self, delay: float = 0.5, interval: float = 1.0) -> None:
        self.delay = delay  # after the first request for a trim
        self.interval = interval  # at most one trim per interval
        self._trim = _load_malloc_trim()
        self._scheduled: asyncio.TimerHandle | None = None
        self._last = float("-inf")
        self.trims = 0

    def soon(self) -> None:
        """Trim a little later (buffers of the cut connections are freed meanwhile)."""
        if self._trim is None or self._scheduled is not None:
            return
        loop = asyncio.get_running_loop()
        when = max(loop.time() + self.delay, self._last + self.interval)
        self._scheduled = loop.call_at(when, self._run)

    def _run(self) -> None:
        self._scheduled = None
        self._last = asyncio.get_running_loop().time()
        if self._trim is not None:
            self._trim(0)
            self.trims += 1

    def cancel(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
