"""The records admission keeps: per tier, per replica, per reservation and per waiter.

Why this module exists: these are the plain records the pool's state
(:mod:`.state`) holds and every decision module reads - the dispatcher, feasibility, the
wait estimate, prefill holds, the fair queue. They carry accounting, not decisions (the
one method with arithmetic, :meth:`ReplicaState.load`, is the view routing needs); keeping
them in one module lets each decision module import them without importing another.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvpool.api.admission_config import CompiledPool, CompiledTier
from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.verdicts import AdmissionRequest
from kvpool.domain.routing import ReplicaLoad


class TierState:
    """Mutable per-tier accounting of one pool."""

    __slots__ = (
        "engine_priority",
        "floor",
        "head",
        "head_valid",
        "lend",
        "max_wait",
        "name",
        "prefill_hold",
        "queued",
        "queued_count",
        "queues",
        "rank",
        "reclaim",
        "removed",
        "tenant_tokens",
        "used",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.rank = 0
        self.engine_priority = 0
        self.max_wait = 0.0
        self.reclaim = "Wait"
        self.removed = False
        self.prefill_hold = 0.0  # seconds a request of this tier holds lower tiers off its replica
        self.floor = ZERO  # guaranteed to the tier
        self.lend = ZERO  # the part of the floor others may borrow while it is idle
        self.used = ZERO  # reserved by the tier's requests in flight
        self.queued = ZERO  # what its waiting requests need
        self.queued_count = 0
        self.queues: dict[str, deque[Waiting]] = {}
        self.tenant_tokens: dict[str, int] = {}
        self.head: Waiting | None = None  # cached fairness pick (FairQueue.head)
        self.head_valid = False

    def configure(self, tier: CompiledTier, pool: CompiledPool) -> None:
        alloc = pool.tiers.get(tier.name)
        self.rank = tier.rank
        self.engine_priority = tier.engine_priority
        self.max_wait = max(0.0, tier.max_queue_wait_seconds)
        self.reclaim = tier.reclaim
        self.removed = False
        self.prefill_hold = max(0.0, tier.ttft_p95_target_seconds or 0.0)
        if alloc is None:
            self.floor = self.lend = ZERO
        else:
            self.floor = Amount(alloc.floor_tokens, alloc.floor_slots)
            self.lend = Amount(alloc.lendable_tokens, alloc.lendable_slots).min(self.floor)

    def retire(self) -> None:
        """The tier left the policy: keep its reservations, guarantee it nothing."""
        self.removed = True
        self.prefill_hold = 0.0
        self.floor = self.lend = ZERO


@dataclass
class ReplicaState:
    """Reservations on one replica; also a :class:`ReplicaView` for :func:`decide_replica`."""

    name: str
    url: str
    track: str
    up: bool  # ready per config / set_replica_ready
    listed: bool = True  # still in the config (else kept only until its reservations end)
    reserved_tokens: int = 0
    reserved_slots: int = 0
    by_rank: dict[int, list[int]] = field(default_factory=dict)  # rank -> [tokens, slots]
    preemptible_tokens: int = 0  # always 0 here; see load() for the Preempt view
    preemptible_slots: int = 0
    # prefill holds (kept by :mod:`.holds`): request id -> (its tier's rank, until when);
    # lower ranks wait meanwhile
    holds: dict[str, tuple[int, float]] = field(default_factory=dict)
    held_since: float | None = None  # lower tiers were last let through (or first held) then

    @property
    def ready(self) -> bool:
        return self.up and self.listed

    def load(self, below_rank: int) -> ReplicaLoad:
        """A view where reservations of ranks below ``below_rank`` count as preemptible."""
        pre_t = pre_s = 0
        for rank, (t, s) in self.by_rank.items():
            if rank > below_rank:
                pre_t += t
                pre_s += s
        return ReplicaLoad(
            name=self.name,
            track=self.track,
            ready=self.ready,
            reserved_tokens=self.reserved_tokens,
            reserved_slots=self.reserved_slots,
            preemptible_tokens=pre_t,
            preemptible_slots=pre_s,
        )

    def add(self, rank: int, tokens: int, slots: int, sign: int) -> None:
        self.reserved_tokens += sign * tokens
        self.reserved_slots += sign * slots
        cell = self.by_rank.setdefault(rank, [0, 0])
        cell[0] += sign * tokens
        cell[1] += sign * slots
        if cell == [0, 0]:
            del self.by_rank[rank]

    @property
    def empty(self) -> bool:
        return self.reserved_tokens == 0 and self.reserved_slots == 0


@dataclass
class Reservation:
    """One admitted request: what it holds, where, since when."""

    request: AdmissionRequest
    tier: TierState
    amount: Amount  # what it holds: its whole need inside its floor, else borrow_tokens
    admitted_at: float
    replica: ReplicaState | None
    rank: int  # rank at admission (replica per-rank accounting)
    borrowed: bool = False  # started on borrowed capacity (counts against lent limits)


@dataclass
class Waiting:
    """One queued request (``alive`` False once unqueued: removal is lazy)."""

    request: AdmissionRequest
    tier: TierState
    arrived_at: float
    deadline: float
    seq: int
    alive: bool = True


@dataclass(frozen=True)
class Position:
    """How far a hypothetical state is from feasible (<= 0: feasible), per dimension."""

    deficit: Amount
    lower_over: Amount  # capacity lower-priority tiers hold above their floors

    @property
    def feasible(self) -> bool:
        return self.deficit.fits_in(ZERO)
