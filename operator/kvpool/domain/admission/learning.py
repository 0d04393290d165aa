"""Reserve what requests will use: a learned output bound and an adaptive overcommit ratio.

Why this module exists: reserving every request's full output bound (``max_tokens`` or the
rest of the context) is safe but wastes the KV cache on tokens that are rarely generated,
which is what costs the throughput against an engine that reserves nothing. Two pure,
clock-free pieces decide a smaller *KV reservation*; the *budget charge* never shrinks
(it stays the request's full bound, see :mod:`kvpool.domain.estimate`).

**OutputLearner** (per pool and tier): the outputs of settled requests (tokens generated
per sequence) in a sliding window; once ``min_samples`` are known, a request reserves
``min(its bound, the window's q-quantile)`` output tokens per sequence, never more than its
own bound. Before that it reserves the bound.

**OvercommitRatio** (per pool): the fraction of the learned output that requests of
*lower* tiers reserve when they start above their tier's floor (on borrowed or shared
capacity; inside its floor a request reserves its whole learned output). It starts at 1
(no overcommit), creeps down by ``step`` on every engine poll that saw no preemption, to
at least ``minimum``, and jumps back up by ``backoff`` on every poll that saw one (the
known practice of SGLang's ``new_token_ratio``, which retracts and raises the ratio when
the cache runs out). The top tier always reserves its full learned output:
its requests run at the highest engine priority and are never the ones preempted.

Worked example (q 0.95, window 200, min 20; bound 120, outputs of batch all <= 64):

    reserve_output(bound=120) with 10 samples        -> 120 (not learned yet)
    ... 20 samples, q95 = 64 ->  reserve_output(120) -> 64;  reserve_output(30) -> 30
    ratio 1.0 -> 20 quiet polls at step 0.01         -> 0.80: batch reserves ceil(64 x 0.8) = 52
    one poll with preemptions (backoff 0.25)         -> 1.0 (capped)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class OutputLearner:
    """A high quantile of settled outputs per sequence, over a sliding window."""

    quantile: float = 0.95  # of observed outputs per sequence
    window: int = 200  # settled requests remembered
    min_samples: int = 20  # before this many, reserve the full bound
    _samples: deque[int] = field(default_factory=deque)
    _cached: int | None = None

    def observe(self, output_per_sequence: int) -> None:
        """A settled request generated this many tokens per sequence."""
        self._samples.append(max(0, output_per_sequence))
        if len(self._samples) > self.window:
            self._samples.popleft()
        self._cached = None

    @property
    def learned(self) -> int | None:
        """The current quantile (None until ``min_samples`` are known)."""
        if len(self._samples) < self.min_samples:
            return None
        if self._cached is None:
            ordered = sorted(self._samples)
            rank = max(0, math.ceil(self.quantile * len(ordered)) - 1)
            self._cached = max(1, ordered[rank])
        return self._cached

    def reserve_output(self, bound: int) -> int:
        """Output tokens per sequence to reserve for a request whose bound is ``bound``."""
        learned = self.learned
        return bound if learned is None else min(bound, learned)


@dataclass
class OvercommitRatio:
    """The fraction of their learned output that lower tiers reserve (1 = no overcommit)."""

    minimum: float = 0.5  # never reserve less than this fraction
    step: float = 0.01  # creep down per quiet engine poll
    backoff: float = 0.25  # jump up per engine poll that saw preemptions
    value: float = 1.0

    def observe_poll(self, preemptions: int) -> float:
        """One poll of the engines: ``preemptions`` new since the last poll."""
        if preemptions > 0:
            self.value = min(1.0, self.value + self.backoff)
        else:
            self.value = max(self.minimum, self.value - self.step)
        return self.value

    def reserve(self, output: int) -> int:
        """Output tokens a lower-tier request reserves of its learned ``output``."""
        return max(1, math.ceil(output * self.value)) if output > 0 else 0
