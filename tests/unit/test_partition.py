"""Splitting a plan between gateway replicas never hands out more than the plan."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.api.admission_config import CompiledPool
from kvpool.domain.partition import partition_poll_period, partition_pool, partition_tenant
from tests.builders import CompiledPoolBuilder, compiled_tenant


def demo_pool() -> CompiledPool:
    """The local demo's plan: one replica of 1,843 tokens / 8 slots."""
    return (
        CompiledPoolBuilder("tiny")
        .capacity(1843, 8)
        .tier("interactive", 1197, 5, lend_tokens=598, lend_slots=2)
        .tier("batch", 460, 2, lend_tokens=230, lend_slots=1)
        .replicas(1)
        .obj()
    )


def test_full_share_is_the_plan_itself() -> None:
    pool = demo_pool()
    assert partition_pool(pool, 100) is pool


def test_half_share_of_the_demo_plan() -> None:
    half = partition_pool(demo_pool(), 50)

    assert (half.tokens_per_replica, half.slots_per_replica) == (921, 4)
    assert (half.total_tokens, half.total_slots) == (921, 4)
    interactive = half.tiers["interactive"]
    assert (interactive.floor_tokens, interactive.floor_slots) == (598, 2)
    assert (interactive.lendable_tokens, interactive.lendable_slots) == (299, 1)
    assert (half.shared_tokens, half.shared_slots) == (921 - 598 - 230, 4 - 2 - 1)


@pytest.mark.parametrize("share", [0, 101, -5], ids=["zero", "over-100", "negative"])
def test_share_out_of_range_is_refused(share: int) -> None:
    with pytest.raises(ValueError, match="1-100 percent"):
        partition_pool(demo_pool(), share)


@given(
    gateways=st.integers(min_value=1, max_value=8),
    tokens=st.integers(min_value=1, max_value=10_000_000),
    slots=st.integers(min_value=1, max_value=4096),
    floors=st.lists(st.integers(min_value=0, max_value=25), min_size=1, max_size=4),
    replicas=st.integers(min_value=1, max_value=16),
)
def test_shares_of_all_gateways_fit_in_the_plan(
    gateways: int, tokens: int, slots: int, floors: list[int], replicas: int
) -> None:
    builder = CompiledPoolBuilder("p").capacity(tokens * replicas, slots * replicas)
    for index, floor in enumerate(floors):
        builder.tier(f"t{index}", tokens * replicas * floor // 100, slots * replicas * floor // 100)
    pool = builder.replicas(replicas).replica_capacity(tokens, slots).obj()

    share = partition_pool(pool, 100 // gateways)

    assert share.tokens_per_replica * gateways <= pool.tokens_per_replica
    assert share.slots_per_replica * gateways <= pool.slots_per_replica
    assert share.total_tokens * gateways <= pool.total_tokens
    for name, tier in share.tiers.items():
        assert tier.floor_tokens * gateways <= pool.tiers[name].floor_tokens
        assert tier.floor_slots * gateways <= pool.tiers[name].floor_slots
        assert tier.lendable_tokens <= tier.floor_tokens
    assert share.shared_tokens >= 0
    assert share.shared_slots >= 0


# (maxConcurrency, share percent) -> what one gateway replica enforces
TENANT_CASES = {
    "no-limit-stays-none": (None, 50, None),
    "full-share-is-the-limit": (10, 100, 10),
    "half-of-ten": (10, 50, 5),
    "a-third-floored": (10, 33, 3),
    "never-below-one-request": (1, 25, 1),
    "two-over-three-gateways": (2, 33, 1),
}


@pytest.mark.parametrize(
    ("limit", "share", "expected"), list(TENANT_CASES.values()), ids=list(TENANT_CASES)
)
def test_each_gateway_enforces_its_share_of_a_tenants_concurrency(
    limit: int | None, share: int, expected: int | None
) -> None:
    tenant = compiled_tenant("acme", ["batch"], max_concurrency=limit)
    assert partition_tenant(tenant, share).max_concurrency == expected


@given(
    gateways=st.integers(min_value=1, max_value=8),
    limit=st.integers(min_value=1, max_value=10_000),
)
def test_tenant_shares_of_all_gateways_stay_within_its_limit(gateways: int, limit: int) -> None:
    """N gateways at 100/N % never let a tenant run more than its maxConcurrency in all,
    unless it is below N (one request through each gateway)."""
    tenant = compiled_tenant("acme", ["batch"], max_concurrency=limit)
    each = partition_tenant(tenant, 100 // gateways).max_concurrency
    assert each is not None and each >= 1
    assert each * gateways <= max(limit, gateways)


@pytest.mark.parametrize(
    ("seconds", "share", "expected"),
    [(0.25, 100, 0.25), (0.25, 50, 0.5), (0.25, 25, 1.0), (1.0, 10, 10.0)],
    ids=["one-gateway", "two", "four", "ten"],
)
def test_each_gateway_polls_the_engines_its_share_of_the_time(
    seconds: float, share: int, expected: float
) -> None:
    assert partition_poll_period(seconds, share) == pytest.approx(expected)
