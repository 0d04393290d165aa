"""Capacity assessment, warm-replica decision, pool status and Events (pure operator decisions)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.api.modelpool import MeasuredCapacity, ModelPoolStatus, ReplicaStatus
from kvpool.api.plan import PlanStatus, TierPlanStatus
from kvpool.api.rollout import GateStatus, RolloutStatus
from kvpool.domain import conditions as c
from kvpool.domain.measurement import (
    METRICS_OFF,
    METRICS_OK,
    NO_DATA,
    PROMETHEUS_DOWN,
    CapacityAssessment,
    ReplicaReading,
    assess_capacity,
    decide_warm_replicas,
)
from kvpool.domain.planner import PlanError, plan_pool
from kvpool.domain.pool_status import (
    PoolObservation,
    build_missing_policy_status,
    build_pool_status,
)
from kvpool.domain.side_statuses import KeyLookup, build_budget_status, build_policy_status
from kvpool.domain.status_events import plan_events
from tests.builders import modelpool_manifest, standard_tierpolicy_manifest


def _reading(replica: str, tokens: int) -> ReplicaReading:
    return ReplicaReading(replica, tokens, 32)


def _measured(tokens: int, revision: str = "rev1", at: str = "t0") -> MeasuredCapacity:
    return MeasuredCapacity(
        kv_tokens_per_replica=tokens,
        block_size=32,
        source="Measured",
        revision=revision,
        measured_at=at,
    )


# --- assess_capacity ------------------------------------------------------------------------

CASES: list[tuple[str, Any, Any, Any, Any]] = [
    # id, readings, metrics, previous, expected (kv_tokens, source, reason, measured_at)
    (
        "first-measurement",
        [_reading("a", 4096)],
        METRICS_OK,
        None,
        (4096, "Measured", c.MEASURED, "t1"),
    ),
    (
        "replicas-disagree-plan-with-min",
        [_reading("a", 4096), _reading("b", 2048)],
        METRICS_OK,
        None,
        (2048, "Measured", c.MEASURED, "t1"),
    ),
    (
        "unchanged-keeps-time",
        [_reading("a", 4096)],
        METRICS_OK,
        _measured(4096),
        (4096, "Measured", c.MEASURED, "t0"),
    ),
    (
        "changed-new-time",
        [_reading("a", 2048)],
        METRICS_OK,
        _measured(4096),
        (2048, "Measured", c.MEASURED, "t1"),
    ),
    (
        "prometheus-down-keeps-last",
        [],
        PROMETHEUS_DOWN,
        _measured(4096),
        (4096, "Measured", c.KEPT_LAST_MEASUREMENT, "t0"),
    ),
    (
        "no-data-keeps-last",
        [],
        NO_DATA,
        _measured(4096),
        (4096, "Measured", c.KEPT_LAST_MEASUREMENT, "t0"),
    ),
    (
        "prometheus-down-keeps-other-revision",
        [],
        PROMETHEUS_DOWN,
        _measured(4096, "rev0"),
        (4096, "Measured", c.KEPT_LAST_MEASUREMENT, "t0"),
    ),
    ("never-measured-declared", [], NO_DATA, None, (None, "Declared", c.DECLARED, None)),
    ("metrics-off-declared", [], METRICS_OFF, None, (None, "Declared", c.DECLARED, None)),
]


@pytest.mark.parametrize(
    ("readings", "metrics", "previous", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_assess_capacity(readings: Any, metrics: Any, previous: Any, expected: Any) -> None:
    a = assess_capacity(readings, metrics, previous, "rev1", 1000, "t1")
    assert (a.kv_tokens, a.source, a.reason, a.measured_at) == expected
    assert a.to_status().kv_tokens_per_replica == (expected[0] if expected[0] is not None else 1000)


def test_disagreement_is_reported_with_the_spread() -> None:
    a = assess_capacity(
        [_reading("a", 4096), _reading("b", 2048)], METRICS_OK, None, "r", None, "t"
    )
    assert a.disagree and a.spread == (2048, 4096) and a.replicas_measured == 2


def test_no_declared_figure_and_no_measurement_is_reported_as_none() -> None:
    a = assess_capacity([], NO_DATA, None, "r", None, "t")
    assert (a.kv_tokens, a.source, a.reason) == (None, "None", c.NO_CAPACITY)


@pytest.mark.parametrize(
    ("previous", "new", "significant"),
    [
        (4096, 4096, False),
        (4096, 4300, False),
        (4096, 4600, True),
        (4096, 2048, True),
        (None, 2048, False),
    ],
    ids=["same", "plus-5pct", "plus-12pct", "halved", "first"],
)
def test_change_over_ten_percent_is_significant(
    previous: int | None, new: int, significant: bool
) -> None:
    prior = _measured(previous) if previous else None
    a = assess_capacity([_reading("a", new)], METRICS_OK, prior, "rev1", None, "t1")
    assert a.changed_significantly is significant


@pytest.mark.parametrize(
    ("planned", "last", "metrics", "spec_changed", "expected"),
    [
        (2, 3, PROMETHEUS_DOWN, False, 3),
        (2, 3, NO_DATA, False, 3),
        (4, 3, PROMETHEUS_DOWN, False, 4),
        (2, 3, METRICS_OK, False, 2),
        (2, 3, PROMETHEUS_DOWN, True, 2),
        (2, None, PROMETHEUS_DOWN, False, 2),
    ],
    ids=[
        "down-never-below-last",
        "no-data-never-below-last",
        "down-may-grow",
        "ok-follows-plan",
        "spec-change-wins",
        "first-plan",
    ],
)
def test_decide_warm_replicas(
    planned: int, last: int | None, metrics: Any, spec_changed: bool, expected: int
) -> None:
    assert decide_warm_replicas(planned, last, metrics, spec_changed) == expected


# --- build_pool_status ----------------------------------------------------------------------


def _observe(
    readings: list[ReplicaReading],
    *,
    metrics: Any = METRICS_OK,
    ready: int | None = None,
    peak: int = 4,
    max_replicas: int = 8,
    declared: int | None = None,
    tokenizer: str | None = None,
) -> tuple[PoolObservation, CapacityAssessment]:
    builder = (
        modelpool_manifest("chat")
        .lengths((100, 200), (50, 100))
        .peak(interactive=peak)
        .replicas(1, max_replicas)
    )
    if declared:
        builder = builder.capacity(kvTokensPerReplica=declared)
    pool = builder.obj()
    a = assess_capacity(readings, metrics, None, "rev1", declared, "t1")
    plan = plan_pool(pool, standard_tierpolicy_manifest().obj(), a.kv_tokens)
    warm = plan.replicas if not isinstance(plan, PlanError) else 1
    obs = PoolObservation(
        generation=2,
        revision="rev1",
        assessment=a,
        plan=plan,
        warm_replicas=warm,
        ready_replicas=warm if ready is None else ready,
        metrics=metrics,
        metrics_message="" if metrics == METRICS_OK else "gone",
        load=None,
        now="t1",
        tokenizer_path=tokenizer,
    )
    return obs, a


def _conds(status: ModelPoolStatus) -> dict[str, tuple[str, str]]:
    return {x.type: (x.status, x.reason) for x in status.conditions}


STATUS_CASES: list[tuple[str, dict[str, Any], str, dict[str, tuple[str, str]]]] = [
    (
        "all-good",
        {"readings": [_reading("a", 4096)]},
        "Ready",
        {
            c.READY: ("True", c.POOL_READY),
            c.CAPACITY_MEASURED: ("True", c.MEASURED),
            c.CAPACITY_SHORT: ("False", c.CAPACITY_SUFFICIENT),
            c.METRICS_UNAVAILABLE: ("False", c.METRICS_FRESH),
            c.DEGRADED: ("False", c.AS_EXPECTED),
            c.FLOOR_TOO_SMALL: ("False", c.FLOORS_HOLD_A_REQUEST),
            c.TOKENIZER_DECLARED: ("False", c.BYTE_ESTIMATE),
        },
    ),
    (
        "a-declared-tokenizer-counts-exactly",
        {"readings": [_reading("a", 4096)], "tokenizer": "/tokenizers/llama/tokenizer.json"},
        "Ready",
        {c.TOKENIZER_DECLARED: ("True", c.TOKENIZER_PATH_SET)},
    ),
    (
        "eval-floor-below-one-request-is-raised-and-said",
        {"readings": [_reading("a", 2048)], "peak": 1},
        "Ready",
        {c.FLOOR_TOO_SMALL: ("True", c.FLOOR_RAISED)},
    ),
    (
        "not-ready",
        {"readings": [_reading("a", 4096)], "ready": 0},
        "Pending",
        {c.READY: ("False", c.REPLICAS_NOT_READY)},
    ),
    (
        "disagree",
        {"readings": [_reading("a", 4096), _reading("b", 3000)]},
        "Degraded",
        {c.DEGRADED: ("True", c.REPLICAS_DISAGREE)},
    ),
    (
        "capacity-short",
        {"readings": [_reading("a", 4096)], "peak": 500, "max_replicas": 2},
        "Ready",
        {c.CAPACITY_SHORT: ("True", c.MAX_REPLICAS_TOO_LOW)},
    ),
    (
        "declared-until-measured",
        {"readings": [], "metrics": NO_DATA, "declared": 4096},
        "Ready",
        {
            c.CAPACITY_MEASURED: ("False", c.DECLARED),
            c.METRICS_UNAVAILABLE: ("True", c.NO_ENGINE_METRICS),
        },
    ),
    (
        "prometheus-down-no-figure",
        {"readings": [], "metrics": PROMETHEUS_DOWN},
        "Error",
        {
            c.READY: ("False", "CapacityUnknown"),
            c.METRICS_UNAVAILABLE: ("True", c.PROMETHEUS_UNREACHABLE),
        },
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "phase", "expected"), [s[1:] for s in STATUS_CASES], ids=[s[0] for s in STATUS_CASES]
)
def test_build_pool_status(
    kwargs: dict[str, Any], phase: str, expected: dict[str, tuple[str, str]]
) -> None:
    obs, _ = _observe(**kwargs)
    status = build_pool_status(None, obs, kwargs.get("declared"))
    assert status.phase == phase
    assert status.observed_generation == 2 and status.revision == "rev1"
    conds = _conds(status)
    assert set(conds) == set(c.MODELPOOL_CONDITION_TYPES)
    for type_, want in expected.items():
        assert conds[type_] == want


def test_floor_too_small_message_names_the_tier() -> None:
    obs, _ = _observe([_reading("a", 2048)], peak=1)
    status = build_pool_status(None, obs, None)
    cond = c.find_condition(status.conditions, c.FLOOR_TOO_SMALL)
    assert cond is not None and "'eval'" in cond.message and "one p95 request" in cond.message
    assert status.plan is not None
    assert (status.plan.tiers[2].floor_tokens, status.plan.tiers[2].floor_slots) == (300, 25)


def test_failed_plan_keeps_the_last_plan() -> None:
    good, _ = _observe([_reading("a", 4096)])
    first = build_pool_status(None, good, None)
    failed, _ = _observe([], metrics=PROMETHEUS_DOWN)
    second = build_pool_status(first, failed, None)
    assert second.plan == first.plan is not None
    assert second.phase == "Error"


def test_missing_policy_keeps_everything_but_conditions() -> None:
    good, _ = _observe([_reading("a", 4096)])
    first = build_pool_status(None, good, None)
    missing = build_missing_policy_status(first, 3, "tiers", "t2")
    assert missing.plan == first.plan and missing.replicas == first.replicas
    assert _conds(missing)[c.READY] == ("False", c.TIER_POLICY_NOT_FOUND)
    assert missing.phase == "Error" and missing.observed_generation == 3


# --- plan_events ----------------------------------------------------------------------------


def test_events_for_scaling_capacity_short_and_measurement_change() -> None:
    obs, a = _observe([_reading("a", 4096)], peak=500, max_replicas=2)
    prior = ModelPoolStatus(replicas=ReplicaStatus(desired=1), capacity=_measured(8192, "rev1"))
    a = assess_capacity([_reading("a", 4096)], METRICS_OK, prior.capacity, "rev1", None, "t1")
    new = build_pool_status(prior, obs, None)
    reasons = [e.reason for e in plan_events(prior, new, a)]
    assert reasons == ["ScaledWarmReplicas", "CapacityShort", "MeasurementChanged"]
    again = plan_events(new, new, None)
    assert again == []


def test_events_for_warnings_fire_once_on_entering_the_state() -> None:
    obs, _ = _observe([], metrics=PROMETHEUS_DOWN, declared=4096)
    first = build_pool_status(None, obs, 4096)
    assert "MetricsUnavailable" in [e.reason for e in plan_events(None, first, None)]
    assert "MetricsUnavailable" not in [e.reason for e in plan_events(first, first, None)]
    missing = build_missing_policy_status(first, 1, "tiers", "t2")
    assert [e.reason for e in plan_events(first, missing, None)] == ["TierPolicyNotFound"]


# --- TierPolicy / TenantBudget status -------------------------------------------------------


@pytest.mark.parametrize(
    ("resolved", "expected"),
    [(True, ("True", c.SECRET_FOUND)), (False, ("False", c.SECRET_NOT_FOUND))],
    ids=["key-found", "key-missing"],
)
def test_budget_status_says_whether_the_key_resolved(
    resolved: bool, expected: tuple[str, str]
) -> None:
    status = build_budget_status(None, 4, [KeyLookup("acme-key", "api-key", resolved)], "t0")
    conds = {x.type: (x.status, x.reason) for x in status.conditions}
    assert conds == {c.KEY_RESOLVED: expected, c.READY: expected}
    assert status.observed_generation == 4


KEY_STATES = {
    "both-keys": ((True, True), ("True", c.SECRET_FOUND), "2 keys resolved"),
    "new-key-missing": (
        (True, False),
        ("True", c.SOME_SECRETS_NOT_FOUND),
        "1 of 2 keys resolved; key 'next' of Secret 's' not found",
    ),
    "no-key": ((False, False), ("False", c.SECRET_NOT_FOUND), "key 'api-key' of Secret 's'"),
}


@pytest.mark.parametrize(("found", "expected", "says"), KEY_STATES.values(), ids=KEY_STATES.keys())
def test_budget_status_during_a_key_rotation(
    found: tuple[bool, bool], expected: tuple[str, str], says: str
) -> None:
    keys = [KeyLookup("s", "api-key", found[0]), KeyLookup("s", "next", found[1])]

    status = build_budget_status(None, 1, keys, "t0")

    resolved = next(x for x in status.conditions if x.type == c.KEY_RESOLVED)
    assert (resolved.status, resolved.reason) == expected
    assert says in resolved.message
    ready = next(x for x in status.conditions if x.type == c.READY)
    assert ready.status == expected[0]


def test_budget_status_keeps_transition_time_while_unchanged() -> None:
    first = build_budget_status(None, 1, [KeyLookup("s", "k", False)], "t0")
    again = build_budget_status(first, 1, [KeyLookup("s", "k", False)], "t1")
    fixed = build_budget_status(again, 1, [KeyLookup("s", "k", True)], "t2")
    assert again == first
    assert {x.last_transition_time for x in fixed.conditions} == {"t2"}


def test_policy_status_counts_its_pools() -> None:
    status = build_policy_status(None, 2, 3, "t0")
    assert status.pools == 3 and status.observed_generation == 2
    assert [(x.type, x.status, x.reason) for x in status.conditions] == [
        (c.READY, "True", c.POLICY_READY)
    ]
    assert build_policy_status(status, 2, 3, "t1") == status


def test_rollout_merge_patch_clears_fields_but_sends_no_null_inside_list_items() -> None:
    # A pool without declared peaks has no requiredReplicas; an inconclusive gate no figure.
    # A merge patch deletes an object's field only when sent as null, but a list is replaced
    # whole: a null in its items would be stored as null (the CRD says integer / number).
    tier = TierPlanStatus(
        name="interactive", floor_tokens=10, floor_slots=1, lendable_tokens=5, lendable_slots=0
    )
    plan = PlanStatus(
        replicas=1,
        usable_kv_tokens_per_replica=1843,
        live_sequences_per_replica=8,
        total_tokens=1843,
        total_slots=8,
        shared_tokens=0,
        shared_slots=0,
        tiers=[tier],
    )
    gate = GateStatus(gate="ttftP95", verdict="Inconclusive", reason="Inconclusive", threshold=1.2)
    rollout = RolloutStatus(phase="Progressing", canary_plan=plan, gates=[gate])

    patch = rollout.to_merge_patch()

    assert patch["canaryRevision"] is None and patch["reason"] is None  # cleared if stored
    assert patch["canaryPlan"]["observedGeneration"] is None
    assert "requiredReplicas" not in patch["canaryPlan"]["tiers"][0]
    assert patch["canaryPlan"]["tiers"][0]["floorTokens"] == 10
    assert {"stable", "canary", "ratio"}.isdisjoint(patch["gates"][0])
    assert patch["gates"][0]["threshold"] == 1.2
