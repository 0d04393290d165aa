"""The admission snapshot: in use versus plan per tier and replica, queues and counters.

Why it exists: the gateway exports an :class:`~.verdicts.AdmissionSnapshot` as metrics
(in use against each tier's floor, what is borrowed and lent, the overcommit while a
shrunk plan drains) and on its debug endpoint, and each gateway replica's lease demand
(:mod:`kvpool.domain.lease`) reads the tokens of the request at every tier's head from
it. Reading the ledger for those figures is a job of its own, apart from admitting:
:func:`take_snapshot` only reads a :class:`~.state.PoolState` (plus the controller's
counters it is handed) and changes nothing, so a snapshot taken at any moment cannot
alter a decision.

Worked example (tiers hi, lo with F = 400 each, S = 200; lo holds 800 tokens): lo's
borrowed 400 tokens are shared 200 + hi 200, so lo shows ``in_use_tokens`` 800,
``borrowed_tokens`` 400, hi shows ``lent_tokens`` 200 and the pool
``shared_used_tokens`` 200.
"""

from __future__ import annotations

from kvpool.domain.admission.amount import ZERO
from kvpool.domain.admission.feasibility import lent_by_tier, position, shared_in_use
from kvpool.domain.admission.ledger import TierState
from kvpool.domain.admission.state import PoolState
from kvpool.domain.admission.verdicts import AdmissionSnapshot, ReplicaUsage, TierUsage


def take_snapshot(
    state: PoolState,
    *,
    preempt_admissions: int,
    mean_hold_seconds: float | None,
    estimate_error_tokens: int,
    settled: int,
) -> AdmissionSnapshot:
    """In-use vs plan per tier and replica, queue sizes, and the controller's counters
    (passed in: the preemptive admissions, the mean hold time, the summed estimate error
    of the ``settled`` releases that reported their actual tokens)."""
    pool = state.pool
    lent = lent_by_tier(state)
    overcommit = position(state, None, ZERO, None).deficit.clamp0()
    shared_used = shared_in_use(state)
    tiers = tuple(
        TierUsage(
            tier=t.name,
            rank=t.rank,
            in_use_tokens=t.used.tokens,
            in_use_slots=t.used.slots,
            floor_tokens=t.floor.tokens,
            floor_slots=t.floor.slots,
            borrowed_tokens=(t.used - t.floor).clamp0().tokens,
            borrowed_slots=(t.used - t.floor).clamp0().slots,
            lent_tokens=lent.get(t.name, ZERO).tokens,
            lent_slots=lent.get(t.name, ZERO).slots,
            queued_requests=t.queued_count,
            queued_tokens=t.queued.tokens,
            queued_slots=t.queued.slots,
            head_tokens=_head_tokens(state, t),
        )
        for t in state.order
    )
    replicas = tuple(
        ReplicaUsage(
            name=r.name,
            track=r.track,
            ready=r.ready,
            reserved_tokens=r.reserved_tokens,
            reserved_slots=r.reserved_slots,
            capacity_tokens=pool.tokens_per_replica,
            capacity_slots=pool.slots_per_replica,
        )
        for r in state.replicas.values()
    )
    return AdmissionSnapshot(
        pool=pool.name,
        total_tokens=pool.total_tokens,
        total_slots=pool.total_slots,
        in_use_tokens=state.used.tokens,
        in_use_slots=state.used.slots,
        shared_used_tokens=shared_used.tokens,
        shared_used_slots=shared_used.slots,
        overcommit_tokens=overcommit.tokens,
        overcommit_slots=overcommit.slots,
        tiers=tiers,
        replicas=replicas,
        in_flight=len(state.reservations),
        queued=len(state.waiting),
        preempt_admissions=preempt_admissions,
        mean_hold_seconds=mean_hold_seconds,
        estimate_error_tokens=estimate_error_tokens,
        settled=settled,
    )


def _head_tokens(state: PoolState, tier: TierState) -> int:
    """What the tier's next request to start reserves (0 when none may start): the unit
    in which gateway replicas split the tier's capacity (kvpool.domain.lease)."""
    head = state.waiting.head(tier) if tier.queues else None
    return head.request.amount.tokens if head is not None else 0
