"""The canary track's own admission plan, and what promoting the canary would cost.

Why it exists: a canary revision may hold fewer (or more) KV tokens per replica than
stable, and it runs fewer replicas. Admitting canary traffic against stable's plan would
overbook it, so the gateway admits on each track against that track's plan: the canary's
measured KV tokens per replica, its live sequences and its per-tier floors over the
canary replicas. The same planner (docs/0001) also says how many replicas the new
revision would need as the whole pool (``replicas_after_promotion``, capacity-short when
``maxReplicas`` cannot cover it), so the cost of promoting is visible before promoting.

Worked example (policy interactive 50% / batch 30%, p95 sequence 300 tokens, target 90%,
maxNumSeqs 8): canary measured 1,024 tokens -> 921 usable -> 3 live sequences; on 1 canary
replica of 8 slots the interactive floor is 460 tokens and 4 slots, batch 276 tokens and
2 slots.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.api.modelpool import ModelPool
from kvpool.api.plan import PlanStatus, TierPlanStatus
from kvpool.api.tierpolicy import TierPolicy
from kvpool.domain.planner import PlanError, PoolPlan, plan_pool


@dataclass(frozen=True)
class CanaryPlan:
    """The canary track's plan and the full-pool plan of its revision."""

    track: PlanStatus | None  # the plan over the canary replicas (None: no plan possible)
    full: PoolPlan | PlanError  # the revision planned as the whole pool


def scale_plan(plan: PoolPlan, policy: TierPolicy, replicas: int) -> PlanStatus:
    """``plan``'s per-replica figures over ``replicas`` replicas (same formulas, docs/0001).

    >>> # 921 usable tokens, 8 slots a replica, 1 replica, interactive 50%:
    >>> # floorTokens 460, floorSlots 4 (see tests/unit/test_rollout_tracks.py)
    """
    usable, live = plan.usable_tokens_per_replica, plan.live_sequences_per_replica
    slots = plan.slots_per_replica
    lend = {t.name: t.lend_percent for t in policy.spec.tiers}
    tiers = []
    for tier in plan.tiers:
        floor_tokens = replicas * usable * tier.floor_percent // 100
        floor_slots = replicas * slots * tier.floor_percent // 100
        share = lend.get(tier.name, 0)
        tiers.append(
            TierPlanStatus(
                name=tier.name,
                floor_tokens=floor_tokens,
                floor_slots=floor_slots,
                lendable_tokens=floor_tokens * share // 100,
                lendable_slots=floor_slots * share // 100,
            )
        )
    total_tokens, total_slots = replicas * usable, replicas * slots
    return PlanStatus(
        replicas=replicas,
        usable_kv_tokens_per_replica=usable,
        live_sequences_per_replica=live,
        slots_per_replica=slots,
        total_tokens=total_tokens,
        total_slots=total_slots,
        shared_tokens=total_tokens - sum(t.floor_tokens for t in tiers),
        shared_slots=total_slots - sum(t.floor_slots for t in tiers),
        tiers=tiers,
        warnings=list(plan.warnings),
    )


def plan_canary(
    pool: ModelPool, policy: TierPolicy, canary_kv: int | None, replicas: int
) -> CanaryPlan:
    """The canary's track plan over ``replicas`` and its revision's full-pool plan.

    Until the canary is measured, the declared ``capacity.kvTokensPerReplica`` is used
    (as for stable); with neither there is no track plan and the canary admits nothing.
    """
    full = plan_pool(pool, policy, canary_kv)
    if isinstance(full, PlanError):
        return CanaryPlan(track=None, full=full)
    return CanaryPlan(track=scale_plan(full, policy, replicas), full=full)
