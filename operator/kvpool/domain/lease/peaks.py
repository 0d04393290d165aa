"""The peak of each tier's demand over the last few seconds, as a replica reports it.

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

from kvpool.domain.admission.amount import ZERO, Amount

PEAK_WINDOW_SECONDS = 5.0  # a tier's "peak" demand: the largest of this long


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
