"""Tenant budgets: one table of cases run against the in-memory store AND a real Redis.

Each case is a little script of operations at given times (seconds after a base instant
that is a multiple of every window, so bucket boundaries are where a reader expects):
``reserve`` (expect allow, or deny with a Retry-After), ``settle`` (a previous charge
with its real usage) and ``usage`` (tokens counted). Both stores must agree with the
expectations, which follow the worked examples in kvpool.domain.budget.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvpool.adapters.budget import (
    BudgetStore,
    BudgetStoreError,
    BudgetUnavailable,
    FailoverBudgetStore,
    FailoverPolicy,
    InMemoryBudgetStore,
    RedisBudgetStore,
    UnavailableMode,
    budget_subject,
)
from kvpool.adapters.budget.failover import CircuitBreaker
from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import (
    BudgetAllow,
    BudgetCharge,
    BudgetDeny,
    RequestEnd,
    decide_settlement,
)
from tests.support.redis_server import RedisFactory
from tests.support.slow_link import SlowLink
from tests.support.timing import loop_turns, stall_loop
from tests.support.waiting import ManualClock

BASE = 1_800_000_000.0  # a multiple of 60, 3600 and 86400


def per(window: str, tokens: int, requests: int | None = None) -> BudgetWindow:
    seconds = {"m": 60, "h": 3600, "d": 86400}[window[-1]] * int(window[:-1])
    return BudgetWindow(window_seconds=seconds, tokens=tokens, requests=requests)


@dataclass(frozen=True)
class Reserve:
    at: float
    tokens: int
    retry_after: float | None = None  # None: expect allow; else deny with this Retry-After
    never_fits: bool = False
    tenant: str = "acme"


@dataclass(frozen=True)
class Settle:
    at: float
    charge: int  # index of the allowed reservation, in order of the case
    actual: int


@dataclass(frozen=True)
class Usage:
    at: float
    tokens: list[int]  # per window
    tenant: str = "acme"


@dataclass(frozen=True)
class Case:
    limits: list[BudgetWindow]
    steps: list[Reserve | Settle | Usage] = field(default_factory=list)


CASES = {
    "within-budget-allows-and-counts": Case(
        [per("1m", 1000)],
        [Reserve(10.2, 600), Reserve(20, 300), Usage(30, [900])],
    ),
    "over-budget-denies-until-the-oldest-bucket-expires": Case(
        [per("1m", 1000)],
        [Reserve(10.2, 600), Reserve(30, 500, retry_after=41.0)],
    ),
    "settling-below-the-reservation-refunds": Case(
        [per("1m", 1000)],
        [Reserve(10.2, 600), Settle(30, 0, 150), Reserve(30, 500), Usage(30, [650])],
    ),
    "settling-above-the-reservation-charges-the-difference": Case(
        [per("1m", 1000)],
        [Reserve(5, 100), Settle(6, 0, 400), Usage(7, [400]), Reserve(8, 700, retry_after=58.0)],
    ),
    "a-charge-counts-for-the-whole-window-then-leaves": Case(
        [per("1m", 1000)],
        [Reserve(10.2, 600), Usage(70.5, [600]), Usage(71.0, [0]), Reserve(71.0, 1000)],
    ),
    "no-2x-burst-at-a-window-boundary": Case(
        [per("1m", 1000)],
        [
            Reserve(59.5, 1000),
            Reserve(60.5, 1, retry_after=59.5),
            Reserve(119.9, 1, retry_after=0.1),
            Reserve(120.0, 1000),
        ],
    ),
    "a-request-larger-than-the-limit-never-fits": Case(
        [per("1m", 1000)],
        [Reserve(1, 1001, retry_after=60.0, never_fits=True), Usage(2, [0])],
    ),
    "request-count-limit": Case(
        [per("1m", 10_000, requests=2)],
        [Reserve(1, 1), Reserve(2, 1), Reserve(3, 1, retry_after=59.0)],
    ),
    "every-window-must-allow-and-the-longest-wait-wins": Case(
        [per("1m", 1000), per("1h", 1500)],
        [
            Reserve(0, 900),
            Reserve(70, 500),
            Reserve(140, 500, retry_after=3660.0 - 140),
            Usage(140, [0, 1400]),
        ],
    ),
    "settling-a-charge-that-left-the-window-changes-nothing": Case(
        [per("1m", 1000)],
        [Reserve(0, 500), Settle(61, 0, 5000), Usage(61, [0]), Reserve(61, 1000)],
    ),
    "tenants-are-independent": Case(
        [per("1m", 1000)],
        [Reserve(1, 1000), Reserve(2, 1000, tenant="zed"), Usage(3, [1000], tenant="zed")],
    ),
    "no-limits-always-allows": Case([], [Reserve(1, 10**9), Reserve(2, 10**9)]),
}


@pytest.fixture(scope="module")
def redis_url(redis_server_module: RedisFactory) -> str:
    """A real redis-server for this module (the shared fixture stops it)."""
    return redis_server_module().url


@pytest.fixture
async def redis_store(redis_url: str) -> AsyncIterator[RedisBudgetStore]:
    url = redis_url
    store = RedisBudgetStore(url, timeout=1.0, key_prefix=f"test:{time.monotonic_ns()}")
    try:
        yield store
    finally:
        await store.close()


async def run_case(store: BudgetStore, case: Case) -> None:
    charges: list[BudgetCharge] = []
    for step in case.steps:
        if isinstance(step, Reserve):
            verdict = await store.reserve(step.tenant, case.limits, step.tokens, BASE + step.at)
            if step.retry_after is None:
                assert isinstance(verdict, BudgetAllow), (step, verdict)
                charges.append(verdict.charge)
            else:
                assert isinstance(verdict, BudgetDeny), (step, verdict)
                assert verdict.retry_after == pytest.approx(step.retry_after, abs=1e-6), step
                assert verdict.never_fits == step.never_fits
                assert verdict.reason
        elif isinstance(step, Settle):
            await store.settle(charges[step.charge], step.actual, BASE + step.at)
        else:
            used = await store.usage(step.tenant, case.limits, BASE + step.at)
            assert [u.tokens for u in used] == step.tokens, step


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_in_memory_store(case: Case) -> None:
    await run_case(InMemoryBudgetStore(), case)


@pytest.mark.redis
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_redis_store(case: Case, redis_store: RedisBudgetStore) -> None:
    await run_case(redis_store, case)


@pytest.mark.redis
async def test_redis_concurrent_burst_never_overshoots(redis_url: str) -> None:
    """Two clients (as two gateways would) race 40 reservations for 10 reservations' worth."""
    url = redis_url
    prefix = f"burst:{time.monotonic_ns()}"
    stores = [RedisBudgetStore(url, timeout=2.0, key_prefix=prefix) for _ in range(2)]
    limits = [per("1m", 1000)]
    try:
        verdicts = await asyncio.gather(
            *(stores[i % 2].reserve("acme", limits, 100, BASE + 1) for i in range(40))
        )
        allowed = [v for v in verdicts if isinstance(v, BudgetAllow)]
        assert len(allowed) == 10
        used = await stores[0].usage("acme", limits, BASE + 2)
        assert used[0].tokens == 1000
    finally:
        for store in stores:
            await store.close()


def failover(
    url: str, *, timeout: float = 0.005, **policy: Any
) -> tuple[FailoverBudgetStore, list[str], list[tuple[str, str]]]:
    errors: list[str] = []
    fallbacks: list[tuple[str, str]] = []
    store = FailoverBudgetStore(
        RedisBudgetStore(url, timeout=timeout, key_prefix=f"fo:{time.monotonic_ns()}"),
        FailoverPolicy(**policy),
        on_error=lambda op, exc: errors.append(op),
        on_fallback=lambda tier, result: fallbacks.append((tier, result)),
    )
    return store, errors, fallbacks


@pytest.mark.parametrize(
    ("tier", "declared", "expect"),
    [
        ("interactive", None, "local"),
        ("batch", None, "reject"),
        ("batch", "Allow", "local"),
        ("interactive", "Reject", "reject"),
    ],
    ids=["flag-default-allow", "flag-fail-closed", "tier-declares-allow", "tier-declares-reject"],
)
async def test_redis_down_follows_the_tier_policy(
    tier: str, declared: UnavailableMode | None, expect: str
) -> None:
    store, errors, fallbacks = failover(
        "redis://127.0.0.1:1/0",  # nothing listens on port 1
        fail_closed_tiers=frozenset({"batch"}),
        local_fraction=0.1,
        failure_threshold=1,
    )
    limits = [per("1m", 1000)]
    try:
        started = time.perf_counter()
        verdict = await store.reserve("ns/acme", limits, 100, BASE, tier, declared)
        elapsed = time.perf_counter() - started
        assert elapsed < 0.25  # bounded by the timeout (+ scheduling noise on a busy machine)
        assert errors == ["reserve"]
        assert fallbacks == [(tier, expect)]  # a fail-closed tier never counts "local"
        if expect == "reject":
            assert isinstance(verdict, BudgetUnavailable)
            return
        # fail-open: a local allowance of 10 % of the limit (100 tokens), then denied
        assert isinstance(verdict, BudgetAllow)
        assert verdict.charge.origin == "local"
        again = await store.reserve("ns/acme", limits, 1, BASE, tier, declared)
        assert isinstance(again, BudgetDeny)
        # the circuit breaker kept Redis out of the path: still one error recorded
        assert errors == ["reserve"]
        await store.settle(verdict.charge, 0, BASE + 1)  # local charges settle locally
        refunded = await store.reserve("ns/acme", limits, 100, BASE + 1, tier, declared)
        assert isinstance(refunded, BudgetAllow)
    finally:
        await store.close()


BREAKER_CASES = {
    # events: "ok"/"fail" calls, or "t=<seconds>" to move the clock; then the expected state
    "one-failure-keeps-it-closed": (["fail"], "closed"),
    "success-resets-the-count": (["fail", "fail", "ok", "fail", "fail"], "closed"),
    "three-consecutive-failures-open-it": (["fail", "fail", "fail"], "open"),
    "after-the-interval-it-is-half-open": (["fail", "fail", "fail", "t=1.5"], "half-open"),
    "a-successful-probe-closes-it": (["fail", "fail", "fail", "t=1.5", "ok"], "closed"),
    "a-failed-probe-re-opens-it": (["fail", "fail", "fail", "t=1.5", "fail"], "open"),
}


@pytest.mark.parametrize(("events", "state"), list(BREAKER_CASES.values()), ids=list(BREAKER_CASES))
def test_circuit_breaker(events: list[str], state: str) -> None:
    clock = ManualClock(0.0)
    breaker = CircuitBreaker(failure_threshold=3, open_seconds=1.0, clock=clock)
    for event in events:
        if event.startswith("t="):
            clock.now = float(event[2:])
            continue
        assert breaker.allow(), event
        breaker.success() if event == "ok" else breaker.failure()
    assert breaker.state == state


def test_half_open_breaker_lets_one_probe_through() -> None:
    clock = ManualClock(0.0)
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=1.0, clock=clock)
    breaker.failure()
    assert not breaker.allow()
    clock.now = 1.0
    assert [breaker.allow() for _ in range(3)] == [True, False, False]


def test_an_abandoned_probe_frees_the_half_open_slot() -> None:
    clock = ManualClock(0.0)
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=1.0, clock=clock)
    breaker.failure()
    clock.now = 1.0
    assert breaker.allow()
    breaker.abandon()  # the probing request was cancelled
    assert breaker.allow()


async def test_redis_breaker_opens_on_consecutive_failures_and_probes_again() -> None:
    clock = ManualClock(0.0)
    errors: list[str] = []
    store = FailoverBudgetStore(
        RedisBudgetStore("redis://127.0.0.1:1/0", timeout=0.005),
        FailoverPolicy(failure_threshold=2, open_seconds=1.0),
        on_error=lambda op, exc: errors.append(op),
        clock=clock,
    )
    limits = [per("1m", 1000)]
    try:
        await store.reserve("ns/acme", limits, 1, BASE)
        assert store.available  # one failure does not open it
        await store.reserve("ns/acme", limits, 1, BASE)
        assert not store.available
        clock.now = 0.5
        await store.reserve("ns/acme", limits, 1, BASE)
        assert errors == ["reserve", "reserve"]  # open: Redis not asked
        clock.now = 1.5
        assert store.available
        await store.reserve("ns/acme", limits, 1, BASE)  # the half-open probe
        assert errors == ["reserve", "reserve", "reserve"]
        assert not store.available
    finally:
        await store.close()


@pytest.mark.redis
async def test_a_hung_redis_costs_at_most_the_timeout(redis_server: RedisFactory) -> None:
    """Given a Redis that accepts connections but does not answer (SIGSTOP), a reservation
    returns after the timeout with the local allowance, and once the breaker is open the
    next one does not wait."""
    redis = redis_server()
    store, errors, _ = failover(redis.url, timeout=0.02, failure_threshold=1)
    limits = [per("1m", 1000)]
    try:
        assert isinstance(await store.reserve("ns/acme", limits, 10, BASE), BudgetAllow)
        os.kill(redis.process.pid, signal.SIGSTOP)
        try:
            timings = []
            for _ in range(2):
                started = time.perf_counter()
                verdict = await store.reserve("ns/acme", limits, 10, BASE)
                timings.append(time.perf_counter() - started)
                assert isinstance(verdict, BudgetAllow) and verdict.charge.origin == "local"
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
        assert timings[0] < 0.2  # the 20 ms timeout, plus scheduling noise on a busy machine
        assert timings[1] < timings[0]  # the breaker is open: Redis is not even asked
        assert errors == ["reserve"]
    finally:
        await store.close()


@pytest.mark.redis
async def test_a_stall_of_this_process_is_not_a_redis_failure(redis_url: str) -> None:
    """Given a healthy Redis and the default 100 ms timeout, when this process's event loop
    stalls for 200 ms (another request's work, a GC pause) at a different point of each of
    40 calls, then no call fails: the answer came in during the stall. (With redis-py's
    socket timeout at 100 ms too, its read timer fired first: 5 of these 40 failed.)"""
    store = RedisBudgetStore(redis_url, key_prefix=f"stall:{time.monotonic_ns()}")
    limits = [per("1m", 10**9)]
    failures: list[str] = []

    async def reserve() -> None:
        try:
            await store.reserve("ns/acme", limits, 1, time.time())
        except BudgetStoreError as exc:
            failures.append(str(exc))

    try:
        await reserve()  # a warm connection
        for point in range(40):
            call = asyncio.create_task(reserve())
            await loop_turns(point % 8)  # let the call run that many steps first
            stall_loop(0.2)  # the loop stalls: nothing of this process runs
            await call
    finally:
        await store.close()
    assert failures == []


LINK_DELAY = 0.05  # seconds each Redis answer takes through the slow link
BURST_TIMEOUT = 0.5  # the store's per-call timeout in the burst test


@pytest.mark.redis
async def test_a_burst_waits_for_connections_outside_the_timeout(
    redis_server_module: RedisFactory,
) -> None:
    """Given a healthy Redis whose every answer takes 50 ms (a slow link, not a loaded
    machine), a 0.5 s timeout and 16 pooled connections, a burst of 200 concurrent
    reservations on a fail-closed tier: no call fails. The last calls wait about
    200 / 16 x 50 ms = 625 ms for a connection - longer than the timeout - so only a
    timeout that bounds the round trip alone, not the wait for a connection, passes;
    each round trip leaves 450 ms to spare for this machine's own stalls. (The old 5 ms
    default and a non-blocking pool failed 199 of 200 such calls with 'Too many
    connections' and timeouts; a timeout around the wait as well failed 152: three timed
    out, then the breaker opened.)"""
    redis = redis_server_module()
    errors: list[str] = []
    fallbacks: list[tuple[str, str]] = []
    async with SlowLink("127.0.0.1", redis.port, LINK_DELAY) as link:
        store = FailoverBudgetStore(
            RedisBudgetStore(
                link.url, timeout=BURST_TIMEOUT, key_prefix=f"burst200:{time.monotonic_ns()}"
            ),
            FailoverPolicy(fail_closed_tiers=frozenset({"batch"})),
            on_error=lambda op, exc: errors.append(op),
            on_fallback=lambda tier, result: fallbacks.append((tier, result)),
        )
        limits = [per("1m", 10**9), per("1h", 10**9)]

        async def timed(i: int) -> tuple[float, object]:
            started = time.perf_counter()
            verdict = await store.reserve(f"ns/t{i % 20}", limits, 10, time.time(), "batch")
            return time.perf_counter() - started, verdict

        try:
            results = await asyncio.gather(*(timed(i) for i in range(200)))
        finally:
            await store.close()
    slowest = max(t for t, _ in results)
    unavailable = sum(isinstance(v, BudgetUnavailable) for _, v in results)
    assert (unavailable, errors, fallbacks) == (0, [], []), (
        f"{unavailable}/200 budget_unavailable, {len(errors)} errors, slowest call "
        f"{slowest * 1000:.0f} ms"
    )
    assert all(isinstance(v, BudgetAllow) for _, v in results)
    assert slowest > BURST_TIMEOUT, (
        f"the slowest call took {slowest * 1000:.0f} ms: the burst never waited longer than "
        "the timeout, so it tells nothing"
    )


@pytest.mark.redis
async def test_same_tenant_name_in_two_namespaces_is_isolated(redis_url: str) -> None:
    """Tenant 'shared' of team-b spends its whole budget; 'shared' of team-a is untouched
    (the old key had no namespace: team-b used up team-a's budget)."""
    prefix = f"ns:{time.monotonic_ns()}"
    stores = [RedisBudgetStore(redis_url, timeout=1.0, key_prefix=prefix) for _ in range(2)]
    limits = [per("1m", 1000)]
    a, b = budget_subject("team-a", "shared"), budget_subject("team-b", "shared")
    try:
        assert isinstance(await stores[1].reserve(b, limits, 1000, BASE + 1), BudgetAllow)
        verdict = await stores[0].reserve(a, limits, 600, BASE + 2)
        used_a = (await stores[0].usage(a, limits, BASE + 3))[0].tokens
        assert isinstance(verdict, BudgetAllow), f"team-a denied: {verdict}; usage {used_a}"
        assert used_a == 600
        assert stores[0].key(a, 60) == f"{prefix}:{{team-a/shared}}:60"  # one cluster slot
    finally:
        for store in stores:
            await store.close()


def end(reported: int | None, observed: int, *, sent: bool = True, aborted: bool) -> RequestEnd:
    return RequestEnd(140, reported, observed, sent=sent, client_aborted=aborted)


SETTLEMENT_CASES = {
    "engine-usage-is-exact": (end(77, 60, aborted=False), 77),
    "usage-seen-then-client-gone": (end(90, 70, aborted=True), 90),
    "refused-before-sending": (end(None, 0, sent=False, aborted=False), 0),
    "client-gone-while-refused": (end(None, 0, sent=False, aborted=True), 0),
    "engine-rejected-4xx": (end(None, 0, aborted=False), 0),
    "non-stream-client-abort-keeps-reservation": (end(None, 0, aborted=True), 140),
    "stream-client-abort-keeps-reservation": (end(None, 52, aborted=True), 140),
    "stream-relayed-above-reservation": (end(None, 300, aborted=True), 300),
    "engine-broke-mid-stream-charges-relayed": (end(None, 52, aborted=False), 52),
    "engine-timed-out-before-answer": (end(None, 0, aborted=False), 0),
}


@pytest.mark.parametrize(
    ("end", "charged"), list(SETTLEMENT_CASES.values()), ids=list(SETTLEMENT_CASES)
)
def test_decide_settlement(end: RequestEnd, charged: int) -> None:
    assert decide_settlement(end) == charged
