"""The dispatcher: which waiting requests start now, by priority, floors and fairness.

Why this module exists: the order in which queued requests start is the policy itself -
priority between tiers, guarantees within floors, fairness within a tier - and it must be
decided the same way after every change (an offer, a release, a cancel, an expiry, a
reconfigure, a replica's readiness, a first token). :class:`Dispatcher` holds that one
walk; the rules it asks are elsewhere (:mod:`.feasibility` for capacity, :mod:`.holds`
for prefill holds, :mod:`.lending` for the pause and lent limits, :mod:`.fair_queue` for
the fair pick, :func:`kvpool.domain.routing.decide_replica` for the replica).

The walk (docs/0003-admission.md §3 "Order"): tiers in priority (rank) order; within a
tier the waiting tenant with the lowest ``in-use tokens / weight`` goes next (FIFO within
a tenant; a tenant at its ``max_concurrency`` is skipped). If a tier's next request
cannot start, lower tiers may still start requests *within their own floor* (no
starvation) but may not borrow (priority), and a tier whose next request fits in its own
floor holds that amount back from borrowers (reclaim by waiting). Passes repeat until one
starts nothing, so the queue is always at a fixed point.

Sizes: inside its floor a request reserves its whole (learned) need; above it, the
overcommitted ``borrow_tokens`` (:mod:`.adaptation`). ``reclaim: Preempt`` lets a request
inside its floor start over lower-priority borrowers (the engine's priority scheduler
preempts them), bounded by what those borrowers hold above their floors - also when the
pool has room for it but in pieces no one replica holds (each replica a little short),
where it starts on the replica whose lower-priority reservations make room: the pool
stays within its plan, and the engine preempts at most the request's size there.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.domain.admission.amount import Amount
from kvpool.domain.admission.feasibility import borrow_sources, inside_floor, position, within_floor
from kvpool.domain.admission.holds import PrefillHolds
from kvpool.domain.admission.ledger import ReplicaState, TierState, Waiting
from kvpool.domain.admission.lending import LendingGate
from kvpool.domain.admission.state import PoolState
from kvpool.domain.admission.verdicts import Admit
from kvpool.domain.routing import NoReplica, ReplicaView, decide_replica


class Dispatcher:
    """Starts what can start in one pool (see the module docstring)."""

    def __init__(self, state: PoolState, holds: PrefillHolds, lending: LendingGate) -> None:
        self.state = state
        self.holds = holds
        self.lending = lending
        self.preempt_admissions = 0  # cumulative Admit(preempts=True)

    def run(self, now: float, only: Waiting | None = None) -> list[Admit]:
        """Start every waiting request that can start, by priority, floors and fairness.

        Passes repeat until one starts nothing: a start can change another tier's pick
        (its tenant reaching ``max_concurrency`` lets another tenant's request move up).
        With ``only`` (a request just enqueued by an offer), one pass: the queue was at a
        fixed point before it arrived, so only ``only`` can start.
        """
        admitted: list[Admit] = []
        while self.state.waiting:
            started = self._pass(now, only)
            admitted.extend(started)
            if not started or only is not None:
                break
        return admitted

    def _pass(self, now: float, only: Waiting | None) -> list[Admit]:
        """One pass over the tiers in priority order.

        With ``only``, higher tiers' eligible heads are known to be blocked (they close
        borrowing) and the walk stops at its tier.
        """
        admitted: list[Admit] = []
        waiting = self.state.waiting
        if not waiting:
            return admitted
        heads: dict[str, Waiting | None] = {}
        wants: dict[str, Amount] | None = None  # built on the first borrowing check
        borrowing_closed = False
        for tier in self.state.order:
            if only is not None and tier.rank > only.tier.rank:
                break
            head = heads[tier.name] = waiting.head(tier) if tier.queues else None
            while head is not None:
                if only is not None and head is not only:
                    borrowing_closed = True  # a blocked head (fixed point) waits before it
                    break
                within = within_floor(tier, head.request)
                if not within and borrowing_closed:
                    break
                if not within and wants is None:
                    wants = self._wants(heads)
                admit = self._try_start(tier, head, within, wants, now)
                if admit is None:
                    borrowing_closed = True
                    break
                admitted.append(admit)
                head = heads[tier.name] = waiting.head(tier) if tier.queues else None
                if wants is not None:
                    wants.pop(tier.name, None)
                    if head is not None and within_floor(tier, head.request):
                        wants[tier.name] = head.request.amount
        return admitted

    def _wants(self, heads: dict[str, Waiting | None]) -> dict[str, Amount]:
        """Per tier, what its next request needs within its own floor (held from borrowers)."""
        wants: dict[str, Amount] = {}
        waiting = self.state.waiting
        for tier in self.state.order:
            if tier.name in heads:
                head = heads[tier.name]
            else:
                head = heads[tier.name] = waiting.head(tier) if tier.queues else None
            if head is not None and within_floor(tier, head.request):
                wants[tier.name] = head.request.amount
        return wants

    def _try_start(
        self,
        tier: TierState,
        waiting: Waiting,
        within: bool,
        wants: dict[str, Amount] | None,
        now: float,
    ) -> Admit | None:
        state = self.state
        req = waiting.request
        inside = inside_floor(tier, req)
        if not within and self.lending.blocked(tier.rank):
            return None
        size = req.amount if inside else Amount(req.borrowing_tokens, req.slots)
        pos = position(state, tier, size, None if within else wants)
        # a Preempt tier's floor request may start over lower-priority borrowers: when the
        # pool has no room (bounded by what they hold above their floors), and when it has
        # room but in pieces no one replica holds (the pool stays within its plan)
        reclaims = within and inside and tier.reclaim == "Preempt"
        preempts = False
        if not pos.feasible:
            if not (reclaims and pos.deficit.fits_in(pos.lower_over)):
                return None
            preempts = True
        replica: ReplicaState | None = None
        if state.replicas:
            picked = self._pick_replica(tier, size, req.track, reclaims, now)
            if picked is None:
                return None
            replica, on_replica = picked
            preempts = preempts or on_replica
        borrowed_from: tuple[str, ...] = ()
        if not inside:
            borrowed_from = borrow_sources(state, tier, size)
        state.commit(tier, waiting, size, replica, now, borrowed=not within)
        if replica is not None:
            self.holds.started(replica, tier, req.request_id, now)
        if not within:
            self.lending.started(tier.rank)
        if preempts:
            self.preempt_admissions += 1
        return Admit(
            request_id=req.request_id,
            tenant=req.tenant,
            tier=tier.name,
            tokens=size.tokens,
            slots=size.slots,
            outcome="admitted" if inside else "borrowed",
            borrowed_from=borrowed_from,
            replica=replica.name if replica else None,
            replica_url=replica.url if replica else None,
            track=replica.track if replica else None,
            preempts=preempts,
            queued_seconds=max(0.0, float(now - waiting.arrived_at)),
            engine_priority=tier.engine_priority,
        )

    def _pick_replica(
        self, tier: TierState, size: Amount, track: str | None, may_preempt: bool, now: float
    ) -> tuple[ReplicaState, bool] | None:
        """The least-reserved open replica of the track that holds the request, and whether
        it holds it only by preempting lower-priority reservations (replicas that hold it
        without are preferred; None: wait)."""
        state = self.state
        open_replicas = [
            r for r in state.replicas.values() if not self.holds.blocks(r, tier.rank, now)
        ]
        views: Sequence[ReplicaView] = (
            [r.load(tier.rank) for r in open_replicas] if may_preempt else open_replicas
        )
        choice = decide_replica(
            views,
            tokens=size.tokens,
            slots=size.slots,
            tokens_per_replica=state.pool.tokens_per_replica,
            slots_per_replica=state.pool.slots_per_replica,
            track=track,
            allow_preempt=may_preempt,
        )
        if isinstance(choice, NoReplica):
            return None
        return state.replicas[choice.name], choice.preempts
