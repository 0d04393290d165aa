"""The capacity planner, as tables of cases (formulas: docs/0001-capacity-planning.md)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.domain.planner import (
    CAPACITY_UNKNOWN,
    REPLICA_TOO_SMALL,
    UNKNOWN_TIER,
    ZERO_FLOOR_WITH_PEAK,
    PlanError,
    PoolPlan,
    plan_pool,
)
from tests.builders import (
    ModelPoolManifestBuilder,
    modelpool_manifest,
    standard_tierpolicy_manifest,
    tierpolicy_manifest,
)


def worked_example_pool() -> ModelPoolManifestBuilder:
    """The pool of the docs' worked example: 8B chat, 2048+1024 p95, peaks 60/40/8."""
    return modelpool_manifest("llama-8b").replicas(1, 8).peak(interactive=60, batch=40, eval=8)


def test_worked_example_from_docs() -> None:
    plan = plan_pool(worked_example_pool().obj(), standard_tierpolicy_manifest().obj(), 200_000)

    assert isinstance(plan, PoolPlan)
    assert plan.kv_source == "Measured"
    assert plan.usable_tokens_per_replica == 180_000
    assert plan.live_sequences_per_replica == 58  # sizes the replicas
    assert plan.slots_per_replica == 256  # admission: the engine's running batch
    assert [t.required_replicas for t in plan.tiers] == [3, 3, 2]
    assert plan.replicas == 3
    assert (plan.total_tokens, plan.total_slots) == (540_000, 768)
    rows = [
        (t.name, t.floor_tokens, t.floor_slots, t.lendable_tokens, t.lendable_slots)
        for t in plan.tiers
    ]
    assert rows == [
        ("interactive", 270_000, 384, 270_000, 384),
        ("batch", 162_000, 230, 81_000, 115),
        ("eval", 54_000, 76, 54_000, 76),
    ]
    assert (plan.shared_tokens, plan.shared_slots) == (54_000, 78)
    assert plan.warnings == ()
    assert not plan.capacity_short


@dataclass(frozen=True)
class ReplicaCase:
    id: str
    pool: ModelPoolManifestBuilder
    kv: int | None
    replicas: int
    live: int
    short_tiers: tuple[str, ...] = ()


REPLICA_CASES = [
    ReplicaCase("no-peaks-keeps-min", modelpool_manifest().replicas(2, 8), 200_000, 2, 58),
    ReplicaCase(
        "small-peak-clamped-up-to-min",
        modelpool_manifest().replicas(4, 8).peak(interactive=1),
        200_000,
        4,
        58,
    ),
    ReplicaCase(
        "big-peak-clamped-down-to-max-is-short",
        modelpool_manifest().replicas(1, 8).peak(interactive=500, batch=10),
        200_000,
        8,
        58,
        ("interactive",),
    ),
    ReplicaCase(
        "exact-fit-needs-no-extra-replica",
        # L=58, floor 50% -> 29 per replica; peak 58 with 0% headroom -> exactly 2
        modelpool_manifest().replicas(1, 8).peak(interactive=58).capacity(headroomPercent=0),
        200_000,
        2,
        58,
    ),
    ReplicaCase(
        "max-num-seqs-caps-live-sequences",
        modelpool_manifest().engine(maxNumSeqs=16).peak(interactive=40),
        200_000,
        # ceil(40 * 120 / (16 * 50)) = 6
        6,
        16,
    ),
    ReplicaCase(
        "declared-capacity-used-without-measurement",
        modelpool_manifest().capacity(kvTokensPerReplica=100_000).peak(interactive=20),
        None,
        # U = 90,000, L = 29, ceil(20 * 120 / (29 * 50)) = 2
        2,
        29,
    ),
    ReplicaCase(
        "utilisation-target-shrinks-usable",
        modelpool_manifest().capacity(kvUtilizationTarget=50).peak(interactive=20),
        200_000,
        # U = 100,000, L = 32, ceil(2400 / 1600) = 2
        2,
        32,
    ),
    ReplicaCase(
        "min-replicas-zero-scales-to-zero-without-peaks",
        modelpool_manifest().replicas(0, 4),
        200_000,
        0,
        58,
    ),
]


@pytest.mark.parametrize("case", REPLICA_CASES, ids=[c.id for c in REPLICA_CASES])
def test_warm_replicas(case: ReplicaCase) -> None:
    plan = plan_pool(case.pool.obj(), standard_tierpolicy_manifest().obj(), case.kv)

    assert isinstance(plan, PoolPlan), plan
    assert plan.replicas == case.replicas
    assert plan.live_sequences_per_replica == case.live
    assert tuple(t.name for t in plan.tiers if t.capacity_short) == case.short_tiers
    assert len(plan.warnings) == len(case.short_tiers)
    for name in case.short_tiers:
        assert any(name in w and "maxReplicas" in w for w in plan.warnings)


def test_capacity_short_keeps_the_full_floor_share() -> None:
    """Short capacity is reported; the tier's reservation is not shrunk to hide it."""
    plan = plan_pool(
        modelpool_manifest().replicas(1, 2).peak(interactive=500).obj(),
        standard_tierpolicy_manifest().obj(),
        200_000,
    )

    assert isinstance(plan, PoolPlan)
    interactive = plan.tier("interactive")
    assert interactive.capacity_short
    assert interactive.floor_tokens == 2 * 180_000 * 50 // 100
    assert interactive.required_replicas == 21


@dataclass(frozen=True)
class ErrorCase:
    id: str
    pool: ModelPoolManifestBuilder
    kv: int | None
    reason: str
    message_parts: tuple[str, ...]


ERROR_CASES = [
    ErrorCase(
        "no-measurement-no-declared-figure",
        modelpool_manifest(),
        None,
        CAPACITY_UNKNOWN,
        ("kvTokensPerReplica", "no KV capacity measured"),
    ),
    ErrorCase(
        "replica-cannot-hold-one-p95-sequence",
        modelpool_manifest(),
        3_000,
        REPLICA_TOO_SMALL,
        ("2700 usable", "3000 x 90%", "3072", "prompt p95 2048", "output p95 1024"),
    ),
    ErrorCase(
        "peak-on-a-zero-floor-tier",
        modelpool_manifest().peak(interactive=10, idle=5),
        200_000,
        ZERO_FLOOR_WITH_PEAK,
        ("'idle'", "floorPercent 0"),
    ),
    ErrorCase(
        "peak-for-a-tier-the-policy-lacks",
        modelpool_manifest().peak(premium=10),
        200_000,
        UNKNOWN_TIER,
        ("'premium'", "'tiers'"),
    ),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c.id for c in ERROR_CASES])
def test_plan_errors(case: ErrorCase) -> None:
    policy = standard_tierpolicy_manifest().tier("idle", floor=0).obj()

    result = plan_pool(case.pool.obj(), policy, case.kv)

    assert isinstance(result, PlanError)
    assert result.reason == case.reason
    for part in case.message_parts:
        assert part in result.message


def _small_engine_pool() -> ModelPoolManifestBuilder:
    """One replica of 2,048 KV tokens at 90 %, 8 sequences, p95 request 128 + 64 tokens."""
    return (
        modelpool_manifest()
        .engine(maxNumSeqs=8, maxModelLen=512)
        .lengths((64, 128), (32, 64))
        .replicas(1, 1)
        .capacity(kvUtilizationTarget=90)
    )


@pytest.mark.parametrize(
    ("floors", "expected", "shared", "small"),
    [
        (
            (50, 30, 10),
            [("t0", 921, 4), ("t1", 552, 2), ("t2", 192, 1)],
            (178, 1),
            ("t2",),
        ),
        (
            (60, 39, 1),
            [("t0", 1105, 4), ("t1", 546, 3), ("t2", 192, 1)],
            (0, 0),
            ("t2",),
        ),
        (
            (50, 30, 0),
            [("t0", 921, 4), ("t1", 552, 2), ("t2", 0, 0)],
            (370, 2),
            (),
        ),
    ],
    ids=[
        "issue-8-eval-floor-raised-from-shared",
        "raise-taken-from-the-lowest-other-tier",
        "zero-floor-stays-zero",
    ],
)
def test_a_nonzero_floor_holds_one_p95_request(
    floors: tuple[int, int, int],
    expected: list[tuple[str, int, int]],
    shared: tuple[int, int],
    small: tuple[str, ...],
) -> None:
    policy = tierpolicy_manifest()
    for index, floor in enumerate(floors):
        policy.tier(f"t{index}", floor=floor, lend=100)

    plan = plan_pool(_small_engine_pool().obj(), policy.obj(), 2048)

    assert isinstance(plan, PoolPlan)
    assert [(t.name, t.floor_tokens, t.floor_slots) for t in plan.tiers] == expected
    assert (plan.shared_tokens, plan.shared_slots) == shared
    assert plan.small_floors == small
    assert len([w for w in plan.warnings if "less than one p95 request" in w]) == len(small)


def test_measurement_wins_over_declared_figure() -> None:
    pool = modelpool_manifest().capacity(kvTokensPerReplica=50_000).obj()

    plan = plan_pool(pool, standard_tierpolicy_manifest().obj(), 200_000)

    assert isinstance(plan, PoolPlan)
    assert (plan.kv_tokens_per_replica, plan.kv_source) == (200_000, "Measured")


def test_status_carries_every_tier_in_policy_order() -> None:
    plan = plan_pool(worked_example_pool().obj(), standard_tierpolicy_manifest().obj(), 200_000)
    assert isinstance(plan, PoolPlan)

    status = plan.to_status()

    assert [t.name for t in status.tiers] == ["interactive", "batch", "eval"]
    assert status.to_wire()["tiers"][0]["floorTokens"] == 270_000
    assert (status.shared_slots, status.slots_per_replica) == (78, 256)


@given(
    kv=st.integers(min_value=3_500, max_value=2_000_000),
    floors=st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=4),
    lends=st.lists(st.integers(min_value=0, max_value=100), min_size=4, max_size=4),
    peak=st.integers(min_value=0, max_value=400),
    bounds=st.tuples(st.integers(0, 5), st.integers(0, 20)),
    target=st.integers(min_value=1, max_value=100),
)
def test_plan_invariants(
    kv: int,
    floors: list[int],
    lends: list[int],
    peak: int,
    bounds: tuple[int, int],
    target: int,
) -> None:
    """Floors never exceed the pool, lendable never exceeds a floor, R within bounds."""
    if sum(floors) > 100:
        floors = [f * 100 // sum(floors) for f in floors]
    policy = tierpolicy_manifest()
    for index, (floor, lend) in enumerate(zip(floors, lends, strict=False)):
        policy.tier(f"t{index}", floor=max(floor, 1), lend=lend)
    low, high = min(bounds), max(bounds)
    pool = (
        modelpool_manifest().replicas(low, high).capacity(kvUtilizationTarget=target).peak(t0=peak)
    )

    plan = plan_pool(pool.obj(), policy.obj(), kv)

    if isinstance(plan, PlanError):
        assert plan.reason == REPLICA_TOO_SMALL
        return
    assert low <= plan.replicas <= high
    assert plan.shared_tokens >= 0
    assert plan.shared_slots >= 0
    assert sum(t.floor_tokens for t in plan.tiers) + plan.shared_tokens == plan.total_tokens
    one_request = 2048 + 1024  # the builder's p95 prompt + output
    for tier in plan.tiers:
        if plan.total_slots > 0 and not any(tier.name in w for w in plan.warnings):
            assert tier.floor_slots >= 1  # never rounded to 0 slots silently
            assert tier.floor_tokens >= one_request
        assert 0 <= tier.lendable_tokens <= tier.floor_tokens
        assert 0 <= tier.lendable_slots <= tier.floor_slots
    if peak and plan.replicas < high:
        # not clamped by maxReplicas: the top tier's floor holds its peak plus headroom
        top_floor = max(floors[0], 1)
        held = plan.replicas * plan.live_sequences_per_replica * top_floor
        assert held >= peak * 120  # R * L * floor% >= peak * (100 + headroom%)
