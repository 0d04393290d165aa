"""The capacity planner: how many warm replicas a pool needs and what each tier is guaranteed.

Why it exists: capacity is per model and engine configuration, and what a replica can
hold is its KV cache measured in tokens at the pool's real length mix, not a GPU
utilisation figure. From that one number (measured, or declared until measured) the
planner derives everything the gateway enforces. The formulas are fixed and explained
with a worked example in docs/0001-capacity-planning.md; in short:

- usable tokens per replica  U = floor(kv_tokens_per_replica * kvUtilizationTarget / 100)
- live sequences per replica L = min(maxNumSeqs, floor(U / (prompt.p95 + output.p95)))
- admission slots per replica S = maxNumSeqs (the engine's running batch)
- replicas R = clamp(max over tiers with a peak of
                     ceil(peak * (100 + headroom) / 100 / (L * floor% / 100)),
                     minReplicas, maxReplicas)
- per tier: floor tokens = floor(R * U * floor% / 100), floor slots = floor(R * S * floor% / 100),
  lendable = floor(floor * lend% / 100); shared = total - sum of floors.

**Slots are the engine's running batch; KV tokens carry the length mix.** ``L`` - how many
sequences of p95 length one replica's KV holds - sizes the replicas for a peak of
concurrent p95 sequences. It is not how many requests may run: an engine runs
``maxNumSeqs`` sequences, and shorter ones fit in the KV tokens many at a time. Admission
slots of ``L`` gave an engine that runs 8 sequences 2 or 3 places at a long-prompt mix: a
chat queued in the gateway for a slot while the engine had places and KV for it
(docs/0007-benchmarks.md).

Worked example (docs/0001): kv 200,000 tokens, target 90 -> U 180,000; p95 2,048 + 1,024
-> L = min(256, 58) = 58; interactive floor 50% with peak 60 and headroom 20% ->
ceil(60 * 120 / (58 * 50)) = ceil(2.48) = 3 replicas.

When ``maxReplicas`` clamps R below what a tier's peak needs, the plan marks that tier
capacity-short: the answer is more capacity, never a smaller reservation.

**No floor below one request.** A tier with ``floorPercent > 0`` gets at least one p95
request (prompt p95 + output p95 tokens) and one slot: a percentage that rounds lower
would let the tier's requests start only on borrowed capacity, which a busier tier of
higher priority always wins (the tier starves). The raise is taken from the shared
remainder first, then from the floors of other tiers above their own minimum, lowest
priority first; the plan warns (``PoolPlan.small_floors`` names the tiers, and the
ModelPool gets ``FloorTooSmall=True``). Worked example (one replica of 2,048 KV tokens at
90 %, 8 sequences, p95 request 128 + 64 = 192 tokens): floors 50/30/10 % are interactive
921 tokens / 4 slots, batch 552 / 2, eval 184 / 0 -> eval is raised to 192 / 1, taken from
the shared remainder (186 -> 178 tokens, 2 -> 1 slot). With floors 60/39/1 % the shared
remainder is too small: eval's 192 tokens take 172 from batch (718 -> 546).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvpool.api.modelpool import ModelPool
from kvpool.api.plan import PlanStatus, TierPlanStatus
from kvpool.api.tierpolicy import TierPolicy

CapacitySource = Literal["Measured", "Declared"]

# PlanError reasons (CamelCase constants, used as condition reasons).
CAPACITY_UNKNOWN = "CapacityUnknown"
REPLICA_TOO_SMALL = "ReplicaTooSmall"
ZERO_FLOOR_WITH_PEAK = "ZeroFloorWithPeak"
UNKNOWN_TIER = "UnknownTier"


@dataclass(frozen=True)
class TierAllocationPlan:
    """What one tier is guaranteed across the pool's warm replicas."""

    name: str
    floor_percent: int  # the policy's share, kept for display
    floor_tokens: int  # KV tokens guaranteed to the tier, summed over replicas
    floor_slots: int  # running-batch places guaranteed to the tier
    lendable_tokens: int  # part of floor_tokens other tiers may borrow while idle
    lendable_slots: int  # part of floor_slots other tiers may borrow while idle
    peak: int | None  # measured peak concurrent sequences (None: no peak declared)
    required_replicas: int | None  # replicas the peak needs at this floor (None: no peak)
    capacity_short: bool  # True when maxReplicas is below required_replicas


@dataclass(frozen=True)
class PoolPlan:
    """An admission plan for one pool: warm replicas and per-tier guarantees."""

    replicas: int  # warm replicas to keep
    kv_tokens_per_replica: int  # the capacity figure planned with
    kv_source: CapacitySource  # where that figure came from
    usable_tokens_per_replica: int  # U, after the utilisation target
    live_sequences_per_replica: int  # L, sequences of p95 length one replica holds (sizing)
    slots_per_replica: int  # S, admission slots: the engine's running batch (maxNumSeqs)
    total_tokens: int  # R * U
    total_slots: int  # R * S
    tiers: tuple[TierAllocationPlan, ...]  # in policy order, highest priority first
    shared_tokens: int  # tokens no tier reserves; go to waiting requests by priority
    shared_slots: int  # slots no tier reserves
    warnings: tuple[str, ...]  # capacity-short and similar, for humans
    small_floors: tuple[str, ...] = ()  # tiers whose floor% held less than one p95 request

    @property
    def capacity_short(self) -> bool:
        """Whether any tier's peak does not fit at maxReplicas."""
        return any(t.capacity_short for t in self.tiers)

    def tier(self, name: str) -> TierAllocationPlan:
        """The allocation of one tier."""
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_status(self) -> PlanStatus:
        """The plan as ModelPool ``status.plan``."""
        return PlanStatus(
            replicas=self.replicas,
            usable_kv_tokens_per_replica=self.usable_tokens_per_replica,
            live_sequences_per_replica=self.live_sequences_per_replica,
            slots_per_replica=self.slots_per_replica,
            total_tokens=self.total_tokens,
            total_slots=self.total_slots,
            shared_tokens=self.shared_tokens,
            shared_slots=self.shared_slots,
            tiers=[
                TierPlanStatus(
                    name=t.name,
                    floor_tokens=t.floor_tokens,
                    floor_slots=t.floor_slots,
                    lendable_tokens=t.lendable_tokens,
                    lendable_slots=t.lendable_slots,
                    required_replicas=t.required_replicas,
                    capacity_short=t.capacity_short,
                )
                for t in self.tiers
            ],
            warnings=list(self.warnings),
        )


@dataclass(frozen=True)
class PlanError:
    """No plan can be made; ``reason`` is a CamelCase constant, ``message`` has the numbers."""

    reason: str
    message: str


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def plan_pool(
    pool: ModelPool, tier_policy: TierPolicy, kv_tokens_per_replica: int | None
) -> PoolPlan | PlanError:
    """Plan warm replicas and per-tier floors for ``pool`` under ``tier_policy``.

    ``kv_tokens_per_replica`` is the measured KV capacity of one replica (the minimum
    over replicas of the revision); ``None`` means no measurement yet, and the pool's
    declared ``capacity.kvTokensPerReplica`` is used instead. With neither, the result
    is a ``PlanError(CapacityUnknown)``, never a guess.

    >>> # see docs/0001-capacity-planning.md for the worked example with every number
    """
    spec = pool.spec
    capacity = spec.capacity
    source: CapacitySource
    if kv_tokens_per_replica is not None:
        kv, source = kv_tokens_per_replica, "Measured"
    elif capacity.kv_tokens_per_replica is not None:
        kv, source = capacity.kv_tokens_per_replica, "Declared"
    else:
        return PlanError(
            CAPACITY_UNKNOWN,
            "no KV capacity measured yet and spec.capacity.kvTokensPerReplica is not set: "
            "no plan until the engines report vllm:cache_config_info",
        )

    usable = kv * capacity.kv_utilization_target // 100
    sequence_tokens = spec.workload.prompt_tokens.p95 + spec.workload.output_tokens.p95
    live = min(spec.engine.max_num_seqs, usable // sequence_tokens)
    if live < 1:
        return PlanError(
            REPLICA_TOO_SMALL,
            f"a replica cannot hold one p95 sequence: {usable} usable KV tokens "
            f"({kv} x {capacity.kv_utilization_target}%) < {sequence_tokens} "
            f"(prompt p95 {spec.workload.prompt_tokens.p95} + output p95 "
            f"{spec.workload.output_tokens.p95})",
        )

    tiers_by_name = {t.name: t for t in tier_policy.spec.tiers}
    for name in capacity.peak_concurrency:
        if name not in tiers_by_name:
            return PlanError(
                UNKNOWN_TIER,
                f"spec.capacity.peakConcurrency names tier {name!r}, which TierPolicy "
                f"{tier_policy.metadata.name!r} does not define",
            )

    required: dict[str, int] = {}
    for tier in tier_policy.spec.tiers:
        peak = capacity.peak_concurrency.get(tier.name, 0)
        if peak <= 0:
            continue
        if tier.floor_percent == 0:
            return PlanError(
                ZERO_FLOOR_WITH_PEAK,
                f"tier {tier.name!r} has a peak of {peak} concurrent sequences but "
                f"floorPercent 0: a tier with a peak needs a floor to size for",
            )
        required[tier.name] = _ceil_div(
            peak * (100 + capacity.headroom_percent), live * tier.floor_percent
        )

    wanted = max(required.values(), default=capacity.min_replicas)
    replicas = min(max(wanted, capacity.min_replicas), capacity.max_replicas)

    slots = spec.engine.max_num_seqs
    total_tokens, total_slots = replicas * usable, replicas * slots
    floors_t, floors_s, small, warnings = plan_floors(
        [(t.name, t.floor_percent) for t in tier_policy.spec.tiers],
        total_tokens,
        total_slots,
        sequence_tokens,
    )
    allocations: list[TierAllocationPlan] = []
    for tier in tier_policy.spec.tiers:
        floor_tokens, floor_slots = floors_t[tier.name], floors_s[tier.name]
        needed = required.get(tier.name)
        short = needed is not None and needed > capacity.max_replicas
        if short:
            warnings.append(
                f"capacity short for tier {tier.name!r}: its peak of "
                f"{capacity.peak_concurrency[tier.name]} sequences needs {needed} replicas "
                f"at floor {tier.floor_percent}%, maxReplicas is {capacity.max_replicas}"
            )
        allocations.append(
            TierAllocationPlan(
                name=tier.name,
                floor_percent=tier.floor_percent,
                floor_tokens=floor_tokens,
                floor_slots=floor_slots,
                lendable_tokens=floor_tokens * tier.lend_percent // 100,
                lendable_slots=floor_slots * tier.lend_percent // 100,
                peak=capacity.peak_concurrency.get(tier.name),
                required_replicas=needed,
                capacity_short=short,
            )
        )

    return PoolPlan(
        replicas=replicas,
        kv_tokens_per_replica=kv,
        kv_source=source,
        usable_tokens_per_replica=usable,
        live_sequences_per_replica=live,
        slots_per_replica=slots,
        total_tokens=total_tokens,
        total_slots=total_slots,
        tiers=tuple(allocations),
        shared_tokens=total_tokens - sum(a.floor_tokens for a in allocations),
        shared_slots=total_slots - sum(a.floor_slots for a in allocations),
        warnings=tuple(warnings),
        small_floors=tuple(small),
    )


def plan_floors(
    tiers: Sequence[tuple[str, int]], total_tokens: int, total_slots: int, one_request: int
) -> tuple[dict[str, int], dict[str, int], list[str], list[str]]:
    """Per-tier floors (tokens, slots) of ``(name, floorPercent)`` tiers in priority order:
    the percentages, each non-zero one raised to at least one p95 request (``one_request``
    tokens) and one slot, the raise taken from the shared remainder and then from other
    tiers' floors above their minimum, lowest priority first. Returns the floors, the
    raised tiers and the warnings."""
    floors_t = {name: total_tokens * pct // 100 for name, pct in tiers}
    floors_s = {name: total_slots * pct // 100 for name, pct in tiers}
    small: list[str] = []
    warnings: list[str] = []
    if total_tokens <= 0 or total_slots <= 0:
        return floors_t, floors_s, small, warnings  # no warm replica: nothing to guarantee
    for name, pct in tiers:
        if pct > 0 and (floors_t[name] < one_request or floors_s[name] < 1):
            small.append(name)
            warnings.append(
                f"floor of tier {name!r} ({pct}% = {floors_t[name]} tokens, "
                f"{floors_s[name]} slots) holds less than one p95 request ({one_request} "
                "tokens, 1 slot): raised to one request"
            )
            floors_t[name] = max(floors_t[name], one_request)
            floors_s[name] = max(floors_s[name], 1)
    dims = ((floors_t, total_tokens, one_request, "tokens"), (floors_s, total_slots, 1, "slots"))
    for floors, total, minimum, unit in dims:
        excess = sum(floors.values()) - total
        for name, pct in reversed(tiers):  # other floors above their minimum, lowest first
            if excess > 0 and name not in small and pct > 0:
                give = min(excess, max(0, floors[name] - minimum))
                floors[name] -= give
                excess -= give
        for name, _ in reversed(tiers):  # still too much: the lowest raised tiers lose it
            if excess > 0 and name in small:
                give = min(excess, floors[name])
                floors[name] -= give
                excess -= give
                warnings.append(
                    f"the pool's {total} {unit} cannot give every floor one p95 request: "
                    f"tier {name!r} keeps {floors[name]} {unit}; add replicas or remove "
                    "a floor"
                )
    return floors_t, floors_s, small, warnings
