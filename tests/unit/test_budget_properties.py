"""Properties of the budget algorithm, over random interleavings of reserve and settle.

1. **No window of W seconds ever holds more than the limit** (when usage never exceeds
   its reservation): the whole point of charging at admission with a sliding window.
2. **The Redis store and the in-memory store agree** on every verdict and Retry-After for
   the same sequence of operations (the Lua scripts implement the same arithmetic).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool.adapters.budget import InMemoryBudgetStore, RedisBudgetStore
from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import BudgetAllow, BudgetCharge, BudgetDeny
from tests.support.redis_server import RedisFactory

BASE = 1_800_000_000.0
WINDOW = 60.0
LIMIT = 1000


@dataclass(frozen=True)
class Op:
    gap: float  # seconds since the previous operation
    tokens: int  # reservation
    settle_fraction: float  # actual = reservation * fraction (settled right away if < 1)
    settle_later: bool  # settle at the next operation instead of now


ops = st.lists(
    st.builds(
        Op,
        gap=st.floats(min_value=0, max_value=20, allow_nan=False),
        tokens=st.integers(min_value=1, max_value=600),
        settle_fraction=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
        settle_later=st.booleans(),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_no_window_ever_holds_more_than_the_limit(sequence: list[Op]) -> None:
    store = InMemoryBudgetStore()
    limits = [BudgetWindow(window_seconds=WINDOW, tokens=LIMIT)]
    now = BASE
    ledger: list[tuple[float, int]] = []  # (time charged, final tokens)
    pending: list[tuple[int, BudgetCharge, int]] = []
    for op in sequence:
        now += op.gap
        for index, charge, actual in pending:  # settlements deferred to this moment
            store.settle_now(charge, actual, now)
            ledger[index] = (charge.at, actual)
        pending.clear()
        verdict = store.reserve_now("t", limits, op.tokens, now)
        if isinstance(verdict, BudgetDeny):
            assert verdict.retry_after >= 0
            continue
        actual = int(op.tokens * op.settle_fraction)
        ledger.append((now, op.tokens))
        if op.settle_later:
            pending.append((len(ledger) - 1, verdict.charge, actual))
        else:
            store.settle_now(verdict.charge, actual, now)
            ledger[-1] = (now, actual)
    for end, _ in ledger:
        in_window = sum(tokens for at, tokens in ledger if end - WINDOW < at <= end)
        assert in_window <= LIMIT


@pytest.fixture(scope="module")
def redis_url(redis_server_module: RedisFactory) -> str:
    return redis_server_module().url


@pytest.mark.redis
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=ops, requests=st.one_of(st.none(), st.integers(min_value=1, max_value=5)))
def test_redis_and_memory_stores_agree(
    redis_url: str, sequence: list[Op], requests: int | None
) -> None:
    limits = [
        BudgetWindow(window_seconds=WINDOW, tokens=LIMIT, requests=requests),
        BudgetWindow(window_seconds=3600, tokens=3 * LIMIT),
    ]

    async def run() -> None:
        memory = InMemoryBudgetStore()
        redis = RedisBudgetStore(redis_url, timeout=2.0, key_prefix=f"prop:{time.monotonic_ns()}")
        try:
            now = BASE
            for op in sequence:
                now += op.gap
                a = await memory.reserve("t", limits, op.tokens, now)
                b = await redis.reserve("t", limits, op.tokens, now)
                assert type(a) is type(b)
                if isinstance(a, BudgetDeny) and isinstance(b, BudgetDeny):
                    assert a.retry_after == pytest.approx(b.retry_after, abs=1e-6)
                    assert a.reason == b.reason
                    continue
                assert isinstance(a, BudgetAllow) and isinstance(b, BudgetAllow)
                assert [u.tokens for u in a.usage] == [u.tokens for u in b.usage]
                actual = int(op.tokens * op.settle_fraction)
                await memory.settle(a.charge, actual, now)
                await redis.settle(b.charge, actual, now)
        finally:
            await redis.close()

    asyncio.run(run())
