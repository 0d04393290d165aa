"""The peak of each tier's demand over the last few seconds, and which tiers arrived
lately, as a replica reports them.

Why this module exists: leases place floors by each replica's *peak* demand of a tier
(:mod:`.allocation`), so that a tier whose requests come and go keeps its floor where it
arrives instead of losing it between two requests. Pure: the caller passes ``now``.

>>> from kvpool.domain.admission.amount import Amount
>>> w = PeakWindow(window=5.0)
>>> w.observe(0.0, {"chat": Amount(10, 1)})
{'chat': Amount(tokens=10, slots=1)}
>>> w.observe(4.0, {"chat": Amount(5, 1)})["chat"]
Amount(tokens=10, slots=1)
>>> w.observe(6.0, {})["chat"]
Amount(tokens=5, slots=1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvpool.domain.admission.amount import Amount

PEAK_WINDOW_SECONDS = 5.0  # a tier's "peak" demand: the largest of this long
# a tier "arrives" at a replica if it had demand there this recently: long enough that a
# tier sent to a replica every few seconds is not forgotten between two of its requests
PRESENCE_WINDOW_SECONDS = 30.0


class _RunningMax:
    """The largest of one number over a sliding window: a deque of (time, value) in which
    every value is larger than all after it (a new value drops the smaller ones before
    it, which can never be the largest again), so the head is the maximum and each
    observation costs O(1) amortized. A replica observes its demand at every renewal,
    20 times a second under a flood; scanning 5 s of samples at each was a seventh of
    its renewal samples in a profile."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: deque[tuple[float, int]] = deque()

    def add(self, now: float, value: int) -> None:
        queue = self._queue
        while queue and queue[-1][1] <= value:
            queue.pop()
        queue.append((now, value))

    def expire(self, before: float) -> None:
        queue = self._queue
        while queue and queue[0][0] < before:
            queue.popleft()

    @property
    def empty(self) -> bool:
        return not self._queue

    @property
    def peak(self) -> int:
        return self._queue[0][1]


class PeakWindow:
    """The largest value of each key over the last ``window`` seconds (tokens and slots
    each at their own largest, as :meth:`Amount.max` combines them)."""

    def __init__(self, window: float = PEAK_WINDOW_SECONDS) -> None:
        self.window = window
        self._maxima: dict[str, tuple[_RunningMax, _RunningMax]] = {}

    def observe(self, now: float, values: dict[str, Amount]) -> dict[str, Amount]:
        out: dict[str, Amount] = {}
        for key in set(values) | set(self._maxima):
            maxima = self._maxima.get(key)
            if maxima is None:
                maxima = self._maxima[key] = (_RunningMax(), _RunningMax())
            tokens, slots = maxima
            value = values.get(key)
            if value is not None:
                tokens.add(now, value.tokens)
                slots.add(now, value.slots)
            tokens.expire(now - self.window)
            slots.expire(now - self.window)
            if tokens.empty or slots.empty:
                del self._maxima[key]
                continue
            out[key] = Amount(tokens.peak, slots.peak)
        return out


class Presence:
    """The keys seen within the last ``window`` seconds (one timestamp a key: no samples
    kept, unlike :class:`PeakWindow`).

    >>> p = Presence(window=30.0)
    >>> sorted(p.observe(0.0, ["chat"]))
    ['chat']
    >>> sorted(p.observe(29.0, ["batch"]))
    ['batch', 'chat']
    >>> sorted(p.observe(31.0, []))
    ['batch']
    """

    def __init__(self, window: float = PRESENCE_WINDOW_SECONDS) -> None:
        self.window = window
        self._last: dict[str, float] = {}

    def observe(self, now: float, keys: Iterable[str]) -> frozenset[str]:
        for key in keys:
            self._last[key] = now
        for key in [k for k, t in self._last.items() if t < now - self.window]:
            del self._last[key]
        return frozenset(self._last)
