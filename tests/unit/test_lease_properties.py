"""Capacity leases as a protocol: random plans, demands, renewal orders and membership
changes (joins, SIGKILLs, stops past the TTL, Redis restarts), checked after every step.

The replicas and Redis are modelled here (Redis by :func:`decide_grant`, the reference
model of the Lua script; tests/integration/test_lease_store.py checks the script against
it on a real Redis); the allocation and the grant are the product's own functions.

Invariants (docs/0008-gateway-scale-out.md):

- **Never more than the plan.** For every constraint group, what all replicas may admit
  (their valid lease, or what they hold where that is more) sums to at most the plan's
  figure - except by what a replica that was stopped past its member TTL still holds
  (its claims were forgotten while it could not renew; the model lets it keep exactly
  that, and nobody is granted more until it is released).
- **A stopped replica does not admit on its old lease** when it resumes.
- **Floors where their tier arrives**: with no borrower anywhere, a tier present on some
  replicas has all its floor on them, at least its peak on each where the floor allows.
- **Nothing idle while someone waits**: the allocation hands out the shared remainder as
  slack only when no replica needs it.
- **Leases follow demand**: once demand stops changing and every replica holds no more
  than its new lease, three renewal rounds bring every lease to the allocation (one for
  the reports to arrive, one to shrink, one to grow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.lease import (
    Lease,
    LeaseClock,
    LeasePlan,
    Report,
    TierDemand,
    allocation,
    decide_grant,
    plan_leases,
)
from kvpool.domain.lease.model import DIMENSIONS, sum_components

CLOCK = LeaseClock(period=0.1, lease_ttl=2.5, member_ttl=3.0, redis_timeout=0.1)
TIERS = ("t0", "t1", "t2", "t3")


@st.composite
def plans(draw: st.DrawFn) -> LeasePlan:
    count = draw(st.integers(1, 4))
    tiers = TIERS[:count]
    floors = {t: Amount(draw(st.integers(0, 2000)), draw(st.integers(0, 8))) for t in tiers}
    tenants = draw(st.dictionaries(st.sampled_from(["x", "y"]), st.integers(1, 6)))
    return LeasePlan(
        tiers=tiers,
        floors=floors,
        lend_percent={t: draw(st.sampled_from([0, 50, 100])) for t in tiers},
        preempt=frozenset(t for t in tiers if draw(st.booleans())),
        shared=Amount(draw(st.integers(0, 1000)), draw(st.integers(0, 4))),
        per_engine=Amount(4000, 16),
        tenants=tenants,
    )


# the planner's plan of the examples' manifests for one bench engine (bench/lease_cpu.py)
EXAMPLES = LeasePlan(
    tiers=("interactive", "batch", "eval"),
    floors={"interactive": Amount(893, 4), "batch": Amount(475, 2), "eval": Amount(475, 1)},
    lend_percent={"interactive": 100, "batch": 50, "eval": 100},
    preempt=frozenset({"interactive"}),
    shared=Amount(0, 1),
    per_engine=Amount(1843, 8),
)


def amounts() -> st.SearchStrategy[Amount]:
    return st.builds(Amount, st.integers(0, 1500), st.integers(0, 8))


@st.composite
def reports(draw: st.DrawFn, plan: LeasePlan) -> Report:
    tiers = {}
    for tier in plan.tiers:
        if draw(st.booleans()):
            now = draw(amounts())
            head = draw(st.sampled_from([0, 0, 1, 60, 300, 999]))  # the next request's tokens
            tiers[tier] = TierDemand(now=now, peak=now.max(draw(amounts())), head_tokens=head)
    tenants = {
        t: (n, n + draw(st.integers(0, 2)))
        for t in plan.tenants
        if draw(st.booleans())
        for n in [draw(st.integers(0, 5))]
    }
    return Report(tiers=tiers, tenants=tenants)


@st.composite
def reports_in_flight(draw: st.DrawFn, plan: LeasePlan) -> Report:
    """A report whose tiers also have requests in flight (part of ``now`` is held)."""
    report = draw(reports(plan))
    tiers = {
        tier: TierDemand(
            d.now,
            d.peak,
            d.head_tokens,
            Amount(draw(st.integers(0, d.now.tokens)), draw(st.integers(0, d.now.slots))),
        )
        for tier, d in report.tiers.items()
    }
    return Report(tiers=tiers, tenants=report.tenants)


# -- the allocation alone ----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_allocation_places_everything_and_never_more(data: st.DataObject) -> None:
    plan = data.draw(plans())
    members = data.draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=4, unique=True))
    table = {m: data.draw(reports(plan)) for m in members}
    leases = plan_leases(plan, table)
    assert set(leases) == set(members)
    for dim in DIMENSIONS:

        def part(a: Amount, d: str = dim) -> int:
            return a.tokens if d == "tokens" else a.slots

        for tier in plan.tiers:
            placed = sum(part(x.floors.get(tier, ZERO)) for x in leases.values())
            loans = sum(part(x.loans.get(tier, ZERO)) for x in leases.values())
            standby = sum(part(x.standby.get(tier, ZERO)) for x in leases.values())
            floor = part(plan.floors[tier])
            lendable = part(plan.lendable(tier, plan.floors[tier]))
            if tier in plan.preempt:
                assert placed == floor, (dim, tier)  # the lender keeps its floor
                assert loans + standby <= lendable, (dim, tier, loans, standby, lendable)
                # what a lender may still lend at home is within its floor's lendable part,
                # and only a replica whose floor lends to the others has such a limit
                for member, x in leases.items():
                    here = x.lendable_here.get(tier)
                    if here is not None:
                        mine = plan.lendable(tier, x.floors.get(tier, ZERO))
                        assert 0 <= part(here) <= part(mine), (dim, tier, member, x)
                        lent = sum((y.loans.get(tier, ZERO) for y in leases.values()), ZERO)
                        assert not lent.is_zero, (dim, tier, member, x)
            else:
                assert standby == 0, (dim, tier)  # only a Preempt tier stands by
                assert placed + loans == floor, (dim, tier)  # what it lends moved
            assert all(part(x.floors.get(tier, ZERO)) >= 0 for x in leases.values())
        assert sum(part(x.shared) for x in leases.values()) == part(plan.shared), dim
    for tenant, limit in plan.tenants.items():
        assert sum(x.tenants.get(tenant, 0) for x in leases.values()) <= limit


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_consolidation_moves_only_what_requests_in_flight_do_not_hold(
    data: st.DataObject,
) -> None:
    plan = data.draw(plans())
    members = data.draw(st.lists(st.sampled_from("abcd"), min_size=2, max_size=4, unique=True))
    table = {m: data.draw(reports_in_flight(plan)) for m in members}
    leases = plan_leases(plan, table)
    with_no_moves = pytest.MonkeyPatch.context()
    with with_no_moves as patch:
        patch.setattr(allocation, "_consolidate", lambda *_: None)
        unmoved = plan_leases(plan, table)
    # every constraint group sums to the same: the shared part, loans and Wait floors
    # moved; only loans of a Preempt tier's idle lendable floor may be booked on top (the
    # lender keeps it; test_the_allocation_places_everything_and_never_more bounds them)
    after = sum_components(x.components() for x in leases.values())
    before = sum_components(x.components() for x in unmoved.values())
    booked = {f"loan.{dim}.{t}" for dim in DIMENSIONS for t in plan.preempt}
    assert {k: v for k, v in after.items() if k not in booked} == {
        k: v for k, v in before.items() if k not in booked
    }
    assert all(after.get(k, 0) >= before.get(k, 0) for k in booked)
    for m in members:
        for dim in DIMENSIONS:

            def part(a: Amount, d: str = dim) -> int:
                return a.tokens if d == "tokens" else a.slots

            for t in plan.tiers:
                floor, was = part(leases[m].floors[t]), part(unmoved[m].floors[t])
                if t in plan.preempt:  # a Preempt floor stays where its requests arrive
                    assert floor == was, (m, dim, t)
                else:  # a Wait floor gives up only what its requests in flight do not hold
                    assert floor >= min(was, part(table[m].demand(t).held)), (m, dim, t)

            def pooled(lease: Lease) -> int:
                return part(lease.shared) + sum(part(v) for v in lease.loans.values())

            above = sum(
                max(0, part(table[m].demand(t).held) - part(unmoved[m].floors.get(t, ZERO)))
                for t in plan.tiers
            )
            # what runs above its floors keeps its place in the shared part and loans
            assert pooled(leases[m]) >= min(pooled(unmoved[m]), above), (m, dim)


@st.composite
def flooded(draw: st.DrawFn, plan: LeasePlan) -> Report:
    """A replica under a flood: the ``Wait`` tiers run a request or two and queue more of
    their head's size, a ``Preempt`` tier (a chat) runs one now and then (the tables where
    floors, loans and the shared part split in pieces, as in bench/lease_fragments.py)."""
    tiers = {}
    for tier in plan.tiers:
        head = draw(st.integers(1, 600))
        chat = tier in plan.preempt
        running = draw(st.integers(0, 1 if chat else 2))
        held = Amount(sum(draw(st.integers(1, 600)) for _ in range(running)), running)
        queued = 0 if chat else draw(st.integers(0, 12))
        now = held + Amount(head * queued, queued)
        tiers[tier] = TierDemand(now=now, peak=now, head_tokens=head if queued else 0, held=held)
    return Report(tiers=tiers)


@settings(max_examples=1000, deadline=None)
@given(data=st.data())
def test_under_a_flood_loans_and_standbys_stay_within_the_lendable_floor(
    data: st.DataObject,
) -> None:
    plan = data.draw(st.one_of(st.just(EXAMPLES), plans()))
    members = data.draw(st.lists(st.sampled_from("abcd"), min_size=3, max_size=4, unique=True))
    leases = plan_leases(plan, {m: data.draw(flooded(plan)) for m in members})
    for dim in DIMENSIONS:

        def part(a: Amount, d: str = dim) -> int:
            return a.tokens if d == "tokens" else a.slots

        for tier in plan.tiers:
            lent = sum(
                part(x.loans.get(tier, ZERO)) + part(x.standby.get(tier, ZERO))
                for x in leases.values()
            )
            placed = sum(part(x.floors.get(tier, ZERO)) for x in leases.values())
            if tier in plan.preempt:  # booked twice: the lender keeps its floor
                assert placed == part(plan.floors[tier]), (dim, tier)
                assert lent <= part(plan.lendable(tier, plan.floors[tier])), (dim, tier)
            else:  # what a Wait tier lends has moved
                assert placed + lent == part(plan.floors[tier]), (dim, tier)
        assert sum(part(x.shared) for x in leases.values()) == part(plan.shared), dim


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_floors_are_where_their_tier_arrives(data: st.DataObject) -> None:
    plan = data.draw(plans())
    members = ["a", "b", "c"]
    present = data.draw(st.lists(st.sampled_from(members), min_size=1, unique=True))
    tier = data.draw(st.sampled_from(plan.tiers))
    # nobody borrows (every demand within a small part of its floor): nothing moves
    table = {
        m: Report({tier: TierDemand(now=ZERO, peak=Amount(1, 1))} if m in present else {})
        for m in members
    }
    leases = plan_leases(plan, table)
    floor = plan.floors[tier]
    at_present = sum((leases[m].floors[tier] for m in present), ZERO)
    assert at_present == floor
    for m in present:
        got = leases[m].floors[tier]
        if floor.tokens >= len(present):
            assert got.tokens >= 1, (m, got)
        if floor.slots >= len(present):
            assert got.slots >= 1, (m, got)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_no_slack_is_handed_out_while_someone_waits(data: st.DataObject) -> None:
    plan = data.draw(plans())
    members = ["a", "b", "c"]
    table = {m: data.draw(reports(plan)) for m in members}
    leases = plan_leases(plan, table)
    for dim in DIMENSIONS:

        def part(a: Amount, d: str = dim) -> int:
            return a.tokens if d == "tokens" else a.slots

        def demand(m: str) -> int:
            return sum(part(table[m].demand(t).now) for t in plan.tiers)

        waiting = [m for m in members if demand(m) > part(leases[m].total)]
        if not waiting:
            continue
        # someone cannot start all it has: then each replica's shared part only meets its
        # own demand above its floors (the rest of the remainder was not spread as slack)
        for m in members:
            over = sum(
                max(0, part(table[m].demand(t).now) - part(leases[m].floors.get(t, ZERO)))
                for t in plan.tiers
            )
            assert part(leases[m].shared) <= over, (dim, m, waiting)


# -- the protocol ------------------------------------------------------------------------


@dataclass
class Entry:
    claim: dict[str, int]
    report: Report
    renewed_at: float


@dataclass
class Replica:
    name: str
    demand: Report = field(default_factory=Report)
    lease: dict[str, int] = field(default_factory=dict)
    valid_until: float = float("-inf")
    used: dict[str, int] = field(default_factory=dict)
    table: dict[str, Report] = field(default_factory=dict)
    stopped_at: float | None = None
    last_renewal: float = float("-inf")
    lapsed: bool = False  # stopped past its member TTL: its claims were forgotten

    def may_admit(self, now: float) -> dict[str, int]:
        """What it may hold right now: its lease while valid, and what it holds anyway."""
        valid = self.stopped_at is None and now < self.valid_until
        names = set(self.used) | (set(self.lease) if valid else set())
        return {c: max(self.used.get(c, 0), self.lease.get(c, 0) if valid else 0) for c in names}


@dataclass
class World:
    plan: LeasePlan
    now: float = 0.0
    redis: dict[str, Entry] = field(default_factory=dict)
    epoch: float | None = -10.0  # Redis has run for a while (a restart sets None)
    replicas: dict[str, Replica] = field(default_factory=dict)

    def live_entries(self) -> dict[str, Entry]:
        return {m: e for m, e in self.redis.items() if e.renewed_at + CLOCK.member_ttl > self.now}

    def renew(self, r: Replica) -> None:
        """One renewal as the gateway does it: a call with the lease desired on the last
        table; if the fresh table it returns changes what is desired, a second call at once
        (so a replica acts on the others' newest reports in the same renewal)."""
        if r.stopped_at is None:
            desired = self.desired(r)
            self.call(r, desired)
            again = self.desired(r)
            if again != desired:
                self.call(r, again)

    def desired(self, r: Replica) -> dict[str, int]:
        table = {**{m: rep for m, rep in r.table.items() if m != r.name}, r.name: r.demand}
        return plan_leases(self.plan, table)[r.name].components()

    def call(self, r: Replica, desired: dict[str, int]) -> None:
        # shrink first (locally, before sending), then claim what is still held
        r.lease = {c: min(v, desired.get(c, 0)) for c, v in r.lease.items()}
        # an expired lease holds nothing but what runs (the gateway's held_components is
        # given an empty lease then): after a stop past the TTL, others got its capacity
        valid = self.now < r.valid_until
        held = {
            c: max(r.lease.get(c, 0) if valid else 0, r.used.get(c, 0))
            for c in set(r.lease) | set(r.used)
        }
        sent = self.now
        # the script: forget expired members, warm up after a restart, grant
        self.redis = self.live_entries()
        if self.epoch is None:
            self.epoch = self.now
        warming = self.now - self.epoch < CLOCK.member_ttl
        others = sum_components(e.claim for m, e in self.redis.items() if m != r.name)
        grant = decide_grant(self.plan.groups(), others, desired, held, warming=warming)
        self.redis[r.name] = Entry(grant.claim, r.demand, self.now)
        r.table = {m: e.report for m, e in self.redis.items()}
        r.lease = dict(grant.granted)
        r.valid_until = sent + CLOCK.lease_ttl
        r.last_renewal = sent

    def admit(self, r: Replica, component: str, amount: int) -> None:
        """Its controller starts requests up to its lease (nothing once it ran out)."""
        if r.stopped_at is not None or self.now >= r.valid_until:
            return
        room = r.lease.get(component, 0) - r.used.get(component, 0)
        if room > 0:
            r.used[component] = r.used.get(component, 0) + min(room, amount)

    def release(self, r: Replica, component: str, amount: int) -> None:
        left = r.used.get(component, 0) - amount
        if left > 0:
            r.used[component] = left
        else:
            r.used.pop(component, None)
        if r.lapsed and not any(r.used.values()):
            r.lapsed = False

    def check(self) -> None:
        for r in self.replicas.values():
            # a replica that has not renewed for a member TTL (stalled, or cut off from
            # Redis: here, not picked to renew) has its claims forgotten, by design, so
            # that a dead one's capacity comes back; what it still holds is excused until
            # it ends, as for a replica stopped that long (docs/0008 "Limits")
            if self.now - r.last_renewal >= CLOCK.member_ttl and any(r.used.values()):
                r.lapsed = True
        totals = sum_components(r.may_admit(self.now) for r in self.replicas.values())
        lapsed = sum_components(r.used for r in self.replicas.values() if r.lapsed)
        for group, (capacity, members) in self.plan.groups().items():
            total = sum(totals.get(c, 0) for c in members)
            excuse = sum(lapsed.get(c, 0) for c in members)
            assert total <= capacity + excuse, (group, total, capacity, excuse, self.now)


EVENTS = ["renew", "renew", "greedy", "admit", "admit", "release", "demand", "tick", "join",
          "kill", "stop", "resume", "redis_restart"]  # fmt: skip


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_leases_never_promise_more_than_the_plan(data: st.DataObject) -> None:
    plan = data.draw(plans())
    world = World(plan)
    for name in "ab":
        world.replicas[name] = Replica(name, data.draw(reports(plan)))
    components = sorted(c for _, members in plan.groups().values() for c in members)
    for _ in range(data.draw(st.integers(5, 40))):
        event = data.draw(st.sampled_from(EVENTS))
        names = sorted(world.replicas)
        world.now += data.draw(st.floats(0, 0.4))
        if event == "join" and len(names) < 4:
            new = next(n for n in "abcd" if n not in world.replicas)
            world.replicas[new] = Replica(new, data.draw(reports(plan)))
        elif event == "redis_restart":
            world.redis, world.epoch = {}, None
        elif names:
            r = world.replicas[data.draw(st.sampled_from(names))]
            if event == "renew":
                world.renew(r)
            elif event == "greedy" and r.stopped_at is None:
                # a replica on a stale table (or a bug) may desire anything: the grant alone
                # must keep the sum within the plan
                world.call(r, {c: cap for cap, members in plan.groups().values() for c in members})
            elif event == "admit":
                world.admit(
                    r, data.draw(st.sampled_from(components)), data.draw(st.integers(1, 500))
                )
            elif event == "release" and r.used:
                world.release(
                    r, data.draw(st.sampled_from(sorted(r.used))), data.draw(st.integers(1, 500))
                )
            elif event == "demand":
                r.demand = data.draw(reports(plan))
            elif event == "kill" and len(names) > 1:
                del world.replicas[r.name]  # its connections drop: the engines abort its work
            elif event == "stop" and r.stopped_at is None:
                r.stopped_at = world.now
            elif event == "resume" and r.stopped_at is not None:
                if world.now - r.last_renewal >= CLOCK.member_ttl:
                    r.lapsed = any(r.used.values())
                r.stopped_at = None
                # it must not admit on its old lease: it ran out while it was stopped
                if world.now - r.last_renewal >= CLOCK.lease_ttl:
                    before = dict(r.used)
                    for c in components:
                        world.admit(r, c, 10_000)
                    assert r.used == before, "admitted on an expired lease after a stop"
            elif event == "tick":
                for other in world.replicas.values():
                    world.renew(other)
        world.check()


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_leases_follow_demand_within_three_renewal_rounds(data: st.DataObject) -> None:
    plan = data.draw(plans())
    world = World(plan)
    names = ["a", "b", "c"][: data.draw(st.integers(1, 3))]
    for name in names:
        world.replicas[name] = Replica(name, data.draw(reports(plan)))
    for _ in range(3):  # a history: leases granted, capacity used
        for r in world.replicas.values():
            world.now += 0.05
            world.renew(r)
            for c in list(r.lease):
                world.admit(r, c, data.draw(st.integers(0, 500)))
    for r in world.replicas.values():  # demand changes everywhere
        r.demand = data.draw(reports(plan))
    # what the allocation wants on the new demand, every replica having reported it
    target = plan_leases(plan, {r.name: r.demand for r in world.replicas.values()})
    for r in world.replicas.values():  # in-flight work under the old leases ends
        r.used = {}
    # one round for every report to reach Redis, one for those above their new lease to
    # shrink, one for the others to grow into what was freed (nudges make it sooner:
    # tests/integration/test_gateway_scaleout.py)
    for _ in range(3):
        for r in world.replicas.values():
            world.now += 0.05
            world.renew(r)
            world.check()
    for r in world.replicas.values():
        assert r.lease == target[r.name].components(), r.name
