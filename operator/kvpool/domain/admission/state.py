"""What one pool has reserved and what waits: its plan, tiers, replicas and reservations.

Why this module exists: every admission decision (the dispatcher, feasibility, the wait
estimate, the snapshot) reads the same mutable figures, and every decision that starts or
ends a request changes several of them together: the tier's use, the pool's use, the
tenant's use and in-flight count, the replica's per-rank use, the cached fair picks. This
class owns those figures and the two changes - :meth:`PoolState.commit` and
:meth:`PoolState.uncommit` - so that the sums always agree (a tier's use is the sum of
its reservations, and so is a replica's). It decides nothing: what may start is decided
by :mod:`.dispatch` with :mod:`.feasibility`, holds and lending gates.

Installing a plan (:meth:`PoolState.apply_plan`) keeps in-flight reservations: a tier
that left the policy is retired (floor 0, ranked below every live tier, so its requests
are the preemptible ones) until its last reservation ends; a replica that left the config
is kept unlisted until it is empty.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.api.admission_config import CompiledPool, CompiledTier
from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.fair_queue import FairQueue
from kvpool.domain.admission.ledger import ReplicaState, Reservation, TierState, Waiting


class PoolState:
    """The accounting of one pool (see the module docstring). Not thread-safe."""

    def __init__(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> None:
        self.tiers: dict[str, TierState] = {}
        self.order: list[TierState] = []  # by rank, highest priority first
        self.replicas: dict[str, ReplicaState] = {}
        self.reservations: dict[str, Reservation] = {}
        self.tenant_inflight: dict[str, int] = {}
        self.waiting = FairQueue(self.tenant_inflight)
        self.used = ZERO  # reserved by every request in flight
        self.pool = pool
        self.total = ZERO  # the plan's tokens and slots
        self.shared = ZERO  # the remainder no tier owns
        self.per_replica = ZERO  # what one replica holds
        self.whole: PoolState | None = None  # the whole plan, where ``pool`` is a lease of it
        self.apply_plan(pool, tiers)

    def apply_plan(
        self,
        pool: CompiledPool,
        tiers: Sequence[CompiledTier],
        whole: CompiledPool | None = None,
    ) -> list[TierState]:
        """Install a plan (``whole``: the plan ``pool`` is a lease of, if it is one); returns
        the tier states that left the policy."""
        self.whole = None if whole is None else PoolState(whole, tiers)
        self.pool = pool
        self.total = Amount(pool.total_tokens, pool.total_slots)
        self.shared = Amount(pool.shared_tokens, pool.shared_slots).clamp0()  # no tier's
        self.per_replica = Amount(pool.tokens_per_replica, pool.slots_per_replica)
        names = {t.name for t in tiers}
        for tier in tiers:
            self.tiers.setdefault(tier.name, TierState(tier.name)).configure(tier, pool)
        removed = [t for name, t in self.tiers.items() if name not in names and not t.removed]
        for state in removed:
            state.retire()
        # retired tiers rank below every live tier (their reservations are preemptible)
        base = max((t.rank for t in tiers), default=0) + 1
        retired = sorted((t for t in self.tiers.values() if t.removed), key=lambda s: s.rank)
        for offset, state in enumerate(retired):
            state.rank = base + offset
        self.order = sorted(self.tiers.values(), key=lambda s: s.rank)
        for state in self.order:
            state.head_valid = False
        listed: set[str] = set()
        for track in pool.tracks:
            for endpoint in track.endpoints:
                listed.add(endpoint.name)
                replica = self.replicas.get(endpoint.name)
                if replica is None:
                    self.replicas[endpoint.name] = ReplicaState(
                        endpoint.name, endpoint.url, track.name, endpoint.ready
                    )
                else:
                    replica.url, replica.track = endpoint.url, track.name
                    replica.up, replica.listed = endpoint.ready, True
        for name, replica in list(self.replicas.items()):
            if name not in listed:
                replica.listed = False
                if replica.empty:
                    del self.replicas[name]
        return removed

    def drop_tier(self, tier: TierState) -> None:
        """Forget a retired tier (nothing of it runs or waits any more)."""
        if self.tiers.get(tier.name) is tier:
            del self.tiers[tier.name]
            self.order = [t for t in self.order if t is not tier]

    def commit(
        self,
        tier: TierState,
        waiting: Waiting,
        size: Amount,
        replica: ReplicaState | None,
        now: float,
        *,
        borrowed: bool,
    ) -> Reservation:
        """Start a waiting request: unqueue it and count ``size`` everywhere it is held."""
        req = waiting.request
        self.waiting.unqueue(waiting)
        tier.used += size
        self.used += size
        tier.tenant_tokens[req.tenant] = tier.tenant_tokens.get(req.tenant, 0) + size.tokens
        self.tenant_inflight[req.tenant] = self.tenant_inflight.get(req.tenant, 0) + 1
        FairQueue.touch(tier, req.tenant, self.order)
        if replica is not None:
            replica.add(tier.rank, size.tokens, size.slots, +1)
        reservation = Reservation(req, tier, size, now, replica, tier.rank, borrowed)
        self.reservations[req.request_id] = reservation
        return reservation

    def uncommit(self, reservation_id: str) -> Reservation | None:
        """End a reservation (None: unknown or already ended) and uncount it everywhere;
        a retired tier or an unlisted replica left empty is forgotten."""
        res = self.reservations.pop(reservation_id, None)
        if res is None:
            return None
        req, tier, held = res.request, res.tier, res.amount
        tier.used -= held
        self.used -= held
        left = tier.tenant_tokens.get(req.tenant, 0) - held.tokens
        if left > 0:
            tier.tenant_tokens[req.tenant] = left
        else:
            tier.tenant_tokens.pop(req.tenant, None)
        inflight = self.tenant_inflight.get(req.tenant, 0) - 1
        if inflight > 0:
            self.tenant_inflight[req.tenant] = inflight
        else:
            self.tenant_inflight.pop(req.tenant, None)
        FairQueue.touch(tier, req.tenant, self.order)
        if res.replica is not None:
            res.replica.add(res.rank, held.tokens, held.slots, -1)
            if not res.replica.listed and res.replica.empty:
                self.replicas.pop(res.replica.name, None)
        if tier.removed and tier.used.is_zero and tier.queued_count == 0:
            self.drop_tier(tier)
        return res
