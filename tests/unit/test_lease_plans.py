"""A replica's report for a leased plan: what it says arrives here, and for how long a
replica that has just joined presumes a tier that arrives elsewhere arrives here too;
and the desired lease it keeps for unchanged inputs, never a stale one
(``gateway/lease_plans.py``; the allocation it feeds is tests/unit/test_lease.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

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


QUEUING = Report(
    {"batch": TierDemand(now=A(1200, 4), peak=A(1200, 4), held=A(400, 2), head_tokens=400)}
)


def test_the_desired_lease_is_kept_while_its_inputs_stay_the_same() -> None:
    plan = joined({"b": CHATTING, "c": QUEUING})
    first = plan.desired("a", BATCHING)
    assert first == plan_leases(plan.plan, {**plan.table, "a": BATCHING})["a"]
    # the same inputs (an equal report, an equal table in a new dict): the same lease
    assert plan.desired("a", replace(BATCHING)) is first
    plan.table = dict(plan.table)
    assert plan.desired("a", BATCHING) is first


def _other_reports(plan: LeasedPlan) -> None:
    plan.table = {"b": QUEUING, "c": CHATTING}


def _table_changed_in_place(plan: LeasedPlan) -> None:
    plan.table["b"] = QUEUING


def _tenant_held(plan: LeasedPlan) -> None:
    plan.lease = replace(plan.lease, tenants={"bulk": 1})


def _another_plan(plan: LeasedPlan) -> None:
    plan.plan = replace(plan.plan, shared=A(0, 0))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_other_reports, id="the-others-report-anew"),
        pytest.param(_table_changed_in_place, id="the-table-changed-in-place"),
        pytest.param(_tenant_held, id="a-tenant-held-here"),
        pytest.param(_another_plan, id="a-reload-changed-the-plan"),
    ],
)
def test_the_desired_lease_is_computed_again_when_an_input_changes(
    change: Callable[[LeasedPlan], None],
) -> None:
    plan = joined({"b": CHATTING, "c": QUEUING})
    plan.plan = replace(plan.plan, tenants={"bulk": 2})
    kept = plan.desired("a", BATCHING)
    change(plan)
    again = plan.desired("a", BATCHING)
    assert again == plan_leases(plan.in_play(BATCHING), {**plan.table, "a": BATCHING})["a"]
    assert again is not kept


def test_the_kept_lease_is_always_the_one_the_allocation_computes() -> None:
    """Random reports, tables and repeats (seeded): every answer equals the allocation's
    own, whether it came from the kept one or not, and some came from it."""
    rng = random.Random(5)
    reports = [CHATTING, BATCHING, QUEUING, Report()]
    plan = joined({"b": CHATTING})
    kept = 0
    for _ in range(300):
        if rng.random() < 0.3:
            plan.table = {m: rng.choice(reports) for m in rng.sample(["b", "c", "d"], 2)}
        report = rng.choice(reports)
        before = plan._last
        lease = plan.desired("a", report)
        kept += before is not None and plan._last is before
        assert lease == plan_leases(plan.in_play(report), {**plan.table, "a": report})["a"]
    assert 20 < kept < 280  # both paths taken
