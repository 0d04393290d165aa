"""Admission under random interleavings (hypothesis state machine).

Offers, releases, cancels, expiries, reconfigurations and replica flaps are interleaved at
random against random plans (1-4 tiers, random floors, lending, reclaim). After every
step the controller's accounting must match a model of what it told us, and:

- floors: a tier below its floor gets a request that fits in (floor - in use) admitted at
  once, unless part of some floor is lent out to borrowers (or the pool is over its plan
  after a shrink or a Preempt); if it must wait, nobody borrows while it waits and it
  starts once the borrowers are gone;
- lending is bounded: what a tier lends never exceeds its lendable share;
- totals: in use never exceeds the plan's totals (pool and replica) except the
  documented Preempt overcommit and a shrink by reconfiguration;
- every request gets exactly one outcome, and everything released balances to zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvpool.api.admission_config import CompiledPool, CompiledTier
from kvpool.domain.admission import (
    AdmissionController,
    AdmissionRequest,
    AdmissionSnapshot,
    Admit,
    Queue,
    Reject,
    Wakeups,
)
from tests.builders import CompiledPoolBuilder

NAMES = ["t0", "t1", "t2", "t3"]


@dataclass(frozen=True)
class Plan:
    pool: CompiledPool
    tiers: list[CompiledTier]


@st.composite
def plans(draw: st.DrawFn, names: list[str] | None = None, replicas: int = 0) -> Plan:
    """A random plan: floors summing to at most the totals, lendable <= floors."""
    names = names or NAMES[: draw(st.integers(1, 4))]
    total_t = draw(st.integers(200, 2000))
    total_s = draw(st.integers(4, 24))
    builder = CompiledPoolBuilder().capacity(total_t, total_s)
    left_t, left_s = total_t, total_s
    for name in names:
        floor_t = draw(st.integers(0, left_t // 2))
        floor_s = draw(st.integers(0, left_s // 2))
        left_t -= floor_t
        left_s -= floor_s
        builder.tier(
            name,
            floor_t,
            floor_s,
            lend_tokens=draw(st.integers(0, floor_t)),
            lend_slots=draw(st.integers(0, floor_s)),
            wait=draw(st.sampled_from([0.0, 1.0, 5.0])),
            reclaim=draw(st.sampled_from(["Wait", "Preempt"])),
            ttft=draw(st.sampled_from([None, None, 0.5, 2.0])),
        )
    if replicas:
        builder.replicas(replicas)
    return Plan(builder.obj(), builder.tiers())


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.count = 0
        self.inflight: dict[str, Admit] = {}
        self.queued: dict[str, AdmissionRequest] = {}
        self.finished: set[str] = set()
        self.relaxed = False  # a shrink happened: the pool may stay over its plan
        self.pause_level: int | None = None  # borrowed in flight when borrowing was paused
        self.limits: dict[str, tuple[int, int]] = {}  # tier -> (lent limit, borrowed then)

    @initialize(data=st.data(), replicas=st.sampled_from([0, 0, 1, 2]))
    def start(self, data: st.DataObject, replicas: int) -> None:
        self.replicas = replicas
        self.plan = data.draw(plans(replicas=replicas))
        self.ctl = AdmissionController(self.plan.pool, self.plan.tiers)

    # ---------------------------------------------------------------- bookkeeping

    def _new_request(
        self, tier: str, tokens: int, slots: int, tenant: str, **kw
    ) -> AdmissionRequest:
        self.count += 1
        return AdmissionRequest(f"q{self.count}", tenant, tier, tokens, slots, **kw)

    def _record(self, verdict: Admit | Queue | Reject, request: AdmissionRequest) -> None:
        if isinstance(verdict, Admit):
            self.inflight[request.request_id] = verdict
        elif isinstance(verdict, Queue):
            self.queued[request.request_id] = request
        else:
            self.finished.add(request.request_id)

    def _apply(self, wakeups: Wakeups) -> None:
        for admit in wakeups.admitted:
            assert admit.request_id in self.queued, "admitted something not queued"
            del self.queued[admit.request_id]
            self.inflight[admit.request_id] = admit
        for reject in wakeups.rejected:
            assert reject.request_id in self.queued, "rejected something not queued"
            del self.queued[reject.request_id]
            self.finished.add(reject.request_id)

    def _tier_plan(self, name: str):
        return self.plan.pool.tiers.get(name)

    # ---------------------------------------------------------------- rules

    @rule(data=st.data())
    def offer(self, data: st.DataObject) -> None:
        tier = data.draw(st.sampled_from([t.name for t in self.plan.tiers]))
        tokens = data.draw(st.integers(0, self.plan.pool.total_tokens // 2))
        request = self._new_request(
            tier,
            tokens,
            data.draw(st.integers(1, 3)),
            data.draw(st.sampled_from(["a", "b", "c"])),
            weight=data.draw(st.integers(1, 3)),
            max_concurrency=data.draw(st.sampled_from([None, 1, 3])),
            borrow_tokens=data.draw(st.one_of(st.none(), st.integers(0, tokens))),
        )
        self._record(self.ctl.offer(request, self.now), request)
        self._deliver_pending()

    def _deliver_pending(self) -> None:
        """What the I/O layer does: call expire at next_deadline (now, if an offer started
        other requests too)."""
        deadline = self.ctl.next_deadline()
        if deadline is not None and deadline <= self.now:
            self._apply(self.ctl.expire(self.now))

    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), actual=st.one_of(st.none(), st.integers(0, 500)))
    def release(self, data: st.DataObject, actual: int | None) -> None:
        rid = data.draw(st.sampled_from(sorted(self.inflight)))
        del self.inflight[rid]
        self.finished.add(rid)
        self._apply(self.ctl.release(rid, self.now, actual))
        assert self.ctl.release(rid, self.now) == Wakeups(), "second release changed something"

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def first_token(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.inflight)))
        self._apply(self.ctl.first_token(rid, self.now))
        assert self.ctl.first_token(rid, self.now) == Wakeups(), "second first token acted"

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.queued)))
        del self.queued[rid]
        self.finished.add(rid)
        self._apply(self.ctl.cancel(rid, self.now))

    @rule(dt=st.floats(0.0, 3.0))
    def advance_and_expire(self, dt: float) -> None:
        self.now += dt
        self._apply(self.ctl.expire(self.now))
        deadline = self.ctl.next_deadline()
        assert deadline is None or deadline > self.now

    @rule(data=st.data())
    def reconfigure(self, data: st.DataObject) -> None:
        names = [t.name for t in self.plan.tiers]
        if len(names) > 1 and data.draw(st.booleans()):
            names = names[:-1]
        new = data.draw(plans(names=names, replicas=self.replicas))
        if new.pool.total_tokens < self.plan.pool.total_tokens or new.pool.total_slots < (
            self.plan.pool.total_slots
        ):
            self.relaxed = True
        if len(names) < len(self.plan.tiers) or self.replicas:
            self.relaxed = True  # a removed tier's or replica's reservations are kept
        for tier in new.tiers:
            old = self._tier_plan(tier.name)
            fresh = new.pool.tiers[tier.name]
            if old and (
                fresh.floor_tokens < old.floor_tokens or fresh.floor_slots < old.floor_slots
            ):
                self.relaxed = True
        self.plan = new
        self._apply(self.ctl.reconfigure(new.pool, new.tiers, self.now))
        # ranks may move with the policy: limits are re-set by the limiter after a reload
        for name in list(self.limits):
            self._apply(self.ctl.set_lent_limit(name, None, self.now))
        self.limits.clear()
        if self.pause_level is not None:
            self.pause_level = self._borrowed()

    def _borrowed(self) -> int:
        return sum(self.ctl._borrowed_by_rank.values())

    @rule(paused=st.booleans())
    def pause_borrowing(self, paused: bool) -> None:
        self._apply(self.ctl.set_borrowing_paused(paused, self.now))
        self.pause_level = self._borrowed() if paused else None

    @rule(data=st.data())
    def limit_lending(self, data: st.DataObject) -> None:
        tier = data.draw(st.sampled_from([t.name for t in self.plan.tiers]))
        limit = data.draw(st.one_of(st.none(), st.integers(0, 3)))
        self._apply(self.ctl.set_lent_limit(tier, limit, self.now))
        if limit is None:
            self.limits.pop(tier, None)
        else:
            self.limits[tier] = (limit, self.ctl.borrowed_below(tier))

    @precondition(lambda self: self.replicas > 0)
    @rule(data=st.data())
    def flap_replica(self, data: st.DataObject) -> None:
        name = f"s{data.draw(st.integers(0, self.replicas - 1))}"
        self._apply(self.ctl.set_replica_ready(name, data.draw(st.booleans()), self.now))

    @precondition(lambda self: self.replicas <= 1)
    @rule(data=st.data())
    def floor_is_available(self, data: st.DataObject) -> None:
        """A request within its tier's free floor starts at once unless a floor is lent."""
        snap = self.ctl.snapshot()
        candidates = [
            t
            for t in snap.tiers
            if t.queued_requests == 0
            and t.in_use_tokens < t.floor_tokens
            and t.in_use_slots < t.floor_slots
            and t.tier in self.plan.pool.tiers
        ]
        if not candidates:
            return
        usage = data.draw(st.sampled_from(candidates))
        free_t = usage.floor_tokens - usage.in_use_tokens
        free_s = usage.floor_slots - usage.in_use_slots
        request = self._new_request(  # often the whole free floor: the lent part is hit
            usage.tier,
            data.draw(st.one_of(st.just(free_t), st.integers(0, free_t))),
            data.draw(st.one_of(st.just(free_s), st.integers(1, free_s))),
            f"probe{self.count}",
        )
        if self.replicas == 1:
            replica = snap.replicas[0]
            rank = next(t.rank for t in snap.tiers if t.tier == usage.tier)
            if any(r < rank for r, _ in self.ctl._replicas[replica.name].holds.values()):
                return  # a higher tier's prefill holds the replica: it starts a moment later
            if not replica.ready or (
                replica.reserved_tokens + request.tokens > replica.capacity_tokens
                or replica.reserved_slots + request.slots > replica.capacity_slots
            ):
                return  # the replica itself is down or over its plan: nothing to promise
        lent = sum(t.lent_tokens + t.lent_slots for t in snap.tiers)
        over = snap.overcommit_tokens + snap.overcommit_slots
        verdict = self.ctl.offer(request, self.now)
        self._record(verdict, request)
        self._deliver_pending()
        if isinstance(verdict, Admit):
            return
        assert lent > 0 or over > 0, f"floor request refused with nothing lent: {verdict}"
        if isinstance(verdict, Reject):
            assert verdict.outcome == "rejected-deadline"
            return
        self._borrowers_leave_then_probe_starts(request.request_id, usage.tier)

    def _borrowers_leave_then_probe_starts(self, rid: str, tier: str) -> None:
        while rid in self.queued:
            borrowers = sorted(
                (a.request_id for a in self.inflight.values() if a.outcome == "borrowed"),
            ) or sorted(self.inflight)
            assert borrowers, "probe waits with nothing in flight"
            victim = borrowers[0]
            del self.inflight[victim]
            self.finished.add(victim)
            woken = self.ctl.release(victim, self.now)
            if rid not in {a.request_id for a in woken.admitted}:
                for admit in woken.admitted:  # borrowing with the probe still left waiting
                    assert admit.outcome == "admitted", f"{admit} borrowed while {rid} waited"
            self._apply(woken)

    # ---------------------------------------------------------------- invariants

    @invariant()
    def accounting_matches_what_we_were_told(self) -> None:
        snap = self.ctl.snapshot()
        assert snap.in_flight == len(self.inflight)
        assert snap.queued == len(self.queued)
        assert snap.in_use_tokens == sum(a.tokens for a in self.inflight.values())
        assert snap.in_use_slots == sum(a.slots for a in self.inflight.values())
        for usage in snap.tiers:
            mine = [a for a in self.inflight.values() if a.tier == usage.tier]
            assert usage.in_use_tokens == sum(a.tokens for a in mine)
            assert usage.in_use_slots == sum(a.slots for a in mine)
        for replica in snap.replicas:
            mine = [a for a in self.inflight.values() if a.replica == replica.name]
            assert replica.reserved_tokens == sum(a.tokens for a in mine)
        assert not (set(self.inflight) & set(self.queued))
        assert not (set(self.inflight) & self.finished)

    @invariant()
    def queue_is_at_a_fixed_point(self) -> None:
        """Nothing queued could start now: every change already woke what it could."""
        if hasattr(self, "ctl"):
            assert self.ctl._dispatch(self.now) == []

    @invariant()
    def pauses_and_lent_limits_hold(self) -> None:
        """Paused: no new borrower starts. Limited: borrowers below a tier stay within the
        limit, apart from those already running when it was lowered."""
        if not hasattr(self, "ctl"):
            return
        now = self._borrowed()
        if self.pause_level is not None:
            assert now <= self.pause_level, "a borrower started while borrowing was paused"
            self.pause_level = now
        for tier, (limit, then) in list(self.limits.items()):
            below = self.ctl.borrowed_below(tier)
            assert below <= max(limit, then), f"{below} borrowers below {tier}, limit {limit}"
            self.limits[tier] = (limit, min(then, max(below, limit)))

    @invariant()
    def lending_is_bounded(self) -> None:
        snap = self.ctl.snapshot()
        for usage in snap.tiers:
            plan = self._tier_plan(usage.tier)
            lend_t = plan.lendable_tokens if plan else 0
            lend_s = plan.lendable_slots if plan else 0
            assert usage.lent_tokens <= lend_t
            assert usage.lent_slots <= lend_s

    @invariant()
    def totals_hold_except_documented_overcommit(self) -> None:
        snap: AdmissionSnapshot = self.ctl.snapshot()
        if self.relaxed or snap.preempt_admissions:
            return
        assert snap.overcommit_tokens == snap.overcommit_slots == 0
        assert snap.in_use_tokens <= snap.total_tokens
        assert snap.in_use_slots <= snap.total_slots
        for replica in snap.replicas:
            assert replica.reserved_tokens <= replica.capacity_tokens
            assert replica.reserved_slots <= replica.capacity_slots

    def teardown(self) -> None:
        if not hasattr(self, "ctl"):
            return
        for rid in sorted(self.queued):
            self.ctl.cancel(rid, self.now)
        while self.inflight:
            rid = sorted(self.inflight)[0]
            del self.inflight[rid]
            for admit in self.ctl.release(rid, self.now).admitted:
                self.inflight[admit.request_id] = admit
        snap = self.ctl.snapshot()
        assert (snap.in_use_tokens, snap.in_use_slots, snap.in_flight, snap.queued) == (0, 0, 0, 0)
        assert all(r.reserved_tokens == r.reserved_slots == 0 for r in snap.replicas)
        assert all(t.in_use_tokens == t.in_use_slots == t.queued_tokens == 0 for t in snap.tiers)


AdmissionMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAdmissionProperties = AdmissionMachine.TestCase
