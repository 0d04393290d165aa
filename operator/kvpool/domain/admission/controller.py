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
way: every figure below is an :class:`~.amount.Amount` and every comparison must hold
in both. Per tier ``t``: in use ``U_t``, floor ``F_t``, lendable ``L_t``; shared ``S``;
total ``T`` (= S + sum F). The part of ``U_t`` inside the floor is ``own_t = min(U_t, F_t)``,
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
to zero while long generations run and reject everything). While a higher tier has
requests waiting, a tier can only count on what it releases itself, so its own queue over
its own drain rate is also a lower bound on its wait. If the expected wait exceeds
the tier's maximum, the request is rejected at once (``rejected-deadline``, 503 with
``Retry-After``) instead of queueing past its promise. Before any hold time has been
observed the estimate is unknown and the request is queued; :meth:`expire` rejects
queued requests whose deadline passed.

**Prefill holds.** A tier with a ``ttftP95Target`` promises a fast first token, and on
an engine a request's first token comes after one step that runs its prefill together
with whatever else the engine scheduled: a lower tier's long prompt sent in the same
moment makes that step (and the first token) several times slower. So from admitting
such a request until its first token (:meth:`first_token`), or for at most the target,
its replica takes no request of a lower tier (they start elsewhere or wait; capacity and
floors are unaffected, only the moment they start moves). Holds chained back to back
never keep lower tiers off a replica longer than the longest target at a time.

**Lifecycle.** The I/O layer keeps one controller per pool, turns :class:`Queue` into a
future, resolves futures from the :class:`Wakeups` every mutator returns, calls
:meth:`first_token` when a response shows its first token, :meth:`release` when the
response ends, the client disconnects or the engine fails
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
:meth:`release` and :meth:`expire` - resolve the corresponding futures from it. Rarely,
an offer that starts at once also lets *other* queued requests start (its tenant reached
its ``max_concurrency``, so another tenant's request moves to the front of a tier): those
are delivered by the next :class:`Wakeups` of any mutator, and :meth:`next_deadline`
returns the offer's time meanwhile, so an I/O layer that calls :meth:`expire` at
:meth:`next_deadline` delivers them on its next loop turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from kvpool.api.admission_config import CompiledPool, CompiledTier
from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.fair_queue import FairQueue
from kvpool.domain.admission.ledger import (
    _Position,
    _Replica,
    _Reservation,
    _TierState,
    _Waiting,
)
from kvpool.domain.admission.verdicts import (
    REASON_DEADLINE_PASSED,
    REASON_NO_PLAN,
    REASON_NO_READY_REPLICA,
    REASON_QUEUE_WAIT,
    REASON_TIER_REMOVED,
    REASON_TOO_LARGE_FOR_POOL,
    REASON_UNKNOWN_TIER,
    SHARED,
    AdmissionRequest,
    AdmissionSnapshot,
    Admit,
    Queue,
    Reject,
    ReplicaUsage,
    TierUsage,
    Verdict,
    Wakeups,
)
from kvpool.domain.routing import NoReplica, ReplicaView, decide_replica

EWMA_ALPHA = 0.2  # weight of the newest hold-time sample


class AdmissionController:
    """Admission state of one pool. Not thread-safe: call from one event loop.

    ``tiers`` are the compiled tiers of the pool's TierPolicy (any order; rank decides).
    """

    def __init__(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> None:
        self._tiers: dict[str, _TierState] = {}
        self._order: list[_TierState] = []
        self._replicas: dict[str, _Replica] = {}
        self._reservations: dict[str, _Reservation] = {}
        self._tenant_inflight: dict[str, int] = {}
        self._waiting = FairQueue(self._tenant_inflight)
        self._used = ZERO  # reserved by every request in flight
        self._mean_hold: float | None = None
        self._preempt_admissions = 0
        self._estimate_error = 0
        self._settled = 0
        self._pending: list[Admit] = []  # started by an offer, delivered by the next Wakeups
        self._pending_since: float | None = None
        self._borrowing_paused = False  # engines report their KV cache nearly full
        self._lent_limits: dict[int, int] = {}  # protected rank -> borrowers allowed below it
        self._borrowed_by_rank: dict[int, int] = {}  # rank -> in-flight borrowed requests
        self._longest_hold = 0.0  # the longest prefill hold of any tier (seconds)
        self._holds_checked_at = -math.inf  # the last expire(): hold gates up to it were seen
        self._apply_plan(pool, tiers)

    # ------------------------------------------------------------------ public API

    def offer(self, request: AdmissionRequest, now: float) -> Verdict:
        """Admit now, queue, or reject at once. Raises ValueError on a duplicate id."""
        rid = request.request_id
        if rid in self._reservations or rid in self._waiting:
            raise ValueError(f"duplicate request id {rid!r}")
        if request.tokens < 0 or request.slots < 1:
            raise ValueError(
                f"bad reservation size: {request.tokens} tokens, {request.slots} slots"
            )
        reject = self._reject_on_arrival(request)
        if reject is not None:
            return reject
        tier = self._tiers[request.tier]
        waiting = _Waiting(request, tier, now, now + tier.max_wait, self._waiting.next_seq())
        self._waiting.enqueue(waiting)
        started = self._dispatch(now, only=waiting)
        if started:
            if any(request.tenant in t.queues for t in self._order):
                # its tenant's in-flight count grew: if that reached the max_concurrency of
                # its queued requests, another tenant's request may have moved up
                more = self._dispatch(now)
                if more:
                    self._pending.extend(more)
                    if self._pending_since is None:
                        self._pending_since = now
            return started[0]
        ahead = self._ahead(tier, request)
        wait = self._expected_wait(tier, request, ahead)
        if wait is not None and wait > tier.max_wait:
            self._waiting.unqueue(waiting)
            return Reject(
                request_id=rid,
                tier=tier.name,
                outcome="rejected-deadline",
                reason=REASON_QUEUE_WAIT,
                message=(
                    f"tier {tier.name!r} cannot start this request within its maximum queue "
                    f"wait of {tier.max_wait:g}s (expected ~{wait:.1f}s): retry later"
                ),
                retry_after_seconds=_retry_after(wait),
            )
        return Queue(
            request_id=rid,
            tier=tier.name,
            deadline=waiting.deadline,
            ahead_tokens=ahead.tokens,
            estimated_wait_seconds=wait,
        )

    def release(self, reservation_id: str, now: float, actual_tokens: int | None = None) -> Wakeups:
        """End a reservation (completion, disconnect, engine failure); idempotent.

        ``actual_tokens`` (prompt + generated, if known) only feeds the estimate-error
        statistic; the whole reservation is released either way. Unknown or already
        released ids are ignored (returns an empty :class:`Wakeups` unless the dispatcher
        finds something to start).
        """
        res = self._reservations.pop(reservation_id, None)
        if res is None:
            return self._wakeups([], [])
        if res.borrowed:
            left = self._borrowed_by_rank.get(res.rank, 0) - 1
            if left > 0:
                self._borrowed_by_rank[res.rank] = left
            else:
                self._borrowed_by_rank.pop(res.rank, None)
        req, tier, held = res.request, res.tier, res.amount
        tier.used -= held
        self._used -= held
        left = tier.tenant_tokens.get(req.tenant, 0) - held.tokens
        if left > 0:
            tier.tenant_tokens[req.tenant] = left
        else:
            tier.tenant_tokens.pop(req.tenant, None)
        inflight = self._tenant_inflight.get(req.tenant, 0) - 1
        if inflight > 0:
            self._tenant_inflight[req.tenant] = inflight
        else:
            self._tenant_inflight.pop(req.tenant, None)
        FairQueue.touch(tier, req.tenant, self._order)
        if res.replica is not None:
            _drop_hold(res.replica, reservation_id)
            res.replica.add(res.rank, held.tokens, held.slots, -1)
            if not res.replica.listed and res.replica.empty:
                self._replicas.pop(res.replica.name, None)
        if tier.removed and tier.used.is_zero and tier.queued_count == 0:
            self._drop_tier(tier)
        hold = max(0.0, float(now - res.admitted_at))
        self._mean_hold = (
            hold
            if self._mean_hold is None
            else (1 - EWMA_ALPHA) * self._mean_hold + EWMA_ALPHA * hold
        )
        if actual_tokens is not None:
            self._estimate_error += held.tokens - actual_tokens
            self._settled += 1
        return self._wakeups(self._dispatch(now), [])

    def cancel(self, request_id: str, now: float) -> Wakeups:
        """Withdraw a *queued* request (client gone). An admitted id is released instead."""
        if request_id in self._reservations:
            return self.release(request_id, now)
        waiting = self._waiting.get(request_id)
        if waiting is None:
            return self._wakeups([], [])
        self._waiting.unqueue(waiting)
        return self._wakeups(self._dispatch(now), [])

    def expire(self, now: float) -> Wakeups:
        """Reject queued requests whose deadline is <= now (``rejected-deadline``); end
        prefill holds that ran out."""
        held = self._end_holds(now)
        rejected: list[Reject] = []
        for waiting in list(self._waiting.expired(now)):
            self._waiting.unqueue(waiting)
            rejected.append(
                Reject(
                    request_id=waiting.request.request_id,
                    tier=waiting.tier.name,
                    outcome="rejected-deadline",
                    reason=REASON_DEADLINE_PASSED,
                    message=(
                        f"not started within tier {waiting.tier.name!r}'s maximum queue wait "
                        f"of {waiting.tier.max_wait:g}s: retry later"
                    ),
                    retry_after_seconds=_retry_after(self._mean_hold or waiting.tier.max_wait),
                    queued_seconds=max(0.0, float(now - waiting.arrived_at)),
                )
            )
        if not rejected and not held:
            return self._wakeups([], [])
        return self._wakeups(self._dispatch(now), rejected)

    def first_token(self, request_id: str, now: float) -> Wakeups:
        """An admitted request's first token arrived: its prefill hold ends (see the module
        docstring). Unknown ids and requests without a hold are ignored."""
        res = self._reservations.get(request_id)
        if res is None or res.replica is None or request_id not in res.replica.holds:
            return self._wakeups([], [])
        _drop_hold(res.replica, request_id)
        return self._wakeups(self._dispatch(now), [])

    def _end_holds(self, now: float) -> bool:
        """Drop prefill holds whose time ran out; True if any did, or if a chain of holds
        has now kept lower tiers off a replica for ``_longest_hold``."""
        changed = False
        for replica in self._replicas.values():
            for rid in [rid for rid, (_, until) in replica.holds.items() if until <= now]:
                _drop_hold(replica, rid)
                changed = True
            gate = replica.hold_gate(self._longest_hold) if replica.holds else None
            if gate is not None:
                changed |= self._holds_checked_at < gate <= now
        self._holds_checked_at = now
        return changed

    def _hold_deadline(self) -> float | None:
        """When the first prefill hold runs out, or a chain of holds has kept lower tiers
        off a replica long enough (each such moment is returned until :meth:`expire` saw it:
        if nothing lower could start then, it is not a deadline any more)."""
        times: list[float] = []
        for replica in self._replicas.values():
            if replica.holds:
                times.extend(until for _, until in replica.holds.values())
                gate = replica.hold_gate(self._longest_hold)
                if gate is not None and gate > self._holds_checked_at:
                    times.append(gate)
        return min(times, default=None)

    def next_deadline(self) -> float | None:
        """When to call :meth:`expire`: the earliest deadline of a queued request, or a past
        time (the offer's ``now``) when an offer started other requests too (rare, see the
        module docstring) so that the next :class:`Wakeups` delivers them."""
        earliest = self._waiting.earliest_deadline()
        if self._waiting:
            hold = self._hold_deadline()
            if hold is not None:
                earliest = hold if earliest is None else min(earliest, hold)
        if self._pending_since is not None:
            return self._pending_since if earliest is None else min(earliest, self._pending_since)
        return earliest

    def reconfigure(self, pool: CompiledPool, tiers: Sequence[CompiledTier], now: float) -> Wakeups:
        """Adopt a new plan. In-flight reservations are kept (never revoked); if capacity
        shrank, nothing is admitted until usage is back under the plan. Queued requests of
        a removed tier, or that can no longer ever fit, are rejected."""
        removed = self._apply_plan(pool, tiers)
        rejected: list[Reject] = []
        for waiting in self._waiting.values():
            tier = waiting.tier
            if tier in removed:
                reason = REASON_TIER_REMOVED
                message = f"tier {tier.name!r} was removed from the pool's policy"
            elif self._pool.plan_ok and self._never_fits(waiting.request, tier):
                reason = REASON_TOO_LARGE_FOR_POOL
                message = self._too_large_message(waiting.request, tier)
            else:
                continue
            self._waiting.unqueue(waiting)
            rejected.append(
                Reject(
                    request_id=waiting.request.request_id,
                    tier=tier.name,
                    outcome="rejected-capacity",
                    reason=reason,
                    message=message,
                    queued_seconds=max(0.0, float(now - waiting.arrived_at)),
                )
            )
        for tier in removed:
            if tier.used.is_zero and tier.queued_count == 0:
                self._drop_tier(tier)
        return self._wakeups(self._dispatch(now), rejected)

    def set_borrowing_paused(self, paused: bool, now: float) -> Wakeups:
        """Stop (or resume) starting requests on borrowed capacity; floors are unaffected.

        The I/O layer pauses borrowing while the engines' *measured* KV usage is near the
        target: the ledger counts reservations, the engines count what is really held.
        """
        if paused == self._borrowing_paused:
            return self._wakeups([], [])
        self._borrowing_paused = paused
        return self._wakeups([] if paused else self._dispatch(now), [])

    def set_lent_limit(self, tier: str, limit: int | None, now: float) -> Wakeups:
        """At most ``limit`` requests of tiers below ``tier`` may run on borrowed capacity
        (None: no limit). Set by the TTFT limiter of a tier with a ``ttftP95Target``."""
        state = self._tiers.get(tier)
        if state is None:
            return self._wakeups([], [])
        before = self._lent_limits.get(state.rank)
        if limit is None:
            self._lent_limits.pop(state.rank, None)
        else:
            self._lent_limits[state.rank] = max(0, limit)
        grew = before is not None and (limit is None or limit > before)
        return self._wakeups(self._dispatch(now) if grew else [], [])

    def borrowed_below(self, tier: str) -> int:
        """In-flight requests of tiers below ``tier`` running on borrowed capacity."""
        state = self._tiers.get(tier)
        if state is None:
            return 0
        return sum(n for rank, n in self._borrowed_by_rank.items() if rank > state.rank)

    def _lending_blocked(self, tier: _TierState) -> bool:
        """Whether a borrower of ``tier`` is held by a pause or a lent limit above it."""
        if self._borrowing_paused:
            return True
        for rank, limit in self._lent_limits.items():
            if rank < tier.rank:
                below = sum(n for r, n in self._borrowed_by_rank.items() if r > rank)
                if below >= limit:
                    return True
        return False

    def set_replica_ready(self, name: str, ready: bool, now: float) -> Wakeups:
        """Mark a replica (un)routable between config reloads (e.g. after engine errors)."""
        replica = self._replicas.get(name)
        if replica is None or replica.up == ready:
            return self._wakeups([], [])
        replica.up = ready
        return self._wakeups(self._dispatch(now) if ready else [], [])

    def snapshot(self) -> AdmissionSnapshot:
        """In-use vs plan per tier and replica, queue sizes and counters."""
        lent = self._lent()
        overcommit = self._position(None, ZERO, None).deficit.clamp0()
        shared_used = self._shared_used()
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
            )
            for t in self._order
        )
        replicas = tuple(
            ReplicaUsage(
                name=r.name,
                track=r.track,
                ready=r.ready,
                reserved_tokens=r.reserved_tokens,
                reserved_slots=r.reserved_slots,
                capacity_tokens=self._pool.tokens_per_replica,
                capacity_slots=self._pool.slots_per_replica,
            )
            for r in self._replicas.values()
        )
        return AdmissionSnapshot(
            pool=self._pool.name,
            total_tokens=self._pool.total_tokens,
            total_slots=self._pool.total_slots,
            in_use_tokens=self._used.tokens,
            in_use_slots=self._used.slots,
            shared_used_tokens=shared_used.tokens,
            shared_used_slots=shared_used.slots,
            overcommit_tokens=overcommit.tokens,
            overcommit_slots=overcommit.slots,
            tiers=tiers,
            replicas=replicas,
            in_flight=len(self._reservations),
            queued=len(self._waiting),
            preempt_admissions=self._preempt_admissions,
            mean_hold_seconds=self._mean_hold,
            estimate_error_tokens=self._estimate_error,
            settled=self._settled,
        )

    def verdict_of(self, request_id: str) -> Literal["queued", "admitted"] | None:
        """Whether an id is queued, admitted (in flight) or unknown."""
        if request_id in self._reservations:
            return "admitted"
        if request_id in self._waiting:
            return "queued"
        return None

    # ------------------------------------------------------------------ plan

    def _apply_plan(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> list[_TierState]:
        """Install a plan; returns the tier states that left the policy."""
        self._pool = pool
        self._total = Amount(pool.total_tokens, pool.total_slots)
        self._shared = Amount(pool.shared_tokens, pool.shared_slots).clamp0()  # no tier's
        self._per_replica = Amount(pool.tokens_per_replica, pool.slots_per_replica)
        names = {t.name for t in tiers}
        for tier in tiers:
            self._tiers.setdefault(tier.name, _TierState(tier.name)).configure(tier, pool)
        removed = [t for name, t in self._tiers.items() if name not in names and not t.removed]
        for state in removed:
            state.retire()
        # retired tiers rank below every live tier (their reservations are preemptible)
        base = max((t.rank for t in tiers), default=0) + 1
        retired = sorted((t for t in self._tiers.values() if t.removed), key=lambda s: s.rank)
        for offset, state in enumerate(retired):
            state.rank = base + offset
        self._order = sorted(self._tiers.values(), key=lambda s: s.rank)
        self._longest_hold = max((t.prefill_hold for t in self._order), default=0.0)
        for state in self._order:
            state.head_valid = False
        listed: set[str] = set()
        for track in pool.tracks:
            for endpoint in track.endpoints:
                listed.add(endpoint.name)
                replica = self._replicas.get(endpoint.name)
                if replica is None:
                    self._replicas[endpoint.name] = _Replica(
                        endpoint.name, endpoint.url, track.name, endpoint.ready
                    )
                else:
                    replica.url, replica.track = endpoint.url, track.name
                    replica.up, replica.listed = endpoint.ready, True
        for name, replica in list(self._replicas.items()):
            if name not in listed:
                replica.listed = False
                if replica.empty:
                    del self._replicas[name]
        return removed

    def _drop_tier(self, tier: _TierState) -> None:
        if self._tiers.get(tier.name) is tier:
            del self._tiers[tier.name]
            self._order = [t for t in self._order if t is not tier]

    # ------------------------------------------------------------------ arrival checks

    def _reject_on_arrival(self, request: AdmissionRequest) -> Reject | None:
        tier = self._tiers.get(request.tier)

        def reject(
            outcome: Literal["rejected-deadline", "rejected-capacity"],
            reason: str,
            message: str,
        ) -> Reject:
            return Reject(request.request_id, request.tier, outcome, reason, message)

        if not self._pool.plan_ok:
            return reject(
                "rejected-capacity",
                REASON_NO_PLAN,
                f"pool {self._pool.name!r} has no capacity plan yet: retry later",
            )
        if tier is None or tier.removed:
            return reject(
                "rejected-capacity",
                REASON_UNKNOWN_TIER,
                f"pool {self._pool.name!r} has no tier {request.tier!r}",
            )
        if self._never_fits(request, tier):
            return reject(
                "rejected-capacity",
                REASON_TOO_LARGE_FOR_POOL,
                self._too_large_message(request, tier),
            )
        if self._replicas and not any(
            r.ready and (request.track is None or r.track == request.track)
            for r in self._replicas.values()
        ):
            return reject(
                "rejected-capacity",
                REASON_NO_READY_REPLICA,
                f"no ready replica of pool {self._pool.name!r}"
                + (f" on track {request.track!r}" if request.track else ""),
            )
        return None

    def _ceiling(self, tier: _TierState) -> Amount:
        """The most one request of ``tier`` could ever hold in an otherwise idle pool."""
        others = sum((t.lend for t in self._order if t is not tier), ZERO)
        cap = self._total.min(tier.floor + self._shared + others)
        if self._replicas:
            cap = cap.min(self._per_replica)
        return cap

    def _never_fits(self, request: AdmissionRequest, tier: _TierState) -> bool:
        smallest = Amount(request.borrowing_tokens, request.slots)
        return not smallest.fits_in(self._ceiling(tier))

    def _too_large_message(self, request: AdmissionRequest, tier: _TierState) -> str:
        cap = self._ceiling(tier)
        return (
            f"the request needs {request.borrowing_tokens} KV tokens and {request.slots} "
            f"slot(s); tier {tier.name!r} of pool {self._pool.name!r} can hold at most "
            f"{cap.tokens} tokens and {cap.slots} slots for one request"
        )

    def _ahead(self, tier: _TierState, request: AdmissionRequest) -> Amount:
        """What is queued ahead of a new request (its tier and higher tiers)."""
        ahead = ZERO
        for t in self._order:
            if t.rank > tier.rank:
                break
            ahead += t.queued
        return ahead - request.amount

    def _expected_wait(
        self, tier: _TierState, request: AdmissionRequest, ahead: Amount
    ) -> float | None:
        """Seconds until enough is released for the queue ahead and this request (None: unknown).

        Pool-wide: ``need / (in use / mean hold)``. While a higher tier has requests waiting,
        whatever the pool releases beyond floors goes to it first, so the tier can only count
        on what it releases itself: ``its queue / (its in use / mean hold)``; the larger of
        the two is the estimate.
        """
        hold = self._mean_hold
        if hold is None or hold <= 0:
            return None
        free = (self._total - self._used).clamp0()
        needs = [((ahead + request.amount - free).clamp0(), self._used)]
        if any(t.queued_count for t in self._order if t.rank < tier.rank):
            needs.append((tier.queued, tier.used))
        wait = 0.0
        for need_amount, used_amount in needs:
            for need, used in (
                (need_amount.tokens, used_amount.tokens),
                (need_amount.slots, used_amount.slots),
            ):
                if need > 0:
                    if used <= 0:
                        return None  # nothing in flight to drain: the deadline decides
                    wait = max(wait, need * hold / used)
        return wait

    # ------------------------------------------------------------------ feasibility

    def _position(
        self,
        tier: _TierState | None,
        size: Amount,
        wants: dict[str, Amount] | None,
    ) -> _Position:
        """The state with a request of ``size`` added to ``tier``: feasible iff the deficit
        is <= 0 in both dimensions.

        ``wants`` (tier -> what its next request needs) hold back part of a tier's idle
        floor from borrowers: a tier waiting for its own floor does not lend it out again.
        """
        deficit = self._used + size - self._total
        over = idle = lower = ZERO
        for t in self._order:
            used = t.used + size if t is tier else t.used
            own = used.min(t.floor)
            over += used - own
            if tier is not None and t.rank > tier.rank:
                lower += used - own
            if wants is not None and t is not tier and t.name in wants:
                # held for the tier's next request as if it were running already
                want = wants[t.name]
                over -= used - own
                used += want
                deficit += want
                own = used.min(t.floor)
                over += used - own
            idle += t.lend.min(t.floor - own)
        return _Position(deficit.max(over - self._shared - idle), lower)

    def _lent(self) -> dict[str, Amount]:
        """Who lends what to borrowers: lowest-priority lenders first (accounting only)."""
        over = ZERO
        idle: list[tuple[_TierState, Amount]] = []
        for t in self._order:
            own = t.used.min(t.floor)
            over += t.used - own
            idle.append((t, t.lend.min(t.floor - own)))
        need = (over - self._shared).clamp0()
        lent: dict[str, Amount] = {}
        for t, free in reversed(idle):
            if need.is_zero:
                break
            give = need.min(free).clamp0()
            if not give.is_zero:
                lent[t.name] = give
                need -= give
        return lent

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, now: float, only: _Waiting | None = None) -> list[Admit]:
        """Start every waiting request that can start, by priority, floors and fairness.

        Passes repeat until one starts nothing: a start can change another tier's pick
        (its tenant reaching ``max_concurrency`` lets another tenant's request move up).
        """
        admitted: list[Admit] = []
        while self._waiting:
            started = self._dispatch_pass(now, only)
            admitted.extend(started)
            if not started or only is not None:
                break
        return admitted

    def _dispatch_pass(self, now: float, only: _Waiting | None) -> list[Admit]:
        """One pass over the tiers in priority order.

        With ``only`` (a request just enqueued by :meth:`offer`), the queue was at a fixed
        point before it arrived, so only ``only`` can start: higher tiers' eligible heads
        are known to be blocked (they close borrowing) and the walk stops at its tier.
        """
        admitted: list[Admit] = []
        if not self._waiting:
            return admitted
        heads: dict[str, _Waiting | None] = {}
        wants: dict[str, Amount] | None = None  # built on the first borrowing check
        borrowing_closed = False
        for tier in self._order:
            if only is not None and tier.rank > only.tier.rank:
                break
            head = heads[tier.name] = self._waiting.head(tier) if tier.queues else None
            while head is not None:
                if only is not None and head is not only:
                    borrowing_closed = True  # a blocked head (fixed point) waits before it
                    break
                within = self._within_floor(tier, head.request)
                if not within and borrowing_closed:
                    break
                if not within and wants is None:
                    wants = self._wants(heads)
                admit = self._try_start(tier, head, within, wants, now)
                if admit is None:
                    borrowing_closed = True
                    break
                admitted.append(admit)
                head = heads[tier.name] = self._waiting.head(tier) if tier.queues else None
                if wants is not None:
                    wants.pop(tier.name, None)
                    if head is not None and self._within_floor(tier, head.request):
                        wants[tier.name] = head.request.amount
        return admitted

    def _wants(self, heads: dict[str, _Waiting | None]) -> dict[str, Amount]:
        """Per tier, what its next request needs within its own floor (held from borrowers)."""
        wants: dict[str, Amount] = {}
        for tier in self._order:
            if tier.name in heads:
                head = heads[tier.name]
            else:
                head = heads[tier.name] = self._waiting.head(tier) if tier.queues else None
            if head is not None and self._within_floor(tier, head.request):
                wants[tier.name] = head.request.amount
        return wants

    @staticmethod
    def _within_floor(tier: _TierState, request: AdmissionRequest) -> bool:
        """Whether the request starts on the tier's own floor: it fits in what is left of
        the floor, or the tier has a floor and nothing running (a floor always holds one
        request, whatever its size: the part above the floor is borrowed, but it goes
        before every borrower - the tier would otherwise starve behind busier tiers)."""
        return (tier.used + request.amount).fits_in(tier.floor) or (
            tier.floor.tokens > 0 and tier.floor.slots > 0 and tier.used.is_zero
        )

    @staticmethod
    def _inside_floor(tier: _TierState, request: AdmissionRequest) -> bool:
        """Whether the request fits entirely inside what is left of the tier's floor."""
        return (tier.used + request.amount).fits_in(tier.floor)

    def _try_start(
        self,
        tier: _TierState,
        waiting: _Waiting,
        within: bool,
        wants: dict[str, Amount] | None,
        now: float,
    ) -> Admit | None:
        req = waiting.request
        inside = self._inside_floor(tier, req)
        if not within and self._lending_blocked(tier):
            return None
        # inside its floor a request reserves its whole (learned) need; above it, what the
        # pool's overcommit ratio says (AdmissionRequest.borrow_tokens)
        size = req.amount if inside else Amount(req.borrowing_tokens, req.slots)
        pos = self._position(tier, size, None if within else wants)
        preempts = False
        if not pos.feasible:
            if not (
                within
                and inside
                and tier.reclaim == "Preempt"
                and pos.deficit.fits_in(pos.lower_over)
            ):
                return None
            preempts = True
        replica: _Replica | None = None
        if self._replicas:
            open_replicas = [
                r
                for r in self._replicas.values()
                if not r.held_for(tier.rank, now, self._longest_hold)
            ]
            views: Sequence[ReplicaView] = (
                [r.load(tier.rank) for r in open_replicas] if preempts else open_replicas
            )
            choice = decide_replica(
                views,
                tokens=size.tokens,
                slots=size.slots,
                tokens_per_replica=self._pool.tokens_per_replica,
                slots_per_replica=self._pool.slots_per_replica,
                track=req.track,
                allow_preempt=preempts,
            )
            if isinstance(choice, NoReplica):
                return None
            replica = self._replicas[choice.name]
        borrowed_from: tuple[str, ...] = ()
        if not inside:
            borrowed_from = self._borrow_sources(tier, size)
        self._commit(tier, waiting, size, replica, now, borrowed=not within)
        if preempts:
            self._preempt_admissions += 1
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

    def _borrow_sources(self, tier: _TierState, size: Amount) -> tuple[str, ...]:
        """Who lends to this borrowing request: the shared remainder and/or tier floors."""
        lent_before, shared_before = self._lent(), self._shared_used()
        tier.used += size
        lent_after, shared_after = self._lent(), self._shared_used()
        tier.used -= size
        sources: list[str] = []
        if not shared_after.fits_in(shared_before):
            sources.append(SHARED)
        for t in self._order:
            if t is not tier and not lent_after.get(t.name, ZERO).fits_in(
                lent_before.get(t.name, ZERO)
            ):
                sources.append(t.name)
        return tuple(sources)

    def _shared_used(self) -> Amount:
        over = sum(((t.used - t.floor).clamp0() for t in self._order), ZERO)
        return over.min(self._shared)

    def _commit(
        self,
        tier: _TierState,
        waiting: _Waiting,
        size: Amount,
        replica: _Replica | None,
        now: float,
        *,
        borrowed: bool = False,
    ) -> None:
        req = waiting.request
        self._waiting.unqueue(waiting)
        tier.used += size
        self._used += size
        tier.tenant_tokens[req.tenant] = tier.tenant_tokens.get(req.tenant, 0) + size.tokens
        self._tenant_inflight[req.tenant] = self._tenant_inflight.get(req.tenant, 0) + 1
        FairQueue.touch(tier, req.tenant, self._order)
        if replica is not None:
            replica.add(tier.rank, size.tokens, size.slots, +1)
            if any(rank < tier.rank for rank, _ in replica.holds.values()):
                replica.held_since = now  # let through past a chain of holds: hold again
            if tier.prefill_hold > 0:
                if not replica.holds:
                    replica.held_since = now
                replica.holds[req.request_id] = (tier.rank, now + tier.prefill_hold)
        self._reservations[req.request_id] = _Reservation(
            req, tier, size, now, replica, tier.rank, borrowed
        )
        if borrowed:
            self._borrowed_by_rank[tier.rank] = self._borrowed_by_rank.get(tier.rank, 0) + 1

    def _wakeups(self, admitted: list[Admit], rejected: list[Reject]) -> Wakeups:
        if self._pending:
            admitted = self._pending + admitted
            self._pending, self._pending_since = [], None
        return Wakeups(admitted=tuple(admitted), rejected=tuple(rejected))


def _drop_hold(replica: _Replica, request_id: str) -> None:
    if replica.holds.pop(request_id, None) is not None and not replica.holds:
        replica.held_since = None


def _retry_after(seconds: float) -> float:
    """A Retry-After suggestion: whole seconds, at least 1."""
    return float(max(1, math.ceil(seconds)))
