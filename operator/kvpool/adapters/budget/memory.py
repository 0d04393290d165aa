"""Budgets of one gateway process: the pure functions of :mod:`kvpool.domain.budget` on dicts.

Why this module exists: without ``--redis`` a single gateway keeps its budgets here, and
the failover wrapper uses one as the *local allowance* while Redis is down. One event loop,
so each call is atomic; the synchronous ``*_now`` methods are what the wrapper calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.adapters.budget.protocol import StoreVerdict, UnavailableMode
from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import (
    Bucket,
    BudgetAllow,
    BudgetCharge,
    BudgetVerdict,
    WindowUsage,
    assess_usage,
    bucket_index,
    decide_reserve,
    oldest_live_bucket,
    plan_settlement,
)


class InMemoryBudgetStore:
    """Budgets of one gateway process (no Redis configured, or Redis's local allowance)."""

    remote = False

    def __init__(self) -> None:
        self._counters: dict[tuple[str, float], dict[int, Bucket]] = {}

    def _buckets(self, subject: str, window_seconds: float, now: float) -> dict[int, Bucket]:
        buckets = self._counters.setdefault((subject, window_seconds), {})
        oldest = oldest_live_bucket(now, window_seconds)
        for index in [i for i in buckets if i < oldest]:
            del buckets[index]
        return buckets

    async def reserve(
        self,
        subject: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
        when_unavailable: UnavailableMode | None = None,
    ) -> StoreVerdict:
        return self.reserve_now(subject, limits, tokens, now)

    def reserve_now(
        self, subject: str, limits: Sequence[BudgetWindow], tokens: int, now: float
    ) -> BudgetVerdict:
        """The synchronous core of :meth:`reserve`."""
        windows = [(w, self._buckets(subject, w.window_seconds, now)) for w in limits]
        verdict = decide_reserve(subject, windows, tokens, now)
        if isinstance(verdict, BudgetAllow):
            for window, buckets in windows:
                index = bucket_index(now, window.window_seconds)
                old = buckets.get(index, Bucket())
                buckets[index] = Bucket(old.tokens + tokens, old.requests + 1)
        return verdict

    async def settle(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        self.settle_now(charge, actual_tokens, now)

    def settle_now(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        """The synchronous core of :meth:`settle`."""
        for step in plan_settlement(charge, actual_tokens, now):
            buckets = self._counters.get((charge.tenant, step.window_seconds))
            if buckets is None:
                continue
            old = buckets.get(step.index, Bucket())
            buckets[step.index] = Bucket(max(0, old.tokens + step.delta), old.requests)

    async def usage(
        self, subject: str, limits: Sequence[BudgetWindow], now: float
    ) -> list[WindowUsage]:
        return [assess_usage(w, self._buckets(subject, w.window_seconds, now), now) for w in limits]

    async def close(self) -> None:
        return None
