"""A replica's report for a leased plan: what it says arrives here, and for how long a
replica that has just joined presumes a tier that arrives elsewhere arrives here too
(``gateway/lease_plans.py``; the allocation it feeds is tests/unit/test_lease.py)."""

from __future__ import annotations

import pytest

from kvpool.domain.admission import AdmissionSnapshot
from kvpool.domain.admission.amount import Amount
from kvpool.domain.admission.verdicts import TierUsage
from kvpool.domain.lease import Report, TierDemand, plan_leases
from kvpool.gateway.lease_plans import JOIN_PRESUMPTION_SECONDS, LeasedPlan
from tests.builders.compiled import CompiledPoolBuilder
from tests.unit.test_lease import three_tiers

A = Amount
CHATTING = Report({"interactive": TierDemand(now=A(230, 1), peak=A(230, 1), held=A(230, 1))})
BATCHING = Report({"batch": TierDemand(now=A(400, 2), peak=A(400, 2), held=A(400, 2))})


def idle_snapshot() -> AdmissionSnapshot:
    tiers = tuple(
        TierUsage(name, rank, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        for rank, name in enumerate(("interactive", "batch", "eval"))
    )
    return AdmissionSnapshot(
        pool="tiny",
        total_tokens=1843,
        total_slots=8,
        in_use_tokens=0,
        in_use_slots=0,
        shared_used_tokens=0,
        shared_used_slots=0,
        overcommit_tokens=0,
        overcommit_slots=0,
        tiers=tiers,
        replicas=(),
        in_flight=0,
        queued=0,
        preempt_admissions=0,
        mean_hold_seconds=None,
    )


def joined(table: dict[str, Report]) -> LeasedPlan:
    view = CompiledPoolBuilder("tiny").capacity(1843, 8).replica_capacity(1843, 8).obj()
    plan = LeasedPlan("tiny", "stable", view, three_tiers())
    plan.table = dict(table)
    return plan


@pytest.mark.parametrize(
    ("others", "seconds_in", "arrives"),
    [
        pytest.param({"b": CHATTING}, 0.0, {"interactive"}, id="chat-elsewhere-at-join"),
        pytest.param(
            {"b": CHATTING}, JOIN_PRESUMPTION_SECONDS - 0.1, {"interactive"}, id="still-new"
        ),
        pytest.param({"b": CHATTING}, JOIN_PRESUMPTION_SECONDS, set(), id="no-longer-new"),
        pytest.param({"b": BATCHING}, 0.0, set(), id="a-wait-tier-is-not-presumed"),
        pytest.param({}, 0.0, set(), id="alone"),
    ],
)
def test_a_new_replica_presumes_a_preempt_tier_arriving_elsewhere_arrives_here(
    others: dict[str, Report], seconds_in: float, arrives: set[str]
) -> None:
    plan = joined(others)
    plan.report(idle_snapshot(), {}, now=100.0)  # its first report: it joins
    report = plan.report(idle_snapshot(), {}, now=100.0 + seconds_in)
    assert {t for t in ("interactive", "batch", "eval") if report.arrives(t)} == arrives
    assert not report.active  # presumed, not demand: nothing is reported as wanted


def test_the_presumption_gives_the_new_replica_a_standby_before_its_first_chat() -> None:
    plan = joined({"b": CHATTING, "c": BATCHING})
    report = plan.report(idle_snapshot(), {}, now=0.0)
    leases = plan_leases(plan.plan, {**plan.table, "a": report})
    assert leases["a"].standby["interactive"] == A(230, 1)  # one chat, booked on b's floor
    later = plan.report(idle_snapshot(), {}, now=JOIN_PRESUMPTION_SECONDS)
    assert "interactive" not in plan_leases(plan.plan, {**plan.table, "a": later})["a"].standby
