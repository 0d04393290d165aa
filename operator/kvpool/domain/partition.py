"""Split a pool's admission plan between several gateway replicas.

Why it exists: admission state (reservations, queues) lives in each gateway process.
With N gateway replicas behind one Service, each admitting against the *whole* plan
would let the engines be committed up to N times over. Replicas sharing a Redis lease the
plan by demand (:mod:`kvpool.domain.lease`, docs/0008); this module is the static
alternative, an explicit ``--plan-share`` (and the equal split leases fall back to while
Redis is down): each replica enforces an equal share of the plan (100/N percent): its
floors, lendable parts, shared remainder and per-replica capacity are all scaled, so the
sum over the gateway replicas never exceeds the plan. The cost is rounding (each share is
floored) and imperfect use when traffic is unevenly spread over the gateway replicas;
the Service spreads connections evenly, which is what makes equal shares reasonable.

Worked example: a plan of 1,843 tokens / 8 slots per replica with an interactive floor of
1,197 tokens / 5 slots, at a 50% share, becomes 921 tokens / 4 slots per replica and an
interactive floor of 598 tokens / 2 slots in each of two gateways.

A tenant's ``maxConcurrency`` is counted in the same per-process state, so it is split
the same way (floored, but never below one request: a tenant allowed fewer requests than
there are gateway replicas can have one in flight through each).

So is the engines' poll budget. Every gateway replica polls every engine's ``/metrics``,
which vLLM renders whole (~47 KB, 3.4-5 ms) on the event loop that relays its tokens:
with 4 gateway replicas polling every 0.25 s each, chat p95 TTFT rose 1.26x and batch
output fell to 0.91x of no polling (``bench/engine_poll_cost.py``). Each replica therefore
polls ``N`` times less often, and an engine is polled at the configured rate in all.
"""

from __future__ import annotations

from kvpool.api.admission_config import CompiledPool, CompiledTenant, TierAllocation


def _share(value: int, percent: int) -> int:
    return value * percent // 100


def _check_share(share_percent: int) -> None:
    if not 1 <= share_percent <= 100:
        raise ValueError(f"share must be 1-100 percent, got {share_percent}")


def partition_pool(pool: CompiledPool, share_percent: int) -> CompiledPool:
    """The part of ``pool``'s plan one gateway replica may admit against.

    >>> from kvpool.api.admission_config import CompiledPool
    >>> # see tests/unit/test_partition.py for tables of cases
    """
    _check_share(share_percent)
    if share_percent == 100:
        return pool
    tiers = {
        name: TierAllocation(
            floor_tokens=_share(t.floor_tokens, share_percent),
            floor_slots=_share(t.floor_slots, share_percent),
            lendable_tokens=_share(t.lendable_tokens, share_percent),
            lendable_slots=_share(t.lendable_slots, share_percent),
        )
        for name, t in pool.tiers.items()
    }
    tokens_per_replica = _share(pool.tokens_per_replica, share_percent)
    slots_per_replica = _share(pool.slots_per_replica, share_percent)
    # totals are shares of the totals (not per-replica shares times replicas), so that
    # the floored floors always fit in them: sum(floor(f * p)) <= floor(sum(f) * p)
    total_tokens = _share(pool.total_tokens, share_percent)
    total_slots = _share(pool.total_slots, share_percent)
    return pool.model_copy(
        update={
            "tokens_per_replica": tokens_per_replica,
            "slots_per_replica": slots_per_replica,
            "total_tokens": total_tokens,
            "total_slots": total_slots,
            "tiers": tiers,
            # what the floors leave, after rounding, is shared by priority
            "shared_tokens": total_tokens - sum(t.floor_tokens for t in tiers.values()),
            "shared_slots": total_slots - sum(t.floor_slots for t in tiers.values()),
        }
    )


def partition_tenant(tenant: CompiledTenant, share_percent: int) -> CompiledTenant:
    """``tenant`` with the part of its ``max_concurrency`` one gateway replica enforces
    (tests/unit/test_partition.py has the table of cases)."""
    _check_share(share_percent)
    if share_percent == 100 or tenant.max_concurrency is None:
        return tenant
    limit = max(1, _share(tenant.max_concurrency, share_percent))
    return tenant.model_copy(update={"max_concurrency": limit})


def partition_poll_period(seconds: float, share_percent: int) -> float:
    """How often one gateway replica polls each engine so that all of them together poll
    every ``seconds``: ``seconds`` x N with a 100/N percent share.

    >>> partition_poll_period(0.25, 100), partition_poll_period(0.25, 25)
    (0.25, 1.0)
    """
    _check_share(share_percent)
    return seconds * 100 / share_percent
