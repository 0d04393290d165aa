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

from kvpool.domain.admission.amount import ZERO, Amount

PEAK_WINDOW_SECONDS = 5.0  # a tier's "peak" demand: the largest of this long
# a tier "arrives" at a replica if it had demand there this recently: long enough that a
# tier sent to a replica every few seconds is not forgotten between two of its requests
PRESENCE_WINDOW_SECONDS = 30.0


class PeakWindow:
    """The largest value of each key over the last ``window`` seconds."""

    def __init__(self, window: float = PEAK_WINDOW_SECONDS) -> None:
        self.window = window
        self._samples: dict[str, deque[tuple[float, Amount]]] = {}

    def observe(self, now: float, values: dict[str, Amount]) -> dict[str, Amount]:
        out: dict[str, Amount] = {}
        for key in set(values) | set(self._samples):
            samples = self._samples.setdefault(key, deque())
            if key in values:
                samples.append((now, values[key]))
            while samples and samples[0][0] < now - self.window:
                samples.popleft()
            if not samples:
                del self._samples[key]
                continue
            peak = ZERO
            for _, value in samples:
                peak = peak.max(value)
            out[key] = peak
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
