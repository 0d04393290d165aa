"""What admission decides and reports: requests, verdicts with a reason, snapshots.

Why this module exists: the controller, the gateway and the tests share these types; they
carry no behaviour. Every rejection carries a ``reason`` constant (also the JSON error code
and a metric label); the HTTP status of a reason is the gateway's business
(:mod:`kvpool.gateway.outcomes`), not the domain's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvpool.api.admission_config import CompiledTenant
from kvpool.domain.admission.amount import Amount
from kvpool.domain.estimate import Estimate

Outcome = Literal["admitted", "borrowed", "queued", "rejected-deadline", "rejected-capacity"]
OUTCOMES: tuple[Outcome, ...] = (
    "admitted",
    "borrowed",
    "queued",
    "rejected-deadline",
    "rejected-capacity",
)

REASON_QUEUE_WAIT = "queue_wait_exceeded"  # expected wait beyond the tier's maxQueueWait
REASON_DEADLINE_PASSED = "queue_deadline_passed"  # queued, and the deadline passed
REASON_TOO_LARGE_FOR_POOL = "too_large_for_pool"  # can never fit, even in an idle pool
REASON_NO_PLAN = "no_capacity_plan"  # pool.plan_ok is False: admit nothing
REASON_UNKNOWN_TIER = "tier_not_in_pool"  # the pool's plan has no such tier
REASON_NO_READY_REPLICA = "no_ready_replica"  # no ready replica on the request's track
REASON_TIER_REMOVED = "tier_removed"  # reconfigure dropped the tier of a queued request
SHARED = "shared"  # name used in Admit.borrowed_from for the shared remainder


@dataclass(frozen=True)
class AdmissionRequest:
    """What admission needs to know about one request (built after classify/estimate)."""

    request_id: str  # unique while queued or admitted; also the reservation id
    tenant: str  # tenant id
    tier: str  # tier from classify (after any demotion)
    tokens: int  # KV tokens to reserve (Estimate.tokens)
    slots: int = 1  # sequences (Estimate.slots)
    weight: int = 1  # tenant fair-share weight within the tier
    max_concurrency: int | None = None  # tenant's max in-flight requests in this pool
    track: str | None = None  # "stable"/"canary" from decide_track; None = any replica
    borrow_tokens: int | None = None  # KV tokens when it starts above its floor (None: tokens)

    @property
    def amount(self) -> Amount:
        """What the request reserves inside its tier's floor."""
        return Amount(self.tokens, self.slots)

    @property
    def borrowing_tokens(self) -> int:
        """KV tokens it reserves when it starts above its tier's floor (never more than
        :attr:`tokens`): the overcommitted reservation of :mod:`.adaptation`."""
        if self.borrow_tokens is None:
            return self.tokens
        return max(0, min(self.tokens, self.borrow_tokens))


def build_admission_request(
    request_id: str,
    tenant: CompiledTenant,
    tier: str,
    estimate: Estimate,
    track: str | None = None,
) -> AdmissionRequest:
    """An :class:`AdmissionRequest` from the earlier steps' results."""
    return AdmissionRequest(
        request_id=request_id,
        tenant=tenant.tenant,
        tier=tier,
        tokens=estimate.tokens,
        slots=estimate.slots,
        weight=max(1, tenant.weight),
        max_concurrency=tenant.max_concurrency,
        track=track,
        borrow_tokens=estimate.borrow_tokens,
    )


@dataclass(frozen=True)
class Admit:
    """The request may start now on ``replica``; release ``reservation_id`` when it ends."""

    request_id: str
    tenant: str
    tier: str
    tokens: int  # reserved KV tokens
    slots: int  # reserved slots
    outcome: Literal["admitted", "borrowed"]  # borrowed = uses shared or lent capacity
    borrowed_from: tuple[str, ...] = ()  # "shared" and/or tier names lending to it
    replica: str | None = None  # endpoint name; None when the pool lists no endpoints
    replica_url: str | None = None  # endpoint base URL
    track: str | None = None  # track of the replica
    preempts: bool = False  # admitted by Preempt reclaim: the engine will preempt borrowers
    queued_seconds: float = 0.0  # time spent queued (0 when admitted on arrival)
    engine_priority: int = 0  # the vLLM ``priority`` to set on the upstream request

    @property
    def amount(self) -> Amount:
        """What the admission reserved."""
        return Amount(self.tokens, self.slots)

    @property
    def reservation_id(self) -> str:
        """The id to pass to :meth:`AdmissionController.release`."""
        return self.request_id


@dataclass(frozen=True)
class Queue:
    """The request waits; it will appear in a later :class:`Wakeups` (admitted or rejected)."""

    request_id: str
    tier: str
    deadline: float  # ``now`` + the tier's max_queue_wait_seconds
    ahead_tokens: int  # tokens queued ahead of it (its tier and higher tiers)
    estimated_wait_seconds: float | None  # None before any hold time was observed
    outcome: Literal["queued"] = "queued"


@dataclass(frozen=True)
class Reject:
    """The request will not run; the gateway answers the status of ``reason``."""

    request_id: str
    tier: str
    outcome: Literal["rejected-deadline", "rejected-capacity"]
    reason: str  # REASON_* constant (JSON error code, metric label)
    message: str  # client-facing explanation: no figures of the pool's state or capacity
    retry_after_seconds: float | None = None  # suggestion for the Retry-After header
    queued_seconds: float = 0.0  # time spent queued before the rejection
    detail: str = ""  # the figures behind it, for the operator's logs only (never a tenant)


Verdict = Admit | Queue | Reject


@dataclass(frozen=True)
class Wakeups:
    """What a change caused: queued requests that start now, and queued ones rejected."""

    admitted: tuple[Admit, ...] = ()  # in the order they were admitted
    rejected: tuple[Reject, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.admitted or self.rejected)


@dataclass(frozen=True)
class TierUsage:
    """In-use versus plan for one tier (metrics: in-use vs floor)."""

    tier: str
    rank: int
    in_use_tokens: int
    in_use_slots: int
    floor_tokens: int
    floor_slots: int
    borrowed_tokens: int  # in use above the floor
    borrowed_slots: int
    lent_tokens: int  # this tier's floor currently held by borrowers
    lent_slots: int
    queued_requests: int
    queued_tokens: int
    queued_slots: int = 0
    head_tokens: int = 0  # what the tier's next request to start reserves (0: none waits)


@dataclass(frozen=True)
class ReplicaUsage:
    """Reservations on one replica."""

    name: str
    track: str
    ready: bool
    reserved_tokens: int
    reserved_slots: int
    capacity_tokens: int
    capacity_slots: int


@dataclass(frozen=True)
class AdmissionSnapshot:
    """The controller's state for metrics and debugging."""

    pool: str
    total_tokens: int
    total_slots: int
    in_use_tokens: int
    in_use_slots: int
    shared_used_tokens: int
    shared_used_slots: int
    overcommit_tokens: int  # above the plan because of Preempt reclaim (0 normally)
    overcommit_slots: int
    tiers: tuple[TierUsage, ...]
    replicas: tuple[ReplicaUsage, ...]
    in_flight: int  # admitted, not yet released
    queued: int
    preempt_admissions: int  # cumulative count of Admit(preempts=True)
    mean_hold_seconds: float | None  # EWMA of reservation durations (None: none observed)
    estimate_error_tokens: int = 0  # cumulative reserved - actual over settled releases
    settled: int = 0  # releases that reported actual tokens
