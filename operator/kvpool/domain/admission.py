"""KV-aware admission of one pool: floors, borrowing by priority, weighted fairness, deadlines.

Why this module exists: an engine admits whatever arrives and, when its KV cache runs
out, preempts (recomputes) running sequences. A flood of long batch requests then costs
the interactive tier its latency. The gateway instead *reserves* KV tokens (prompt +
output reservation, see :mod:`kvpool.domain.estimate`) and one slot per sequence before a
request reaches an engine, against the plan the operator compiled (``CompiledPool``):
per tier a floor (``floor_tokens``/``floor_slots``) of which ``lendable_*`` may be lent
while idle, plus a ``shared_*`` remainder that no tier owns. The full algorithm, its
invariants and worked examples are in docs/0003-admission.md; in short:

**Accounting.** Tokens and slots are two independent dimensions, each checked the same
way. Per tier ``t``: in use ``U_t``, floor ``F_t``, lendable ``L_t``; shared ``S``; total
``T`` (= S + sum F). The part of ``U_t`` inside the floor is ``own_t = min(U_t, F_t)``,
the rest ``over_t`` is borrowed. Borrowed capacity comes first from the shared remainder,
then from other tiers' *idle lendable* floor ``idle_u = min(L_u, F_u - own_u)``. A state
is **feasible** iff ``sum U <= T`` and ``max(0, sum over - S) <= sum idle``. A request is
admitted iff the state with it added is feasible (and a replica can hold it). Hence:

- a tier can always use ``F_t - L_t`` of its floor, and all of it unless borrowers hold
  the lent part (then, with ``reclaim: Wait``, it gets it back as they finish; with
  ``reclaim: Preempt`` it is admitted at once in an *overcommit* bounded by what lower
  tiers borrowed, and the engine's priority scheduler preempts them - counted in
  ``AdmissionSnapshot.preempt_admissions``);
- borrowers never hold more than ``sum L`` of other tiers' floors plus ``S``;
- ``sum U <= T`` always, except the documented Preempt overcommit.

**Order.** A new request is queued behind anything already waiting in its tier, then
the dispatcher runs: tiers in priority (rank) order; within a tier the waiting tenant
with the lowest ``in-use tokens / weight`` goes next (FIFO within a tenant; a tenant at
its ``max_concurrency`` is skipped). If a tier's next request cannot start, lower tiers
may still start requests *within their own floor* (no starvation) but may not borrow
(priority). The dispatcher runs after every change (offer, release, cancel, expiry,
reconfigure, replica readiness), so a queued request starts as soon as it can.

**Deadlines.** On arrival, a request that must wait is given its tier's
``max_queue_wait_seconds``. The expected wait is (tokens/slots queued ahead of it in its
and higher tiers + its own need - what is free for it now) divided by the observed drain
rate; the drain rate is Little's law, ``in-use / mean hold time``, where the mean hold
time is an EWMA of observed reservation durations (a per-release rate EWMA would decay
to zero while long generations run and reject everything). If the expected wait exceeds
the tier's maximum, the request is rejected at once (``rejected-deadline``, 503 with
``Retry-After``) instead of queueing past its promise. Before any hold time has been
observed the estimate is unknown and the request is queued; :meth:`expire` rejects
queued requests whose deadline passed.

**Lifecycle.** The I/O layer keeps one controller per pool, turns :class:`Queue` into a
future, resolves futures from the :class:`Wakeups` every mutator returns, calls
:meth:`release` when the response ends, the client disconnects or the engine fails
(idempotent), and calls :meth:`expire` at :meth:`next_deadline`. Nothing here reads a
clock: ``now`` (seconds, monotonic) is passed in.

Worked example (tokens only; tiers hi, lo with F = 400 each, L = 400 each, S = 200):

    offer lo 300                  -> Admit(admitted)           U = {hi 0, lo 300}
    offer lo 500                  -> Admit(borrowed, from [shared, hi])
                                     U lo 800: own 400, over 400 = shared 200 + hi 200
    offer hi 300                  -> Queue (200 of hi's 400 floor are lent; reclaim Wait)
    offer hi 150                  -> Queue (behind the first hi request)
    release the lo 500            -> Wakeups([Admit(hi 300, admitted),
                                              Admit(hi 150, borrowed, from [shared])])

Complexity: a decision is O(tiers + tenants of the tier + replicas); no scan of queues.

Interface note for the I/O layer: every mutator returns :class:`Wakeups` (the requests
that can start now, and queued requests rejected by the change), including
:meth:`release` and :meth:`expire` - resolve the corresponding futures from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from kvpool.api.admission_config import CompiledPool, CompiledTenant, CompiledTier
from kvpool.domain.estimate import Estimate

Outcome = Literal["admitted", "borrowed", "queued", "rejected-deadline", "rejected-capacity"]
OUTCOMES: tuple[Outcome, ...] = (
    "admitted",
    "borrowed",
    "queued",
    "rejected-deadline",
    "rejected-capacity",
)

SERVICE_UNAVAILABLE = 503
PAYLOAD_TOO_LARGE = 413

REASON_QUEUE_WAIT = "queue_wait_exceeded"  # expected wait beyond the tier's maxQueueWait
REASON_DEADLINE_PASSED = "queue_deadline_passed"  # queued, and the deadline passed
REASON_TOO_LARGE_FOR_POOL = "too_large_for_pool"  # can never fit, even in an idle pool
REASON_NO_PLAN = "no_capacity_plan"  # pool.plan_ok is False: admit nothing
REASON_UNKNOWN_TIER = "tier_not_in_pool"  # the pool's plan has no such tier
REASON_NO_READY_REPLICA = "no_ready_replica"  # no ready replica on the request's track
REASON_TIER_REMOVED = "tier_removed"  # reconfigure dropped the tier of a queued request
SHARED = "shared"  # name used in Admit.borrowed_from for the shared remainder

EWMA_ALPHA = 0.2  # weight of the newest hold-time sample


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
    """The request will not run; answer ``http_status`` (with Retry-After if given)."""

    request_id: str
    tier: str
    outcome: Literal["rejected-deadline", "rejected-capacity"]
    reason: str  # REASON_* constant (JSON error code, metric label)
    message: str  # client-facing explanation
    http_status: int  # 503 (retryable) or 413 (can never fit)
    retry_after_seconds: float | None = None  # suggestion for the Retry-After header
    queued_seconds: float = 0.0  # time spent queued before the rejection


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


@dataclass
class _Reservation:
    request: AdmissionRequest
    admitted_at: float
    replica: str | None
    rank: int
    tier_known: bool = True


@dataclass
class _Waiting:
    request: AdmissionRequest
    arrived_at: float
    deadline: float
    seq: int
    alive: bool = True


@dataclass
class _Usage:
    tokens: int = 0
    slots: int = 0
    per_rank: dict[int, tuple[int, int]] = field(default_factory=dict)


class AdmissionController:
    """Admission state of one pool. Not thread-safe: call from one event loop.

    ``tiers`` are the compiled tiers of the pool's TierPolicy (any order; rank decides).
    """

    def __init__(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> None:
        raise NotImplementedError

    def offer(self, request: AdmissionRequest, now: float) -> Verdict:
        """Admit now, queue, or reject at once. Raises ValueError on a duplicate id."""
        raise NotImplementedError

    def release(self, reservation_id: str, now: float, actual_tokens: int | None = None) -> Wakeups:
        """End a reservation (completion, disconnect, engine failure); idempotent.

        ``actual_tokens`` (prompt + generated, if known) only feeds the estimate-error
        statistic; the whole reservation is released either way. Unknown or already
        released ids are ignored (returns an empty :class:`Wakeups` unless the dispatcher
        finds something to start).
        """
        raise NotImplementedError

    def cancel(self, request_id: str, now: float) -> Wakeups:
        """Withdraw a *queued* request (client gone). An admitted id is released instead."""
        raise NotImplementedError

    def expire(self, now: float) -> Wakeups:
        """Reject queued requests whose deadline is <= now (``rejected-deadline``)."""
        raise NotImplementedError

    def next_deadline(self) -> float | None:
        """The earliest deadline of a queued request (when to call :meth:`expire`)."""
        raise NotImplementedError

    def reconfigure(self, pool: CompiledPool, tiers: Sequence[CompiledTier], now: float) -> Wakeups:
        """Adopt a new plan. In-flight reservations are kept (never revoked); if capacity
        shrank, nothing is admitted until usage is back under the plan. Queued requests of
        a removed tier, or that can no longer ever fit, are rejected."""
        raise NotImplementedError

    def set_replica_ready(self, name: str, ready: bool, now: float) -> Wakeups:
        """Mark a replica (un)routable between config reloads (e.g. after engine errors)."""
        raise NotImplementedError

    def snapshot(self) -> AdmissionSnapshot:
        """In-use vs plan per tier and replica, queue sizes and counters."""
        raise NotImplementedError

    def verdict_of(self, request_id: str) -> Literal["queued", "admitted"] | None:
        """Whether an id is queued, admitted (in flight) or unknown."""
        raise NotImplementedError
