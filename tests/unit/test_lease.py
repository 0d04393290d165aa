"""Capacity leases, decision by decision: the fair splits, the allocation, the grant, the
fallback modes, and a lease applied to a pool view (tables of cases; the protocol as a
whole is tests/unit/test_lease_properties.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.verdicts import TierUsage
from kvpool.domain.lease import (
    Lease,
    LeaseClock,
    LeaseMode,
    LeasePlan,
    Report,
    TierDemand,
    apply_lease,
    build_lease_plan,
    decide_grant,
    decide_lease_mode,
    equal_split,
    fill,
    fill_whole,
    plan_leases,
    shrunk,
    spread,
    tenant_shares_in_mode,
)
from kvpool.domain.lease.model import held_components, report_of
from tests.builders.compiled import CompiledPoolBuilder, compiled_tier

A = Amount


EXAMPLES_FLOORS = (A(921, 4), A(552, 2), A(192, 1))  # interactive, batch, eval
EXAMPLES_SHARED = A(178, 1)


def three_tiers(
    floors: tuple[Amount, Amount, Amount] = EXAMPLES_FLOORS, shared: Amount = EXAMPLES_SHARED
) -> LeasePlan:
    """The examples' policy on one engine of 1,843 usable tokens and 8 slots (the floors of
    interactive, batch and eval, and the shared remainder, as the planner gave them)."""
    return LeasePlan(
        tiers=("interactive", "batch", "eval"),
        floors=dict(zip(("interactive", "batch", "eval"), floors, strict=True)),
        lend_percent={"interactive": 100, "batch": 50, "eval": 100},
        preempt=frozenset({"interactive"}),
        shared=shared,
        per_engine=A(1843, 8),
    )


def batch_only_shared() -> LeasePlan:
    """One tier, no floor: everything is the shared remainder (600 KV tokens, 4 slots)."""
    return LeasePlan(
        tiers=("batch",),
        floors={"batch": ZERO},
        lend_percent={"batch": 0},
        preempt=frozenset(),
        shared=A(600, 4),
        per_engine=A(600, 4),
    )


def demand(now: Amount, peak: Amount | None = None) -> TierDemand:
    return TierDemand(now=now, peak=peak if peak is not None else now)


# -- fill and spread -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "wants", "expected"),
    [
        pytest.param(10, {"a": 3, "b": 3}, {"a": 3, "b": 3}, id="enough-for-all"),
        pytest.param(5, {"a": 1, "b": 10, "c": 10}, {"a": 1, "b": 2, "c": 2}, id="max-min"),
        pytest.param(4, {"a": 10, "b": 10}, {"a": 2, "b": 2}, id="equal-wants-equal-parts"),
        pytest.param(5, {"a": 10, "b": 10}, {"a": 2, "b": 3}, id="remainder-by-name"),
        pytest.param(0, {"a": 3}, {"a": 0}, id="nothing-to-give"),
        pytest.param(3, {"a": 0, "b": 0}, {"a": 0, "b": 0}, id="no-wants"),
        pytest.param(3, {"a": -2, "b": 5}, {"a": 0, "b": 3}, id="negative-want-is-none"),
    ],
)
def test_fill_is_max_min_fair(capacity: int, wants: dict[str, int], expected: dict[str, int]):
    assert fill(capacity, wants) == expected


@pytest.mark.parametrize(
    ("capacity", "wants", "unit", "expected"),
    [
        pytest.param(475, {"a": 600, "b": 600}, 300, {"a": 475, "b": 0}, id="one-whole"),
        pytest.param(700, {"a": 300, "b": 425}, 300, {"a": 300, "b": 400}, id="completes-first"),
        pytest.param(900, {"a": 900, "b": 900}, 300, {"a": 600, "b": 300}, id="by-requests"),
        pytest.param(1000, {"a": 300, "b": 400}, 300, {"a": 300, "b": 400}, id="enough"),
        pytest.param(5, {"a": 10, "b": 10}, 1, {"a": 3, "b": 2}, id="slots-in-name-order"),
        pytest.param(5, {"a": 10, "b": 10}, 0, {"a": 2, "b": 3}, id="no-unit-is-fill"),
        pytest.param(250, {"a": 600, "b": 40}, 300, {"a": 210, "b": 40}, id="small-want-whole"),
        pytest.param(0, {"a": 600}, 300, {"a": 0}, id="nothing"),
    ],
)
def test_fill_whole_splits_in_whole_requests(
    capacity: int, wants: dict[str, int], unit: int, expected: dict[str, int]
) -> None:
    assert fill_whole(capacity, wants, unit) == expected


def test_fill_whole_serves_who_holds_the_fewest_requests_first() -> None:
    # b holds 175 tokens (no whole request), a one request: b's 125 completes one, then
    # each gets 300; the 48 left complete nobody's and stay with a
    held = {"a": 300, "b": 175}
    assert fill_whole(773, {"a": 900, "b": 1025}, 300, held) == {"a": 348, "b": 425}


def test_floors_split_over_replicas_are_not_fragments_too_small_for_a_request() -> None:
    # the scale-out bench's four-skewed case: batch requests (300 tokens) reach two
    # replicas, each with 4 queued; chat reaches a third; the batch floor is 475 tokens
    plan = three_tiers(floors=(A(893, 4), A(475, 2), A(475, 1)), shared=A(0, 1))
    batch = TierDemand(now=A(1200, 4), peak=A(1200, 4), head_tokens=300)
    table = {
        "r0": Report({"batch": batch}),
        "r1": Report({"batch": batch}),
        "r3": Report({"interactive": demand(A(120, 1), A(240, 2))}),
    }

    def started(leases: dict[str, Lease]) -> tuple[int, int]:
        """Batch requests the two replicas can start, and what the same capacity starts
        on one replica (r0 and r1 hold no interactive floor: all they hold is batch's)."""
        held = [leases[m].total for m in ("r0", "r1")]
        apart = sum(min(a.tokens // 300, a.slots) for a in held)
        together = min(sum(a.tokens for a in held) // 300, sum(a.slots for a in held))
        return apart, together

    apart, together = started(plan_leases(plan, table))
    assert apart == together == 5
    # without the unit (what the replicas reported before), fractions of a request sat idle
    table = {m: Report({t: TierDemand(d.now, d.peak) for t, d in r.tiers.items()})
             for m, r in table.items()}  # fmt: skip
    apart, together = started(plan_leases(plan, table))
    assert (apart, together) == (4, 5)


@pytest.mark.parametrize(
    ("capacity", "weights", "expected"),
    [
        pytest.param(6, {"a": 1, "b": 2}, {"a": 2, "b": 4}, id="proportional"),
        pytest.param(5, {"a": 1, "b": 1}, {"a": 3, "b": 2}, id="remainder-by-name"),
        pytest.param(4, {"a": 0, "b": 0}, {"a": 2, "b": 2}, id="all-zero-equal"),
        pytest.param(4, {"a": 0, "b": 3}, {"a": 0, "b": 4}, id="zero-weight-none"),
        pytest.param(0, {"a": 1}, {"a": 0}, id="nothing"),
        pytest.param(7, {}, {}, id="nobody"),
    ],
)
def test_spread_hands_out_everything(capacity: int, weights: dict[str, int], expected):
    assert spread(capacity, weights) == expected


# -- the allocation ----------------------------------------------------------------------


@dataclass
class AllocationCase:
    id: str
    reports: dict[str, Report]
    floors: dict[str, dict[str, Amount]]  # member -> tier -> expected floor
    shared: dict[str, Amount] = field(default_factory=dict)
    loans: dict[str, dict[str, Amount]] = field(default_factory=dict)
    plan: LeasePlan = field(default_factory=three_tiers)
    standby: dict[str, dict[str, Amount]] | None = None  # member -> tier -> standby (None: any)


ALLOCATION_CASES = [
    AllocationCase(
        id="skewed-ingress-chat-on-b-batch-and-eval-on-a",
        reports={
            "a": Report(
                {"batch": demand(A(1500, 6)), "eval": demand(A(700, 3))},
            ),
            "b": Report({"interactive": demand(A(200, 1), A(400, 2))}),
        },
        floors={
            "a": {"interactive": ZERO, "batch": A(552, 2), "eval": A(192, 1)},
            "b": {"interactive": A(921, 4), "batch": ZERO, "eval": ZERO},
        },
        shared={"a": A(178, 1), "b": ZERO},
        # b's idle interactive floor (921 - 200 tokens, 4 - 1 slots) is loaned to a
        loans={"a": {"interactive": A(721, 3)}, "b": {}},
    ),
    AllocationCase(
        id="idle-pool-floors-equal-shared-equal",
        reports={"a": Report(), "b": Report()},
        floors={
            "a": {"interactive": A(461, 2), "batch": A(276, 1), "eval": A(96, 1)},
            "b": {"interactive": A(460, 2), "batch": A(276, 1), "eval": A(96, 0)},
        },
        shared={"a": A(89, 1), "b": A(89, 0)},
    ),
    AllocationCase(
        id="a-tier-present-on-one-replica-has-all-its-floor-there",
        reports={
            "a": Report({"interactive": demand(ZERO, A(100, 1))}),
            "b": Report({"batch": demand(A(552, 2))}),
        },
        floors={
            # eval is present nowhere: its floor goes where the demand is, in proportion
            # (tokens: a 100, b 552 -> 29 and 163; slots: a 1, b 2 -> the one slot to b)
            "a": {"interactive": A(921, 4), "batch": ZERO, "eval": A(29, 0)},
            "b": {"interactive": ZERO, "batch": A(552, 2), "eval": A(163, 1)},
        },
        # the shared remainder nobody waits for goes to the active replicas, equally
        shared={"a": A(89, 1), "b": A(89, 0)},
        # b's batch fits its floor; nothing is borrowed
    ),
    AllocationCase(
        id="ninety-ten-split-of-every-tier",
        reports={
            "a": Report(
                {
                    "interactive": demand(A(540, 3)),
                    "batch": demand(A(900, 4)),
                    "eval": demand(A(300, 2)),
                }
            ),
            "b": Report(
                {
                    "interactive": demand(A(60, 1)),
                    "batch": demand(A(100, 1)),
                    "eval": demand(A(30, 1)),
                }
            ),
        },
        # each floor split max-min fair over the peaks: b's small demands are met in full;
        # interactive's 321 tokens nobody needs are split equally where it is present;
        # eval's one slot goes to the replica that wants more of it
        floors={
            "a": {"interactive": A(701, 3), "batch": A(452, 1), "eval": A(162, 1)},
            "b": {"interactive": A(220, 1), "batch": A(100, 1), "eval": A(30, 0)},
        },
        shared={"a": A(178, 1), "b": ZERO},
        # a's batch waits beyond its floor, a's own idle interactive floor and the shared
        # remainder; b's idle interactive floor (220 - 60 tokens) is loaned to it
        loans={"a": {"interactive": A(160, 0)}, "b": {}},
    ),
    AllocationCase(
        id="a-wait-tier-lends-its-idle-floor-elsewhere-and-holds-that-much-less",
        plan=LeasePlan(
            tiers=("batch", "eval"),
            floors={"batch": A(600, 4), "eval": A(200, 2)},
            lend_percent={"batch": 50, "eval": 100},
            preempt=frozenset(),
            shared=ZERO,
            per_engine=A(800, 6),
        ),
        reports={
            "a": Report({"batch": demand(ZERO, A(100, 1))}),
            "b": Report({"eval": demand(A(800, 6))}),
        },
        # batch's floor is on a (present there); half of it is lendable and idle: it moves
        # to b, where eval waits beyond its own floor (reclaim Wait: it comes back as
        # eval's requests end)
        floors={
            "a": {"batch": A(300, 2), "eval": ZERO},
            "b": {"batch": ZERO, "eval": A(200, 2)},
        },
        loans={"a": {}, "b": {"batch": A(300, 2)}},
    ),
    AllocationCase(
        id="requests-in-flight-keep-what-they-reserve-before-a-queue-elsewhere-starts",
        plan=batch_only_shared(),
        reports={  # a runs two requests of 300 and queues one; b queues one
            "a": Report(
                {"batch": TierDemand(A(900, 3), A(900, 3), head_tokens=300, held=A(600, 2))}
            ),
            "b": Report({"batch": TierDemand(A(300, 1), A(300, 1), head_tokens=300)}),
        },
        floors={"a": {"batch": ZERO}, "b": {"batch": ZERO}},
        # fewest-held first alone gave each 300 tokens: a's lease below its running
        # requests, and b a wish the grant could not meet until one of them ended (as on
        # one replica, no queued request fits; the next free 300 go to b, fewest-held)
        shared={"a": A(600, 3), "b": A(0, 1)},
    ),
    AllocationCase(
        id="when-one-of-them-ends-the-queue-holding-fewest-is-served",
        plan=batch_only_shared(),
        reports={
            "a": Report(
                {"batch": TierDemand(A(600, 2), A(900, 3), head_tokens=300, held=A(300, 1))}
            ),
            "b": Report({"batch": TierDemand(A(300, 1), A(300, 1), head_tokens=300)}),
        },
        floors={"a": {"batch": ZERO}, "b": {"batch": ZERO}},
        # (slots: both queues fit; the slot no one waits for is slack, to a by name)
        shared={"a": A(300, 3), "b": A(300, 1)},
    ),
    AllocationCase(
        id="a-burst-at-one-replica-takes-the-floor-idle-at-the-others",
        plan=LeasePlan(
            tiers=("interactive",),
            floors={"interactive": A(400, 4)},
            lend_percent={"interactive": 100},
            preempt=frozenset({"interactive"}),
            shared=ZERO,
            per_engine=A(400, 4),
        ),
        reports={  # three chats at a now; b, c and d had one each in the last seconds
            "a": Report({"interactive": TierDemand(A(300, 3), A(300, 3), head_tokens=100)}),
            **{m: Report({"interactive": demand(ZERO, A(100, 1))}) for m in "bcd"},
        },
        # by the recent peaks alone each got one chat's worth, and two of a's chats waited
        # while c's and d's parts sat idle; now first, then the peaks with what is left
        floors={
            "a": {"interactive": A(300, 3)},
            "b": {"interactive": A(100, 1)},
            "c": {"interactive": ZERO},
            "d": {"interactive": ZERO},
        },
        # a's floor part is full and the next chat is likeliest there: b's idle part
        # stands by at a (booked twice: b keeps it); no idle floor is left for c and d
        standby={"a": {"interactive": A(100, 1)}, "b": {}, "c": {}, "d": {}},
    ),
    AllocationCase(
        id="four-replicas-at-70-10-10-10-every-chat-finds-room",
        reports={
            "a": Report(
                {
                    "interactive": demand(A(120, 1), A(360, 3)),
                    "batch": demand(A(1200, 4)),
                    "eval": demand(A(600, 2)),
                }
            ),
            **{
                m: Report(
                    {
                        "interactive": demand(ZERO, A(120, 1)),
                        "batch": demand(A(300, 1)),
                        "eval": demand(A(150, 1)),
                    }
                )
                for m in "bcd"
            },
        },
        # the floor's four slots: a's chat now, then the recent peaks max-min fair (a one
        # more, c and d one each); b, where chats come too, holds chat tokens but no slot:
        # it gets a slot of a's idle floor as a standby (which a's batch may still
        # borrow: a chat starting at b preempts it), so a chat finds room on every replica
        floors={
            "a": {"interactive": A(411, 2), "batch": A(138, 1), "eval": A(48, 1)},
            "b": {"interactive": A(170, 0), "batch": A(138, 0), "eval": A(48, 0)},
            "c": {"interactive": A(170, 1), "batch": A(138, 0), "eval": A(48, 0)},
            "d": {"interactive": A(170, 1), "batch": A(138, 1), "eval": A(48, 0)},
        },
        standby={"a": {}, "b": {"interactive": A(0, 1)}, "c": {}, "d": {}},
    ),
    AllocationCase(
        id="a-chat-gap-longer-than-the-peaks-keeps-the-standby",
        reports={
            "a": Report(
                {
                    "interactive": demand(A(120, 1), A(360, 3)),
                    "batch": demand(A(1200, 4)),
                    "eval": demand(A(600, 2)),
                }
            ),
            "b": Report({"interactive": demand(ZERO, A(120, 1)), "batch": demand(A(300, 1))}),
            # c's last chat is older than the peaks' window but within the presence
            # window (reported as the tier with no demand); d never sees a chat
            "c": Report({"interactive": TierDemand(), "batch": demand(A(300, 1))}),
            "d": Report({"batch": demand(A(300, 1))}),
        },
        # the slots go by the peaks; the tokens they leave go equally where chats came
        # lately (c too: its last chat is within the presence window), not only where
        # they peak
        floors={
            "a": {"interactive": A(507, 3), "batch": A(138, 1), "eval": A(192, 1)},
            "b": {"interactive": A(267, 1), "batch": A(138, 0), "eval": ZERO},
            "c": {"interactive": A(147, 0), "batch": A(138, 0), "eval": ZERO},
            "d": {"interactive": ZERO, "batch": A(138, 1), "eval": ZERO},
        },
        # c's next chat starts at once: its tokens on its floor part, its slot on a
        # standby; d, where chats never come, books none
        standby={"a": {}, "b": {}, "c": {"interactive": A(0, 1)}, "d": {}},
    ),
    AllocationCase(
        id="chats-sparser-than-the-peaks-keep-their-floor-where-they-come",
        reports={
            # a chat every ten seconds or so at each replica: none within the peaks'
            # window anywhere, each within the presence window (the tier with no demand);
            # batch waits at a
            "a": Report({"interactive": TierDemand(), "batch": demand(A(1500, 6))}),
            "b": Report({"interactive": TierDemand(), "batch": demand(A(100, 1))}),
            "c": Report({"interactive": TierDemand(), "batch": demand(A(100, 1))}),
            "d": Report({"interactive": TierDemand(), "batch": demand(A(100, 1))}),
        },
        # the floor in equal parts where chats come, so the next one starts at once
        # wherever it lands. Before, all of it went to a with the borrowers (by total
        # demand): a held 768 tokens and 3 slots, b, c and d 51 tokens each, too little
        # for a chat, and a chat there waited for a to give a piece up (0.12 s in
        # tests/integration/test_gateway_scaleout.py)
        floors={
            "a": {"interactive": A(231, 1), "batch": A(252, 1), "eval": A(160, 1)},
            "b": {"interactive": A(230, 1), "batch": A(100, 0), "eval": ZERO},
            "c": {"interactive": A(230, 1), "batch": A(100, 0), "eval": ZERO},
            "d": {"interactive": A(230, 1), "batch": A(100, 1), "eval": ZERO},
        },
        standby={"a": {}, "b": {}, "c": {}, "d": {}},
        # a's batch borrows the idle floor it holds, and b's, c's and d's (booked twice:
        # the chats that come take it back through the engine's preemption)
        loans={"a": {"eval": A(32, 0), "interactive": A(647, 1)}, "b": {}, "c": {}, "d": {}},
    ),
    AllocationCase(
        id="a-tier-only-presumed-at-a-new-replica-gets-a-standby-there-not-floor",
        reports={
            "a": Report({"interactive": demand(A(230, 1))}),
            # b has just joined: it presumes chats may come to it too
            "b": Report({"interactive": TierDemand()}, presumed=frozenset({"interactive"})),
        },
        # the floor a's chat does not use stays at a (a floor part at b would be lent to
        # b's own borrowers and held there, out of reach of a's next chats)
        floors={
            "a": {"interactive": A(921, 4), "batch": A(552, 2), "eval": A(192, 1)},
            "b": {"interactive": ZERO, "batch": ZERO, "eval": ZERO},
        },
        shared={"a": A(178, 1), "b": ZERO},
        standby={"a": {}, "b": {"interactive": A(230, 1)}},
    ),
    AllocationCase(
        id="left-overs-at-two-replicas-start-a-request-at-one",
        plan=LeasePlan(
            tiers=("interactive", "batch"),
            floors={"interactive": A(800, 4), "batch": ZERO},
            lend_percent={"interactive": 100, "batch": 0},
            preempt=frozenset({"interactive"}),
            shared=A(200, 4),
            per_engine=A(1000, 8),
        ),
        reports={  # a runs one request of 200 and queues 3; b runs one of 350 and queues 2
            "a": Report({"batch": TierDemand(A(800, 4), A(800, 4), 200, held=A(200, 1))}),
            "b": Report({"batch": TierDemand(A(1050, 3), A(1050, 3), 350, held=A(350, 1))}),
            "c": Report({"interactive": demand(ZERO, A(100, 1))}),
        },
        floors={
            "a": {"interactive": ZERO, "batch": ZERO},
            "b": {"interactive": ZERO, "batch": ZERO},
            "c": {"interactive": A(800, 4), "batch": ZERO},
        },
        # the requests in flight first (the shared remainder 100 and 100, then loans of
        # 100 and 250), then the queues, then consolidation: a starts two more requests
        # (50 idle), b none and holds exactly what its running request reserves
        shared={"a": A(100, 2), "b": A(100, 2), "c": ZERO},
        loans={"a": {"interactive": A(550, 2)}, "b": {"interactive": A(250, 1)}},
    ),
    AllocationCase(
        id="a-wait-floors-pieces-move-to-where-they-start-a-request",
        plan=LeasePlan(
            tiers=("batch",),
            floors={"batch": A(600, 4)},
            lend_percent={"batch": 0},
            preempt=frozenset(),
            shared=ZERO,
            per_engine=A(600, 4),
        ),
        reports={  # a runs one of 300 and queues one of 350; b queues two of 200
            "a": Report({"batch": TierDemand(A(650, 2), A(650, 2), 350, held=A(300, 1))}),
            "b": Report({"batch": TierDemand(A(400, 2), A(400, 2), 200)}),
        },
        # the floor by demand gave a 550 (250 idle, its next needs 350) and b 50 (its next
        # needs 200): 300 idle, nothing starts. 150 of a's piece completes b's next request
        floors={"a": {"batch": A(400, 2)}, "b": {"batch": A(200, 2)}},
    ),
    AllocationCase(
        id="a-preempt-floors-idle-piece-is-lent-where-it-starts-a-request",
        plan=LeasePlan(
            tiers=("interactive", "batch"),
            floors={"interactive": A(400, 2), "batch": A(400, 2)},
            lend_percent={"interactive": 100, "batch": 0},
            preempt=frozenset({"interactive"}),
            shared=ZERO,
            per_engine=A(800, 4),
        ),
        reports={  # no chats; a queues two batch requests of 350, b one
            "a": Report({"batch": TierDemand(A(700, 2), A(700, 2), 350)}),
            "b": Report({"batch": TierDemand(A(350, 1), A(350, 1), 350)}),
        },
        # a starts one on its batch floor and has 50 + 267 of interactive for the next
        # (350); b's 133 of interactive starts nothing there. 33 of it is booked as a's
        # loan (b keeps its floor: a chat at b takes it back through the engine)
        floors={
            "a": {"interactive": A(267, 1), "batch": A(400, 1)},
            "b": {"interactive": A(133, 1), "batch": A(0, 1)},
        },
        loans={"a": {"interactive": A(33, 0)}, "b": {}},
    ),
]


@pytest.mark.parametrize("case", ALLOCATION_CASES, ids=lambda c: c.id)
def test_allocation(case: AllocationCase) -> None:
    leases = plan_leases(case.plan, case.reports)
    assert {m: dict(lease.floors) for m, lease in leases.items()} == case.floors
    if case.shared:
        assert {m: lease.shared for m, lease in leases.items()} == case.shared
    for member, loans in case.loans.items():
        got = {t: v for t, v in leases[member].loans.items() if not v.is_zero}
        assert got == {t: v for t, v in loans.items() if not v.is_zero}, member
    if case.standby is not None:
        assert {m: dict(lease.standby) for m, lease in leases.items()} == case.standby


def test_no_replica_gets_no_lease() -> None:
    assert plan_leases(three_tiers(), {}) == {}


def test_an_idle_preempt_floor_is_lent_once_whichever_replicas_it_could_start() -> None:
    # a flood at 70/10/10/10 (sampled by bench/lease_fragments.py): no chats anywhere, the
    # interactive floor placed where the borrowers are; consolidation lends pieces of it to
    # several replicas, and a piece booked for one must not be booked again for another
    plan = LeasePlan(
        tiers=("interactive", "batch", "eval"),
        floors={"interactive": A(893, 4), "batch": A(475, 2), "eval": A(475, 1)},
        lend_percent={"interactive": 100, "batch": 50, "eval": 100},
        preempt=frozenset({"interactive"}),
        shared=A(0, 1),
        per_engine=A(1843, 8),
    )
    flood = {  # (batch now, head, held), (eval now, head, held)
        "r0": ((A(10065, 24), 423, A(759, 2)), (A(2775, 13), 217, A(171, 1))),
        "r1": ((A(1344, 3), 448, ZERO), (A(1088, 5), 223, A(196, 1))),
        "r2": ((A(1182, 3), 394, ZERO), (A(459, 2), 242, A(217, 1))),
        "r3": ((A(781, 3), 254, A(273, 1)), (A(364, 2), 182, ZERO)),
    }
    reports = {
        member: Report(
            {
                tier: TierDemand(now, now, head, held=held)
                for tier, (now, head, held) in zip(("batch", "eval"), tiers, strict=True)
            }
        )
        for member, tiers in flood.items()
    }
    leases = plan_leases(plan, reports)
    lent = sum((x.loans.get("interactive", ZERO) for x in leases.values()), ZERO)
    assert lent.tokens > 0  # consolidation lent some of it
    assert lent.tokens <= 893 and lent.slots <= 4


def test_the_allocation_is_the_same_whatever_order_the_reports_come_in() -> None:
    reports = ALLOCATION_CASES[3].reports
    backwards = dict(reversed(list(reports.items())))
    assert plan_leases(three_tiers(), reports) == plan_leases(three_tiers(), backwards)


@pytest.mark.parametrize(
    ("limit", "tenants", "expected"),
    [
        pytest.param(4, {"a": (4, 4), "b": (0, 0)}, {"a": 4}, id="all-on-one-replica"),
        pytest.param(4, {"a": (3, 3), "b": (3, 3)}, {"a": 2, "b": 2}, id="max-min"),
        pytest.param(6, {"a": (1, 1), "b": (1, 2)}, {"a": 3, "b": 3}, id="rest-in-equal-parts"),
        # b has not seen the tenant lately: its part of the rest starts its next request
        pytest.param(6, {"a": (2, 2)}, {"a": 4, "b": 2}, id="rest-also-where-absent"),
        pytest.param(1, {"a": (1, 1)}, {"a": 1}, id="nothing-left-for-the-absent"),
        pytest.param(5, {}, {}, id="reported-nowhere-held-nowhere"),
    ],
)
def test_a_tenants_max_concurrency_follows_its_requests(
    limit: int, tenants: dict[str, tuple[int, int]], expected: dict[str, int]
) -> None:
    plan = LeasePlan(("t",), {"t": A(10, 1)}, {"t": 0}, frozenset(), ZERO, A(10, 1), {"x": limit})
    reports = {
        "a": Report(tenants={"x": tenants["a"]} if "a" in tenants else {}),
        "b": Report(tenants={"x": tenants["b"]} if "b" in tenants else {}),
    }
    leases = plan_leases(plan, reports)
    got = {m: lease.tenants["x"] for m, lease in leases.items() if lease.tenants.get("x")}
    assert got == expected


# -- the grant ---------------------------------------------------------------------------


@dataclass
class GrantCase:
    id: str
    others: dict[str, int]
    desired: dict[str, int]
    held: dict[str, int]
    granted: dict[str, int]
    claim: dict[str, int]
    warming: bool = False


GROUPS = {
    "shared.slots": (4, ("shared.slots",)),
    "floor.slots.batch": (2, ("floor.slots.batch", "loan.slots.batch")),
}

GRANT_CASES = [
    GrantCase("free-capacity-is-granted", {}, {"shared.slots": 4}, {}, {"shared.slots": 4},
              {"shared.slots": 4}),
    GrantCase("never-what-others-claim", {"shared.slots": 3}, {"shared.slots": 4}, {},
              {"shared.slots": 1}, {"shared.slots": 1}),
    GrantCase("a-smaller-lease-still-claims-what-is-in-flight", {}, {"shared.slots": 1},
              {"shared.slots": 3}, {"shared.slots": 1}, {"shared.slots": 3}),
    GrantCase("others-over-capacity-give-nothing", {"shared.slots": 5}, {"shared.slots": 2},
              {}, {}, {}),
    GrantCase("warming-grows-nothing", {}, {"shared.slots": 4}, {"shared.slots": 1},
              {"shared.slots": 1}, {"shared.slots": 1}, warming=True),
    GrantCase("a-floor-and-its-loans-share-one-figure", {"loan.slots.batch": 1},
              {"floor.slots.batch": 2}, {}, {"floor.slots.batch": 1}, {"floor.slots.batch": 1}),
    GrantCase("the-callers-floor-claim-counts-against-its-own-loan",
              {}, {"floor.slots.batch": 1, "loan.slots.batch": 2}, {"floor.slots.batch": 1},
              {"floor.slots.batch": 1, "loan.slots.batch": 1},
              {"floor.slots.batch": 1, "loan.slots.batch": 1}),
    GrantCase("what-the-caller-holds-above-its-grant-counts-in-the-group",
              {}, {"floor.slots.batch": 0, "loan.slots.batch": 2}, {"floor.slots.batch": 2},
              {}, {"floor.slots.batch": 2}),
    GrantCase("a-component-gone-from-the-plan-stays-claimed-while-held", {},
              {"tenant.gone": 2}, {"tenant.gone": 1}, {}, {"tenant.gone": 1}),
]  # fmt: skip


@pytest.mark.parametrize("case", GRANT_CASES, ids=lambda c: c.id)
def test_grant(case: GrantCase) -> None:
    grant = decide_grant(GROUPS, case.others, case.desired, case.held, warming=case.warming)
    assert (grant.granted, grant.claim) == (case.granted, case.claim)


# -- fallback ----------------------------------------------------------------------------

CLOCK = LeaseClock(period=0.1, lease_ttl=2.5, member_ttl=3.0, redis_timeout=0.1)


@pytest.mark.parametrize(
    ("now", "last_ok", "failing_since", "mode"),
    [
        pytest.param(5.0, None, None, LeaseMode.NONE, id="never-leased"),
        pytest.param(5.0, None, 1.0, LeaseMode.NONE, id="never-leased-redis-down"),
        pytest.param(5.0, 4.0, None, LeaseMode.LEASED, id="fresh"),
        pytest.param(5.0, 4.0, 4.5, LeaseMode.LEASED, id="failing-but-still-valid"),
        pytest.param(7.0, 4.0, None, LeaseMode.EXPIRED, id="stalled-past-its-lease"),
        pytest.param(6.6, 4.0, 4.1, LeaseMode.SHRUNK, id="redis-down-just-expired"),
        pytest.param(6.95, 4.0, 4.1, LeaseMode.EQUAL, id="redis-down-settled"),
        # stopped for 10 s, then resumed into an outage: shrunk first, like everyone
        pytest.param(14.1, 4.0, 14.0, LeaseMode.SHRUNK, id="resumed-into-an-outage"),
        pytest.param(14.5, 4.0, 14.0, LeaseMode.EQUAL, id="resumed-into-an-outage-settled"),
    ],
)
def test_lease_mode(now: float, last_ok, failing_since, mode: LeaseMode) -> None:
    assert decide_lease_mode(now, last_ok=last_ok, failing_since=failing_since, clock=CLOCK) == mode


def test_the_equal_split_and_the_shrunk_lease_never_exceed_the_plan() -> None:
    plan = three_tiers()
    equal = equal_split(plan, 3)
    assert equal.floors["interactive"] == A(307, 1)
    assert equal.total.tokens * 3 <= plan.total.tokens
    last = Lease(floors={"interactive": A(921, 4)}, shared=A(178, 1), loans={"batch": A(9, 1)})
    low = shrunk(last, equal)
    assert low.floors["interactive"] == A(307, 1) and low.loans == {}
    assert low.shared == A(59, 0)


HELD = {"chat": 150}  # this replica's lease: chat busy here, bulk idle here
LIMITS = {"chat": 200, "bulk": 64}  # two replicas: equal parts 100 and 32


@pytest.mark.parametrize(
    ("mode", "failing", "shares"),
    [
        pytest.param(LeaseMode.LEASED, False, {"chat": 150}, id="leased-bulk-waits-a-renewal"),
        # Redis just died: no renewal can lease bulk here, so its equal part, at once
        pytest.param(LeaseMode.LEASED, True, {"chat": 150, "bulk": 32}, id="redis-down-valid"),
        pytest.param(LeaseMode.SHRUNK, True, {"chat": 100, "bulk": 32}, id="redis-down-shrunk"),
        pytest.param(LeaseMode.EQUAL, True, {"chat": 100, "bulk": 32}, id="redis-down-equal"),
        pytest.param(LeaseMode.EXPIRED, False, {}, id="stalled"),
        pytest.param(LeaseMode.NONE, True, {}, id="never-leased"),
    ],
)
def test_a_tenant_idle_here_when_redis_goes_is_served_at_once(
    mode: LeaseMode, failing: bool, shares: dict[str, int]
) -> None:
    assert tenant_shares_in_mode(mode, HELD, LIMITS, 2, failing=failing) == shares


# -- a lease as a pool view --------------------------------------------------------------


def test_a_lease_applied_to_a_pool_is_a_consistent_plan() -> None:
    pool = (
        CompiledPoolBuilder("tiny")
        .capacity(3686, 16)
        .replica_capacity(1843, 8)
        .tier("interactive", 1842, 8)
        .tier("batch", 1104, 4)
        .obj()
    )
    tiers = [
        compiled_tier("interactive", 0, lend_percent=100, reclaim="Preempt"),
        compiled_tier("batch", 1, lend_percent=50),
    ]
    plan = build_lease_plan(pool, tiers, {"acme": 3})
    assert plan.total == A(3686, 16)
    assert plan.groups()["loan.slots.interactive"] == (
        8,
        ("loan.slots.interactive", "standby.slots.interactive"),
    )
    lease = Lease(
        floors={"interactive": A(1000, 4), "batch": A(1104, 4)},
        shared=A(100, 1),
        loans={"interactive": A(200, 1)},
    )
    view = apply_lease(pool, plan, lease)
    assert view.tiers["batch"].lendable_slots == 2  # batch lends half of its leased floor
    assert (view.shared_tokens, view.shared_slots) == (300, 2)  # shared plus the loan
    assert (view.total_tokens, view.total_slots) == (2404, 10)
    # an engine holds the lease's share of what it holds in the plan
    assert (view.tokens_per_replica, view.slots_per_replica) == (1843 * 2404 // 3686, 5)
    assert Lease.from_components(lease.components()) == Lease(
        floors=lease.floors, shared=lease.shared, loans=lease.loans
    )


def test_a_standby_is_the_tiers_floor_there_not_lendable_and_claimed_apart() -> None:
    plan = three_tiers()
    lease = Lease(floors={"interactive": A(100, 1)}, standby={"interactive": A(120, 1)})
    assert Lease.from_components(lease.components()) == lease
    assert lease.total == A(220, 2)
    pool = (
        CompiledPoolBuilder("tiny")
        .capacity(1843, 8)
        .replica_capacity(1843, 8)
        .tier("interactive", 921, 4)
        .obj()
    )
    applied = apply_lease(pool, plan, lease).tiers["interactive"]
    assert (applied.floor_tokens, applied.floor_slots) == (220, 2)
    assert (applied.lendable_tokens, applied.lendable_slots) == (100, 1)  # its own part only
    # two chats in flight, 200 tokens: the leased floor part holds 100 and 1, the standby
    # the rest; nothing spills onto components the lease does not have
    usage = TierUsage("interactive", 0, 200, 2, 220, 2, 0, 0, 0, 0, 0, 0)
    held = held_components(lease, [usage], ZERO, {}, in_use=A(200, 2))
    assert held == {
        "floor.tokens.interactive": 100,
        "floor.slots.interactive": 1,
        "standby.tokens.interactive": 120,
        "standby.slots.interactive": 1,
    }


def test_a_tier_that_arrived_lately_is_reported_with_no_demand() -> None:
    idle = TierUsage("interactive", 0, 0, 0, 400, 2, 0, 0, 0, 0, 0, 0)
    busy = TierUsage("batch", 1, 300, 1, 200, 1, 100, 0, 0, 0, 0, 0)
    report = report_of([idle, busy], {}, {}, {}, seen={"interactive", "batch"})
    assert report.tiers["interactive"] == TierDemand()
    assert report.arrives("interactive") and report.arrives("batch")
    assert not report_of([idle], {}, {}, {}).arrives("interactive")  # never seen: left out
    assert not Report({"interactive": TierDemand()}).active  # presence alone is no demand


def test_a_tier_a_new_replica_only_presumes_is_marked_as_such() -> None:
    idle = TierUsage("interactive", 0, 0, 0, 400, 2, 0, 0, 0, 0, 0, 0)
    busy = TierUsage("batch", 1, 300, 1, 200, 1, 100, 0, 0, 0, 0, 0)
    report = report_of([idle, busy], {}, {}, {}, presumed={"interactive", "batch"})
    assert report.arrives("interactive") and not report.came("interactive")
    assert report.came("batch")  # it has demand here: it came, whatever was presumed
    assert report.presumed == {"interactive"}
    seen = report_of([idle], {}, {}, {}, seen={"interactive"}, presumed={"interactive"})
    assert seen.came("interactive")  # it did come within the presence window


def test_a_floor_lent_to_another_replica_is_not_lendable_at_the_lender_too() -> None:
    """On one replica a piece of idle interactive floor has one borrower. ``b`` holds the
    interactive floor with one chat in flight and queues batch; ``a``'s batch runs on a
    loan of ``b``'s idle floor (its requests in flight hold it). The loan stays booked on
    ``b`` (requests in flight before any queue borrows at home), and applied at ``b`` the
    booked part is not lendable to ``b``'s own batch: before, ``b``'s queue took the idle
    floor at home while ``a``'s requests kept the loan (11 requests on an 8-slot engine in
    ``test_a_floor_lent_to_another_replica_has_one_borrower``)."""
    plan = three_tiers()
    chat = TierDemand(now=A(120, 1), peak=A(120, 1), held=A(120, 1))
    running = TierDemand(now=A(1600, 5), peak=A(1600, 5), head_tokens=400, held=A(1600, 5))
    queued = TierDemand(now=A(1200, 3), peak=A(1200, 3), head_tokens=400)
    reports = {
        "a": Report({"batch": running}),
        "b": Report({"interactive": chat, "batch": queued}),
    }
    leases = plan_leases(plan, reports)
    loan = leases["a"].loans.get("interactive", ZERO)
    assert loan.tokens > 0 and loan.slots > 0, leases["a"]
    floor = leases["b"].floors["interactive"]
    idle = plan.lendable("interactive", floor).min(floor - A(120, 1))  # what the chat leaves
    here = leases["b"].lendable_here["interactive"]
    assert here == (idle - loan).clamp0(), (here, idle, loan)
    assert leases["a"].lendable_here == {}  # nothing of a's floors is lent
    assert "lendable" not in str(leases["b"].components())  # not a claim: Redis never sees it
    pool = (
        CompiledPoolBuilder("tiny")
        .capacity(1843, 8)
        .replica_capacity(1843, 8)
        .tier("interactive", 893, 4)
        .obj()
    )
    at_b = apply_lease(pool, plan, leases["b"]).tiers["interactive"]
    assert (at_b.lendable_tokens, at_b.lendable_slots) == (here.tokens, here.slots)
    assert at_b.floor_tokens == floor.tokens  # its chats keep the whole floor
