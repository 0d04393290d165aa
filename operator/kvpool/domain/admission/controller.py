"""KV-aware admission of one pool: floors, borrowing by priority, weighted fairness, deadlines.

Why this module exists: an engine admits whatever arrives and, when its KV cache runs
out, preempts (recomputes) running sequences. A flood of long batch requests then costs
the interactive tier its latency. The gateway instead *reserves* KV tokens (prompt +
output reservation, see :mod:`kvpool.domain.estimate`) and one slot per sequence before a
request reaches an engine, against the plan the operator compiled (``CompiledPool``):
per tier a floor of which a lendable part may be lent while idle, plus a shared
remainder that no tier owns. :class:`AdmissionController` is the one object the I/O layer
talks to; it puts the pieces together (the algorithm, its invariants and worked examples
are in docs/0003-admission.md):

- :mod:`.state` - what is reserved and what waits (:class:`~.state.PoolState`);
- :mod:`.arrival` - what a request is rejected for at once, before it queues;
- :mod:`.feasibility` - whether a state fits the plan, who lends what;
- :mod:`.dispatch` - which waiting requests start, by priority, floors and fairness;
- :mod:`.wait_estimate` - the expected wait, and the fast rejection past ``maxQueueWait``;
- :mod:`.holds` - prefill holds of tiers with a ``ttftP95Target``;
- :mod:`.lending` - the borrowing pause and the TTFT limiter's lent limits;
- :mod:`.snapshot` - in use versus plan, for metrics and the lease demand.

**Lifecycle.** The I/O layer keeps one controller per pool (and rollout track), turns
:class:`Queue` into a future, resolves futures from the :class:`Wakeups` every mutator
returns, calls :meth:`first_token` when a response shows its first token,
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

Interface note: rarely, an offer that starts at once also lets *other* queued requests
start (its tenant reached its ``max_concurrency``, so another tenant's request moves to
the front of a tier): those are delivered by the next :class:`Wakeups` of any mutator,
and :meth:`next_deadline` returns the offer's time meanwhile, so an I/O layer that calls
:meth:`expire` at :meth:`next_deadline` delivers them on its next loop turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from kvpool.api.admission_config import CompiledPool, CompiledTier
from kvpool.domain.admission.arrival import reject_on_arrival
from kvpool.domain.admission.dispatch import Dispatcher
from kvpool.domain.admission.feasibility import (
    never_fits,
    too_large_detail,
    too_large_message,
)
from kvpool.domain.admission.holds import PrefillHolds
from kvpool.domain.admission.ledger import ReplicaState, Waiting
from kvpool.domain.admission.lending import LendingGate
from kvpool.domain.admission.snapshot import take_snapshot
from kvpool.domain.admission.state import PoolState
from kvpool.domain.admission.verdicts import (
    REASON_DEADLINE_PASSED,
    REASON_QUEUE_WAIT,
    REASON_TIER_REMOVED,
    REASON_TOO_LARGE_FOR_POOL,
    AdmissionRequest,
    AdmissionSnapshot,
    Admit,
    Queue,
    Reject,
    Verdict,
    Wakeups,
)
from kvpool.domain.admission.wait_estimate import (
    HoldTime,
    expected_wait,
    queued_ahead,
    retry_after,
)


class AdmissionController:
    """Admission state of one pool. Not thread-safe: call from one event loop.

    ``tiers`` are the compiled tiers of the pool's TierPolicy (any order; rank decides).
    """

    def __init__(
        self,
        pool: CompiledPool,
        tiers: Sequence[CompiledTier],
        *,
        whole: CompiledPool | None = None,
    ) -> None:
        self._state = PoolState(pool, tiers)
        if whole is not None:
            self._state.apply_plan(pool, tiers, whole)
        self._open_until: float | None = None  # a lease's end: nothing starts from then on
        self._holds = PrefillHolds()
        self._holds.configure(self._state.order)
        self._lending = LendingGate()
        self._dispatcher = Dispatcher(self._state, self._holds, self._lending)
        self._hold_time = HoldTime()
        self._estimate_error = 0
        self._settled = 0
        self._pending: list[Admit] = []  # started by an offer, delivered by the next Wakeups
        self._pending_since: float | None = None

    @property
    def _replicas(self) -> dict[str, ReplicaState]:
        return self._state.replicas

    @property
    def _borrowed_by_rank(self) -> dict[int, int]:
        return self._lending.borrowed_by_rank

    def _dispatch(self, now: float, only: Waiting | None = None) -> list[Admit]:
        if self._open_until is not None and now >= self._open_until:
            return []  # the lease this controller admits against ran out
        return self._dispatcher.run(now, only)

    # ------------------------------------------------------------------ requests

    def offer(self, request: AdmissionRequest, now: float) -> Verdict:
        """Admit now, queue, or reject at once. Raises ValueError on a duplicate id."""
        state = self._state
        rid = request.request_id
        if rid in state.reservations or rid in state.waiting:
            raise ValueError(f"duplicate request id {rid!r}")
        if request.tokens < 0 or request.slots < 1:
            raise ValueError(
                f"bad reservation size: {request.tokens} tokens, {request.slots} slots"
            )
        reject = reject_on_arrival(state, request)
        if reject is not None:
            return reject
        tier = state.tiers[request.tier]
        waiting = Waiting(request, tier, now, now + tier.max_wait, state.waiting.next_seq())
        state.waiting.enqueue(waiting)
        started = self._dispatch(now, only=waiting)
        if started:
            if any(request.tenant in t.queues for t in state.order):
                # its tenant's in-flight count grew: if that reached the max_concurrency of
                # its queued requests, another tenant's request may have moved up
                more = self._dispatch(now)
                if more:
                    self._pending.extend(more)
                    if self._pending_since is None:
                        self._pending_since = now
            return started[0]
        ahead = queued_ahead(state.order, tier, request)
        free = (state.total - state.used).clamp0()
        wait = expected_wait(
            state.order, tier, request, ahead, free, state.used, self._hold_time.mean
        )
        if wait is not None and wait > tier.max_wait:
            state.waiting.unqueue(waiting)
            return Reject(
                request_id=rid,
                tier=tier.name,
                outcome="rejected-deadline",
                reason=REASON_QUEUE_WAIT,
                message=(
                    f"tier {tier.name!r} cannot start this request within its maximum queue "
                    f"wait of {tier.max_wait:g}s: retry later"
                ),
                retry_after_seconds=retry_after(wait),
                detail=(
                    f"expected wait ~{wait:.1f}s, {ahead.tokens} tokens queued ahead, "
                    f"{free.tokens} tokens free"
                ),
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
        res = self._state.uncommit(reservation_id)
        if res is None:
            return self._wakeups([], [])
        if res.borrowed:
            self._lending.ended(res.rank)
        if res.replica is not None:
            self._holds.drop(res.replica, reservation_id)
        self._hold_time.observe(now - res.admitted_at)
        if actual_tokens is not None:
            self._estimate_error += res.amount.tokens - actual_tokens
            self._settled += 1
        return self._wakeups(self._dispatch(now), [])

    def cancel(self, request_id: str, now: float) -> Wakeups:
        """Withdraw a *queued* request (client gone). An admitted id is released instead."""
        if request_id in self._state.reservations:
            return self.release(request_id, now)
        waiting = self._state.waiting.get(request_id)
        if waiting is None:
            return self._wakeups([], [])
        self._state.waiting.unqueue(waiting)
        return self._wakeups(self._dispatch(now), [])

    def expire(self, now: float) -> Wakeups:
        """Reject queued requests whose deadline is <= now (``rejected-deadline``); end
        prefill holds that ran out."""
        held = self._holds.end_expired(self._state.replicas.values(), now)
        rejected: list[Reject] = []
        queue = self._state.waiting
        for waiting in list(queue.expired(now)):
            queue.unqueue(waiting)
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
                    retry_after_seconds=retry_after(self._hold_time.mean or waiting.tier.max_wait),
                    queued_seconds=max(0.0, float(now - waiting.arrived_at)),
                )
            )
        if not rejected and not held:
            return self._wakeups([], [])
        return self._wakeups(self._dispatch(now), rejected)

    def first_token(self, request_id: str, now: float) -> Wakeups:
        """An admitted request's first token arrived: its prefill hold ends (:mod:`.holds`).
        Unknown ids and requests without a hold are ignored."""
        res = self._state.reservations.get(request_id)
        if res is None or res.replica is None or request_id not in res.replica.holds:
            return self._wakeups([], [])
        self._holds.drop(res.replica, request_id)
        return self._wakeups(self._dispatch(now), [])

    def next_deadline(self) -> float | None:
        """When to call :meth:`expire`: the earliest deadline of a queued request or prefill
        hold, or a past time (the offer's ``now``) when an offer started other requests too
        (rare, see the module docstring) so that the next :class:`Wakeups` delivers them."""
        queue = self._state.waiting
        earliest = queue.earliest_deadline()
        if queue:
            hold = self._holds.next_change(self._state.replicas.values())
            if hold is not None:
                earliest = hold if earliest is None else min(earliest, hold)
        if self._pending_since is not None:
            return self._pending_since if earliest is None else min(earliest, self._pending_since)
        return earliest

    def tenant_requests(self) -> dict[str, tuple[int, int]]:
        """Per tenant, (its requests in flight, those waiting): what a lease of its
        ``maxConcurrency`` follows."""
        counts = {t: (n, 0) for t, n in self._state.tenant_inflight.items()}
        for waiting in self._state.waiting.values():
            inflight, queued = counts.get(waiting.request.tenant, (0, 0))
            counts[waiting.request.tenant] = (inflight, queued + 1)
        return counts

    def verdict_of(self, request_id: str) -> Literal["queued", "admitted"] | None:
        """Whether an id is queued, admitted (in flight) or unknown."""
        if request_id in self._state.reservations:
            return "admitted"
        if request_id in self._state.waiting:
            return "queued"
        return None

    # ------------------------------------------------------------------ the plan and signals

    def reconfigure(
        self,
        pool: CompiledPool,
        tiers: Sequence[CompiledTier],
        now: float,
        *,
        whole: CompiledPool | None = None,
    ) -> Wakeups:
        """Adopt a new plan (``whole``: the plan ``pool`` is a lease of, if it is one; then
        "can never fit" is judged in the whole plan). In-flight reservations are kept
        (never revoked); if capacity shrank, nothing is admitted until usage is back under
        the plan. Queued requests of a removed tier, or that can no longer ever fit, are
        rejected. A lent limit whose
        protected tier left, moved or changed its ``ttftP95Target`` is lifted (the limiter
        that set it judged another promise)."""
        state = self._state
        targets = {t.rank: (t.name, t.prefill_hold) for t in state.order if not t.removed}
        removed = state.apply_plan(pool, tiers, whole)
        self._holds.configure(state.order)
        now_targets = {t.rank: (t.name, t.prefill_hold) for t in state.order if not t.removed}
        for rank in list(self._lending.limits):
            if now_targets.get(rank) != targets.get(rank) or not now_targets[rank][1]:
                self._lending.set_limit(rank, None)
        rejected: list[Reject] = []
        for waiting in state.waiting.values():
            tier = waiting.tier
            if tier in removed:
                reason = REASON_TIER_REMOVED
                message = f"tier {tier.name!r} was removed from the pool's policy"
                detail = ""
            elif state.pool.plan_ok and never_fits(state, waiting.request, tier):
                reason = REASON_TOO_LARGE_FOR_POOL
                message = too_large_message(state, waiting.request, tier)
                detail = too_large_detail(state, waiting.request, tier)
            else:
                continue
            state.waiting.unqueue(waiting)
            rejected.append(
                Reject(
                    request_id=waiting.request.request_id,
                    tier=tier.name,
                    outcome="rejected-capacity",
                    reason=reason,
                    message=message,
                    queued_seconds=max(0.0, float(now - waiting.arrived_at)),
                    detail=detail,
                )
            )
        for tier in removed:
            if tier.used.is_zero and tier.queued_count == 0:
                state.drop_tier(tier)
        return self._wakeups(self._dispatch(now), rejected)

    def set_admission_until(self, until: float | None, now: float) -> Wakeups:
        """Start nothing from ``until`` on (None: no end). The I/O layer passes the end of
        the lease it admits against, so a process that was stopped past its lease starts
        nothing on it when it resumes, whatever runs first; a renewal moves it on."""
        was_closed = self._open_until is not None and now >= self._open_until
        self._open_until = until
        reopened = was_closed and (until is None or now < until)
        return self._wakeups(self._dispatch(now) if reopened else [], [])

    def set_tenant_limits(self, limits: Mapping[str, int] | None, now: float) -> Wakeups:
        """This replica's part of each limited tenant's ``maxConcurrency`` (leased with the
        other gateway replicas; a limited tenant missing from ``limits`` starts nothing
        here); None: every request's own ``max_concurrency``."""
        queue = self._state.waiting
        if limits == queue.tenant_limits:
            return self._wakeups([], [])
        queue.tenant_limits = None if limits is None else dict(limits)
        for tier in self._state.order:
            tier.head_valid = False
        return self._wakeups(self._dispatch(now), [])

    def set_borrowing_paused(self, paused: bool, now: float) -> Wakeups:
        """Stop (or resume) starting requests on borrowed capacity; floors are unaffected.

        The I/O layer pauses borrowing while the engines' *measured* KV usage is near the
        target: the ledger counts reservations, the engines count what is really held.
        """
        if paused == self._lending.paused:
            return self._wakeups([], [])
        self._lending.paused = paused
        return self._wakeups([] if paused else self._dispatch(now), [])

    def set_lent_limit(self, tier: str, limit: int | None, now: float) -> Wakeups:
        """At most ``limit`` requests of tiers below ``tier`` may run on borrowed capacity
        (None: no limit). Set by the TTFT limiter of a tier with a ``ttftP95Target``."""
        state = self._state.tiers.get(tier)
        if state is None:
            return self._wakeups([], [])
        grew = self._lending.set_limit(state.rank, limit)
        return self._wakeups(self._dispatch(now) if grew else [], [])

    def borrowed_below(self, tier: str) -> int:
        """In-flight requests of tiers below ``tier`` running on borrowed capacity."""
        state = self._state.tiers.get(tier)
        return 0 if state is None else self._lending.borrowed_below(state.rank)

    def set_replica_ready(self, name: str, ready: bool, now: float) -> Wakeups:
        """Mark a replica (un)routable between config reloads (e.g. after engine errors)."""
        replica = self._state.replicas.get(name)
        if replica is None or replica.up == ready:
            return self._wakeups([], [])
        replica.up = ready
        return self._wakeups(self._dispatch(now) if ready else [], [])

    # ------------------------------------------------------------------ reporting

    def snapshot(self) -> AdmissionSnapshot:
        """In-use vs plan per tier and replica, queue sizes and counters (:mod:`.snapshot`)."""
        return take_snapshot(
            self._state,
            preempt_admissions=self._dispatcher.preempt_admissions,
            mean_hold_seconds=self._hold_time.mean,
            estimate_error_tokens=self._estimate_error,
            settled=self._settled,
        )

    # ------------------------------------------------------------------ internals

    def _wakeups(self, admitted: list[Admit], rejected: list[Reject]) -> Wakeups:
        if self._pending:
            admitted = self._pending + admitted
            self._pending, self._pending_since = [], None
        return Wakeups(admitted=tuple(admitted), rejected=tuple(rejected))
