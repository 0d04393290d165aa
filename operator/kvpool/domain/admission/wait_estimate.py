"""How long a request that must wait would wait: the fast rejection of a queue past its promise.

Why this module exists: a tier promises a maximum queue wait (``maxQueueWait``); a request
that cannot start within it is better told at once (503 with ``Retry-After``) than
queued until its deadline. This module estimates that wait from what is queued ahead
and how fast the pool drains (docs/0003-admission.md §3 "Deadlines"):

    need = queued ahead (its tier and higher) + its own - free now
    wait = need x mean_hold / in_use                 (per dimension; the larger)

The drain rate is Little's law - what is in use drains in about one mean hold time, an
EWMA of observed reservation durations (:class:`HoldTime`); a per-release rate would
decay to zero while long generations run and reject everything. While a higher tier
has requests waiting, whatever the pool releases beyond floors goes to it first, so the
tier can only count on what it releases itself: ``its queue x mean_hold / its in-use`` is
a lower bound, and the estimate is the larger of the two.

Worked example: a pool of 1000 tokens full of 100-token requests, mean hold 1 s (drain
~1000 tokens/s): the 20th waiting 100-token request expects 2.0 s, the 21st 2.1 s - with a
``maxQueueWait`` of 2 s it is rejected at once with ``Retry-After: 3``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.ledger import TierState
from kvpool.domain.admission.verdicts import AdmissionRequest

EWMA_ALPHA = 0.2  # weight of the newest hold-time sample


class HoldTime:
    """The EWMA of observed reservation durations (None until one was observed)."""

    __slots__ = ("mean",)

    def __init__(self) -> None:
        self.mean: float | None = None

    def observe(self, seconds: float) -> None:
        """A reservation ended after ``seconds``."""
        hold = max(0.0, float(seconds))
        self.mean = hold if self.mean is None else (1 - EWMA_ALPHA) * self.mean + EWMA_ALPHA * hold


def queued_ahead(order: Sequence[TierState], tier: TierState, request: AdmissionRequest) -> Amount:
    """What is queued ahead of a new, just-enqueued request (its tier and higher tiers)."""
    ahead = ZERO
    for t in order:
        if t.rank > tier.rank:
            break
        ahead += t.queued
    return ahead - request.amount


def expected_wait(
    order: Sequence[TierState],
    tier: TierState,
    request: AdmissionRequest,
    ahead: Amount,
    free: Amount,
    used: Amount,
    mean_hold: float | None,
) -> float | None:
    """Seconds until enough is released for the queue ahead and this request (None:
    unknown - no hold time observed yet, or nothing in flight to drain).

    ``free`` is what the pool has not reserved now, ``used`` what it has.
    """
    if mean_hold is None or mean_hold <= 0:
        return None
    needs = [((ahead + request.amount - free).clamp0(), used)]
    if any(t.queued_count for t in order if t.rank < tier.rank):
        needs.append((tier.queued, tier.used))
    wait = 0.0
    for need_amount, used_amount in needs:
        for need, in_use in (
            (need_amount.tokens, used_amount.tokens),
            (need_amount.slots, used_amount.slots),
        ):
            if need > 0:
                if in_use <= 0:
                    return None  # nothing in flight to drain: the deadline decides
                wait = max(wait, need * mean_hold / in_use)
    return wait


def retry_after(seconds: float) -> float:
    """A Retry-After suggestion: whole seconds, at least 1."""
    return float(max(1, math.ceil(seconds)))
