"""Hold a tier's TTFT target by throttling the concurrency lent to lower tiers (AIMD).

Why this module exists: a TierPolicy's ``ttftP95Target`` is a promise about latency that KV
accounting alone cannot keep: a lower tier running on borrowed capacity fills the engine's
batch and every prefill of the protected tier waits behind its decodes. The gateway
measures the protected tier's time to first token (it proxies the stream) and this limiter
sets how many lower-tier requests may run on *borrowed* capacity (floors are never
touched: a tier's own floor is guaranteed whatever the limiter says).

AIMD, decided once per ``interval`` samples: with the p95 of the window above the target,
the limit is multiplied by ``decrease`` (at least ``minimum``); with it below ``slack`` x
target, the limit grows by one (up to ``maximum``); in between it holds.

**A sample counts once.** A decrease empties the window: the next decision judges only
samples that arrived after it (the rule of the rollout gates' ``failureCountedAt``). A
window that still held the slow samples would halve the limit again on the same evidence
at every decision - three slow first tokens in a 50-sample window took the limit from 20
to 0 in five decisions.

**An idle protected tier throttles nobody.** With no sample for ``idle_seconds`` (the
protected tier sent nothing that finished: nothing of it can be slowed down), the limit
goes back to ``maximum`` and the window is emptied (:meth:`LentLimiter.idle`, called on
every engine poll with the time).

Worked example (target 0.1 s, limit 8, window 10, interval 10, decrease 0.5, slack 0.8):

    10 samples, p95 0.25 s -> limit 4 (window emptied);  10 more, p95 0.15 -> 2
    10 more, p95 0.09 -> 2 (hold);  10 more, p95 0.05 -> 3;  10 more -> 4 ...
    no sample for idle_seconds (5 s)                 -> 8
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class LentLimiter:
    """Concurrency lent to tiers below a protected tier, driven by its TTFT p95."""

    target_seconds: float  # the protected tier's ttftP95Target
    maximum: int  # the limit with no pressure (e.g. the pool's slots)
    minimum: int = 0  # never below (0: lower tiers may be held to their floors)
    window: int = 50  # TTFT samples the p95 is taken over
    interval: int = 10  # samples between decisions
    decrease: float = 0.5  # multiplicative decrease
    slack: float = 0.8  # grow only below slack x target
    idle_seconds: float = 5.0  # no sample for this long: the protected tier is idle
    limit: int = field(default=-1)  # current limit (initialised to maximum)
    _samples: deque[float] = field(default_factory=deque)
    _since: int = 0
    p95: float | None = None  # the p95 at the last decision (None: none since idle)
    last_sample_at: float | None = None  # when the last sample came (None: never, or unknown)

    def __post_init__(self) -> None:
        if self.limit < 0:
            self.limit = self.maximum

    def observe(self, ttft_seconds: float, now: float | None = None) -> bool:
        """One TTFT sample of the protected tier (at ``now``); True when the limit changed."""
        if now is not None:
            self.last_sample_at = now
        self._samples.append(ttft_seconds)
        if len(self._samples) > self.window:
            self._samples.popleft()
        self._since += 1
        if self._since < self.interval:
            return False
        self._since = 0
        ordered = sorted(self._samples)
        self.p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
        before = self.limit
        if self.p95 > self.target_seconds:
            self.limit = max(self.minimum, math.floor(self.limit * self.decrease))
            self._samples.clear()  # these samples are counted: the next decision needs new ones
        elif self.p95 < self.slack * self.target_seconds:
            self.limit = min(self.maximum, self.limit + 1)
        return self.limit != before

    def idle(self, now: float) -> bool:
        """The time is ``now``: with no sample for ``idle_seconds``, back to ``maximum``.
        True when the limit changed."""
        if self.last_sample_at is None or now - self.last_sample_at < self.idle_seconds:
            return False
        if not self._samples and self.limit == self.maximum:
            return False
        before = self.limit
        self.limit = self.maximum
        self._samples.clear()
        self._since = 0
        self.p95 = None
        return self.limit != before

    def resize(self, maximum: int) -> None:
        """The pool's plan changed: a new ceiling (the limit is clamped to it)."""
        self.maximum = maximum
        self.limit = min(self.limit, maximum)
