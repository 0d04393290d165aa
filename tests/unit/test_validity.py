"""The operator's verdicts on objects (domain/validity) and fail-static config (domain/fail_static).

Tables of cases with ids; objects are built with the test builders and checked with the
same single-object checks ``kvpool validate`` runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.api.admission_config import AdmissionConfig, CompiledTierPolicy
from kvpool.api.validation import check_custom_object
from kvpool.domain import conditions as c
from kvpool.domain.fail_static import keep_last_good
from kvpool.domain.pool_status import build_blocked_status
from kvpool.domain.side_statuses import KeyLookup, build_budget_status, build_policy_status
from kvpool.domain.status_events import status_events
from kvpool.domain.validity import (
    Checked,
    Verdict,
    assess_namespace,
    first_claims,
    shared_keys,
)
from tests.builders import (
    declared_modelpool_manifest,
    standard_admission_config,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
    tierpolicy_manifest,
)


def checked(doc: dict[str, Any], created: str = "t0") -> Checked[Any]:
    model, findings = check_custom_object(doc)
    return Checked(doc["metadata"]["name"], created, None if findings else model, tuple(findings))


def _served_twice() -> dict[str, Any]:
    doc = declared_modelpool_manifest("newer").dict()
    doc["spec"]["model"]["servedName"] = "chat"
    return doc


POOL_CASES = [
    (
        "valid",
        declared_modelpool_manifest().dict(),
        [standard_tierpolicy_manifest().dict()],
        "Valid",
        "",
    ),
    (
        "peak-names-unknown-tier",
        declared_modelpool_manifest().peak(premium=3).dict(),
        [standard_tierpolicy_manifest().dict()],
        "InvalidSpec",
        "spec.capacity.peakConcurrency.premium: tier 'premium' is not in TierPolicy 'tiers' "
        "(tiers: batch, eval, interactive)",
    ),
    (
        "policy-missing",
        declared_modelpool_manifest().dict(),
        [],
        "TierPolicyNotFound",
        "'tiers' not found",
    ),
    (
        "policy-invalid",
        declared_modelpool_manifest().dict(),
        [tierpolicy_manifest().tier("interactive", floor=70).tier("batch", floor=40).dict()],
        "TierPolicyInvalid",
        "TierPolicy 'tiers' is invalid (spec.tiers: the floors of all tiers",
    ),
    (
        "own-schema-error-first",
        declared_modelpool_manifest().engine(maxModelLen="big").dict(),
        [],
        "InvalidSpec",
        "spec.engine.maxModelLen: must be an integer (got 'big')",
    ),
    (
        "served-name-taken-by-an-older-pool",
        _served_twice(),
        [standard_tierpolicy_manifest().dict()],
        "InvalidSpec",
        "spec.model.servedName: 'chat' is already served by ModelPool 'chat'",
    ),
]


@pytest.mark.parametrize(
    ("pool", "policies", "reason", "message"),
    [c[1:] for c in POOL_CASES],
    ids=[c[0] for c in POOL_CASES],
)
def test_pool_verdicts(
    pool: dict[str, Any], policies: list[dict[str, Any]], reason: str, message: str
) -> None:
    others = (
        [checked(declared_modelpool_manifest().dict(), "t0")]
        if pool["metadata"]["name"] == "newer"
        else []
    )
    verdicts = assess_namespace([*others, checked(pool, "t1")], [checked(p) for p in policies], [])
    verdict = verdicts.pools[pool["metadata"]["name"]]
    assert verdict.reason == reason
    assert message in verdict.message


def _two_policies() -> list[dict[str, Any]]:
    other = standard_tierpolicy_manifest().dict()
    other["metadata"]["name"] = "other"
    return [standard_tierpolicy_manifest().dict(), other]


BUDGET_CASES = [
    (
        "valid",
        tenantbudget_manifest("acme").tiers("batch").dict(),
        [standard_tierpolicy_manifest().dict()],
        "Valid",
        "",
    ),
    (
        "tier-not-in-policy",
        tenantbudget_manifest("acme").tiers("batch", "gold").dict(),
        [standard_tierpolicy_manifest().dict()],
        "InvalidSpec",
        "spec.tiers[1]: tier 'gold' is not in TierPolicy 'tiers'",
    ),
    (
        "several-policies-and-no-ref",
        tenantbudget_manifest("acme").dict(),
        _two_policies(),
        "InvalidSpec",
        "spec.tierPolicyRef: required: namespace 'default' has 2 TierPolicies",
    ),
    (
        "several-policies-with-ref",
        tenantbudget_manifest("acme").policy("other").dict(),
        _two_policies(),
        "Valid",
        "",
    ),
    (
        "ref-names-missing-policy",
        tenantbudget_manifest("acme").policy("nope").dict(),
        [standard_tierpolicy_manifest().dict()],
        "TierPolicyNotFound",
        "'nope' not found",
    ),
    (
        "only-policy-invalid",
        tenantbudget_manifest("acme").dict(),
        [tierpolicy_manifest().tier("interactive", floor=-1).dict()],
        "TierPolicyInvalid",
        "spec.tiers[0].floorPercent",
    ),
]


@pytest.mark.parametrize(
    ("budget", "policies", "reason", "message"),
    [c[1:] for c in BUDGET_CASES],
    ids=[c[0] for c in BUDGET_CASES],
)
def test_budget_verdicts(
    budget: dict[str, Any], policies: list[dict[str, Any]], reason: str, message: str
) -> None:
    verdicts = assess_namespace([], [checked(p) for p in policies], [checked(budget)])
    verdict = verdicts.budgets["acme"]
    assert (verdict.reason, message in verdict.message) == (reason, True)


def test_a_tenant_id_stays_with_its_oldest_budget() -> None:
    newer = tenantbudget_manifest("acme2").spec(tenant="acme").dict()
    verdicts = assess_namespace(
        [],
        [checked(standard_tierpolicy_manifest().dict())],
        [checked(newer, "t2"), checked(tenantbudget_manifest("acme").dict(), "t1")],
    )
    assert verdicts.budgets["acme"].valid
    assert verdicts.budgets["acme2"].message.startswith("spec.tenant: tenant 'acme' is already")


@pytest.mark.parametrize(
    ("claims", "owners"),
    [
        ([("m", "t2", "b"), ("m", "t1", "z")], {"m": "z"}),
        ([("m", "t1", "b"), ("m", "t1", "a")], {"m": "a"}),
        ([("m", "", "b"), ("n", "t9", "b")], {"m": "b", "n": "b"}),
    ],
    ids=["older-wins", "same-time-name-decides", "one-each"],
)
def test_first_claims(claims: list[tuple[str, str, str]], owners: dict[str, str]) -> None:
    assert first_claims(claims) == owners


# --- fail-static ---------------------------------------------------------------------------


def _config(*pools: str, policies: tuple[str, ...] = ("tiers",)) -> AdmissionConfig:
    base = standard_admission_config(["http://127.0.0.1:1"]).obj()
    template = base.pools[0]
    policy = base.tier_policies[0]
    return base.model_copy(
        update={
            "pools": [template.model_copy(update={"name": p, "served_name": p}) for p in pools],
            "tier_policies": [policy.model_copy(update={"name": n}) for n in policies],
        }
    )


KEEP_CASES = [
    ("nothing-held", _config("a"), {}, {}, ["a"], ["tiers"], []),
    ("deleted-policy-kept", _config("a", policies=()), {"tiers": "gone"}, {}, ["a"], ["tiers"],
     ["tiers"]),
    ("invalid-pool-kept", _config(), {}, {"a": "bad"}, ["a"], ["tiers"], ["a"]),
    ("never-published-not-invented", _config(), {"x": "gone"}, {"zz": "bad"}, [], ["tiers"], []),
    ("current-entry-wins", _config("a"), {"tiers": "bad"}, {"a": "bad"}, ["a"], ["tiers"], []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "policies", "pools", "want_pools", "want_policies", "stale"),
    [c[1:] for c in KEEP_CASES],
    ids=[c[0] for c in KEEP_CASES],
)
def test_keep_last_good(
    config: AdmissionConfig,
    policies: dict[str, str],
    pools: dict[str, str],
    want_pools: list[str],
    want_policies: list[str],
    stale: list[str],
) -> None:
    previous = _config("a")
    kept = keep_last_good(config, previous, policies, pools)
    assert [p.name for p in kept.pools] == want_pools
    assert [p.name for p in kept.tier_policies] == want_policies
    entries: list[Any] = [*kept.pools, *kept.tier_policies]
    assert sorted(e.name for e in entries if e.stale) == stale
    assert all(e.stale_reason for e in entries if e.stale)


def test_a_kept_pool_never_shadows_a_current_pool_serving_its_name() -> None:
    current = _config("b")
    current = current.model_copy(
        update={"pools": [current.pools[0].model_copy(update={"served_name": "a"})]}
    )
    assert [p.name for p in keep_last_good(current, _config("a"), {}, {"a": "bad"}).pools] == ["b"]


def test_stale_fields_are_absent_from_a_current_config() -> None:
    assert "stale" not in _config("a").to_json()
    assert isinstance(_config().tier_policies[0], CompiledTierPolicy)


# --- statuses and events -------------------------------------------------------------------


def test_blocked_status_keeps_the_plan_and_says_it_is_stale() -> None:
    from kvpool.api.modelpool import ModelPoolStatus, PlanStatus

    plan = PlanStatus(
        replicas=2,
        usable_kv_tokens_per_replica=1,
        live_sequences_per_replica=1,
        total_tokens=2,
        total_slots=2,
        shared_tokens=0,
        shared_slots=0,
        observed_generation=1,
    )
    status = build_blocked_status(ModelPoolStatus(plan=plan), 2, c.INVALID_SPEC, "spec.x: y", "t")
    conds = {x.type: (x.status, x.reason) for x in status.conditions}
    assert status.plan == plan and status.observed_generation == 2
    assert conds[c.CONFIG_STALE] == ("True", c.KEPT_LAST_GOOD)
    assert "generation 1" in next(x.message for x in status.conditions if x.type == c.CONFIG_STALE)


@pytest.mark.parametrize(
    ("before", "after", "events"),
    [
        (None, ("False", "InvalidSpec", "a: b"), ["InvalidSpec"]),
        (("False", "InvalidSpec", "a: b"), ("False", "InvalidSpec", "a: b"), []),
        (("False", "InvalidSpec", "a: b"), ("False", "InvalidSpec", "c: d"), ["InvalidSpec"]),
        (("True", "PolicyReady", ""), ("False", "TierPolicyInvalid", "x"), ["TierPolicyInvalid"]),
        (("False", "InvalidSpec", "a: b"), ("True", "PolicyReady", ""), []),
    ],
    ids=["enters", "stays", "new-finding", "policy-invalid", "recovers"],
)
def test_status_events(
    before: tuple[Any, str, str] | None, after: tuple[Any, str, str], events: list[str]
) -> None:
    prior = c.set_condition([], c.READY, *before, 1, "t0") if before else []
    new = c.set_condition(prior, c.READY, *after, 1, "t1")
    assert [e.reason for e in status_events(prior, new)] == events
    assert all(e.type == "Warning" for e in status_events(prior, new))


def test_policy_status_says_invalid_or_in_use() -> None:
    bad = Verdict(c.INVALID_SPEC, ())
    invalid = build_policy_status(None, 1, 0, "t0", bad)
    assert (invalid.conditions[0].status, invalid.conditions[0].reason) == ("False", "InvalidSpec")
    waiting = build_policy_status(None, 1, 2, "t0", Verdict("Valid"), ["b", "a"])
    assert waiting.conditions[0].reason == c.POLICY_IN_USE
    assert waiting.conditions[0].message.endswith("a, b")


def test_budget_status_invalid_spec_wins_over_a_resolved_key() -> None:
    status = build_budget_status(
        None, 1, [KeyLookup("s", "k", True)], "t0", Verdict(c.INVALID_SPEC, ())
    )
    conds = {x.type: (x.status, x.reason) for x in status.conditions}
    assert conds == {c.KEY_RESOLVED: ("True", c.SECRET_FOUND), c.READY: ("False", "InvalidSpec")}


SHARED_KEY_CASES = [
    pytest.param(
        {"alice": ["k1"], "zed": ["k1"]},
        {"alice": ("zed",), "zed": ("alice",)},
        id="one-key-two-tenants",
    ),
    pytest.param(
        {"alice": ["k1", "k2"], "zed": ["k2"], "bob": ["k1"]},
        {"alice": ("bob", "zed"), "bob": ("alice",), "zed": ("alice",)},
        id="a-second-key-shared",
    ),
    pytest.param({"alice": ["k1", "k1"], "zed": ["k2"]}, {}, id="one-tenant-twice-the-same-key"),
    pytest.param({}, {}, id="none"),
]


@pytest.mark.parametrize(("keys", "expected"), SHARED_KEY_CASES)
def test_shared_keys(keys: dict[str, list[str]], expected: dict[str, tuple[str, ...]]) -> None:
    assert shared_keys(keys) == expected
