"""Per-track admission during a rollout: the canary track has its own plan (compile), the
gateway builds one admission controller per track (routing.build_track_pool, PoolRuntime),
and batch tiers stay off a canary unless listed."""

from __future__ import annotations

import asyncio

import pytest

from kvpool.api.admission_config import CompiledPool, Endpoint, TierAllocation, Track, TrackPlan
from kvpool.api.modelpool import ModelPool
from kvpool.api.plan import PlanStatus, TierPlanStatus
from kvpool.domain.admission import REASON_TOO_LARGE_FOR_POOL, AdmissionRequest, Admit, Reject
from kvpool.domain.compile import CanaryInput, PoolInput, build_compiled_pool
from kvpool.domain.rollout.track_plan import plan_canary
from kvpool.domain.routing import build_track_pool, decide_track
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pool_runtime import PoolRuntime
from tests.builders import CompiledPoolBuilder, modelpool_manifest, standard_tierpolicy_manifest


def canary_plan(tokens: int, slots: int) -> TrackPlan:
    return TrackPlan(
        replicas=1,
        tokens_per_replica=tokens,
        slots_per_replica=slots,
        total_tokens=tokens,
        total_slots=slots,
        shared_tokens=tokens // 2,
        shared_slots=slots // 2,
        tiers={
            "interactive": TierAllocation(
                floor_tokens=tokens // 2,
                floor_slots=slots // 2,
                lendable_tokens=tokens // 2,
                lendable_slots=slots // 2,
            )
        },
    )


CANARY_PLAN = canary_plan(500, 4)


def rollout_pool(plan: TrackPlan | None = CANARY_PLAN, weight: int = 50) -> CompiledPool:
    base = (
        CompiledPoolBuilder()
        .capacity(2000, 16)
        .tier("interactive", 1000, 8)
        .tier("batch", 600, 4)
        .replicas(2)
        .obj()
    )
    canary = Track(
        name="canary",
        revision="rev-canary",
        weight=weight,
        endpoints=[Endpoint(name="c0", url="http://127.0.0.1:9100")],
        plan=plan,
    )
    return base.model_copy(
        update={"tracks": [*base.tracks, canary], "canary_tiers": ["interactive"]}
    )


def test_the_canary_track_pool_admits_against_its_own_plan() -> None:
    view = build_track_pool(rollout_pool(), "canary")
    assert view is not None
    assert (view.tokens_per_replica, view.total_tokens, view.replicas) == (500, 500, 1)
    assert [t.name for t in view.tracks] == ["canary"]
    assert set(view.tiers) == {"interactive"}
    stable = build_track_pool(rollout_pool(), "stable")
    assert stable is not None and stable.tokens_per_replica == 1000
    assert [e.name for e in stable.tracks[0].endpoints] == ["s0", "s1"]


def test_a_canary_without_a_plan_of_its_own_has_no_track_pool() -> None:
    assert build_track_pool(rollout_pool(plan=None), "canary") is None


@pytest.mark.parametrize(
    ("tier", "draw", "canary"),
    [
        pytest.param("batch", 0.0, False, id="batch-never-on-canary"),
        pytest.param("batch", 0.99, False, id="batch-never-on-canary-any-draw"),
        pytest.param("interactive", 0.1, True, id="interactive-under-weight"),
        pytest.param("interactive", 0.6, False, id="interactive-over-weight"),
    ],
)
def test_only_listed_tiers_reach_the_canary(tier: str, draw: float, canary: bool) -> None:
    verdict = decide_track(rollout_pool(), tier, draw)
    assert getattr(verdict, "canary", None) is canary


def request(rid: str, tokens: int, track: str) -> AdmissionRequest:
    return AdmissionRequest(
        request_id=rid, tenant="t", tier="interactive", tokens=tokens, track=track
    )


def test_the_gateway_admits_each_track_against_its_own_plan() -> None:
    async def scenario() -> tuple[Admit | Reject, Admit | Reject, Admit | Reject]:
        pool = rollout_pool()
        runtime = PoolRuntime(
            pool,
            CompiledPoolBuilder().tier("interactive", 1, 1).tier("batch", 1, 1).tiers(),
            GatewayMetrics(),
        )
        try:
            # 800 tokens fit a 1,000-token stable replica, never a 500-token canary replica
            on_stable = await runtime.admit(request("a", 800, "stable"))
            on_canary = await runtime.admit(request("b", 800, "canary"))
            small = await runtime.admit(request("c", 200, "canary"))
            if isinstance(small, Admit):
                runtime.release(small.reservation_id)
            if isinstance(on_stable, Admit):
                runtime.release(on_stable.reservation_id)
            return on_stable, on_canary, small
        finally:
            runtime.close()

    on_stable, on_canary, small = asyncio.run(scenario())
    assert isinstance(on_stable, Admit) and on_stable.replica in ("s0", "s1")
    assert isinstance(on_canary, Reject) and on_canary.reason == REASON_TOO_LARGE_FOR_POOL
    assert isinstance(small, Admit) and small.replica == "c0"


def test_the_tier_gauges_show_each_track_apart() -> None:
    """During a rollout on-call sees what the canary holds, not only stable."""

    async def scenario() -> GatewayMetrics:
        metrics = GatewayMetrics()
        tiers = CompiledPoolBuilder().tier("interactive", 1, 1).tier("batch", 1, 1).tiers()
        runtime = PoolRuntime(rollout_pool(), tiers, metrics)
        metrics.watch_snapshots(runtime.track_snapshots)
        try:
            assert isinstance(await runtime.admit(request("a", 200, "canary")), Admit)
            assert isinstance(await runtime.admit(request("b", 300, "stable")), Admit)
            return metrics
        finally:
            runtime.close()

    registry = asyncio.run(scenario()).registry

    def in_use(track: str) -> float | None:
        labels = {"pool": "pool", "track": track, "tier": "interactive", "kind": "in_use"}
        return registry.get_sample_value("kvpool_gateway_tier_tokens", labels)

    canary_total = registry.get_sample_value(
        "kvpool_gateway_pool_tokens", {"pool": "pool", "track": "canary", "kind": "total"}
    )
    assert (in_use("stable"), in_use("canary"), canary_total) == (300, 200, 500)


def test_a_track_leaving_the_config_keeps_its_reservations_until_released() -> None:
    async def scenario() -> list[str]:
        pool = rollout_pool()
        tiers = CompiledPoolBuilder().tier("interactive", 1, 1).tier("batch", 1, 1).tiers()
        runtime = PoolRuntime(pool, tiers, GatewayMetrics())
        try:
            held = await runtime.admit(request("a", 200, "canary"))
            assert isinstance(held, Admit)
            stable_only = pool.model_copy(update={"tracks": pool.tracks[:1]})
            runtime.reconfigure(stable_only, tiers)
            alive = sorted(runtime.controllers)
            runtime.release(held.reservation_id)
            return [*alive, "|", *sorted(runtime.controllers)]
        finally:
            runtime.close()

    assert asyncio.run(scenario()) == ["canary", "stable", "|", "stable"]


def _plan(replicas: int, usable: int, live: int) -> PlanStatus:
    return PlanStatus(
        replicas=replicas,
        usable_kv_tokens_per_replica=usable,
        live_sequences_per_replica=live,
        total_tokens=replicas * usable,
        total_slots=replicas * live,
        shared_tokens=0,
        shared_slots=0,
        tiers=[
            TierPlanStatus(
                name="interactive",
                floor_tokens=1,
                floor_slots=1,
                lendable_tokens=1,
                lendable_slots=1,
            )
        ],
    )


@pytest.mark.parametrize(
    ("all_tiers", "spec_tiers", "expected"),
    [
        pytest.param(False, [], ["interactive"], id="default-top-tier-only"),
        pytest.param(False, ["batch"], ["batch"], id="listed"),
        pytest.param(True, [], ["interactive", "batch", "eval"], id="promotion-all-tiers"),
    ],
)
def test_compiled_canary_tiers(all_tiers: bool, spec_tiers: list[str], expected: list[str]) -> None:
    builder = modelpool_manifest().lengths((100, 200), (50, 100)).engine(maxModelLen=512)
    doc = builder.dict()
    doc["spec"]["rollout"] = {"canaryTiers": spec_tiers}
    doc["metadata"]["uid"] = "u"
    pool = ModelPool.model_validate(doc)
    canary = CanaryInput("rev-b", 10, all_tiers, _plan(1, 921, 3), ())
    item = PoolInput(pool, _plan(2, 1843, 6), "rev-a", (), canary)
    compiled = build_compiled_pool(item, standard_tierpolicy_manifest().obj())
    assert compiled.canary_tiers == expected
    tracks = {t.name: t for t in compiled.tracks}
    assert (tracks["stable"].weight, tracks["canary"].weight) == (90, 10)
    assert tracks["canary"].plan is not None and tracks["canary"].plan.tokens_per_replica == 921


def test_a_canary_without_a_plan_compiles_with_weight_zero() -> None:
    pool = modelpool_manifest().lengths((100, 200), (50, 100)).engine(maxModelLen=512).obj()
    item = PoolInput(
        pool, _plan(2, 1843, 6), "rev-a", (), CanaryInput("rev-b", 50, False, None, ())
    )
    canary = next(
        t
        for t in build_compiled_pool(item, standard_tierpolicy_manifest().obj()).tracks
        if t.name == "canary"
    )
    assert canary.weight == 0 and canary.plan is None


def test_canary_plan_is_its_measured_kv_over_its_replicas() -> None:
    """1,024 measured tokens -> 921 usable -> 3 sequences of 300 (sizing); floors over 1
    replica, the slots a share of its maxNumSeqs (256)."""
    pool = (
        modelpool_manifest().lengths((100, 200), (50, 100)).engine(maxModelLen=512).replicas(1, 2)
    )
    planned = plan_canary(pool.obj(), standard_tierpolicy_manifest().obj(), 1024, 1)
    assert planned.track is not None
    assert (
        planned.track.usable_kv_tokens_per_replica,
        planned.track.live_sequences_per_replica,
    ) == (921, 3)
    interactive = planned.track.tiers[0]
    assert (interactive.floor_tokens, interactive.floor_slots) == (460, 128)
    assert getattr(planned.full, "replicas", None) == 1
