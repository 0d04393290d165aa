"""Compiling pools, policies and tenants into the gateway's admission config."""

from __future__ import annotations

import hashlib
import json

import pytest

from kvpool.api.admission_config import AdmissionConfig, Endpoint
from kvpool.domain.api_keys import api_key_digest
from kvpool.domain.compile import (
    SKIPPED_NO_KEY,
    PodView,
    PoolInput,
    TenantInput,
    build_admission_config,
    build_endpoints,
    config_hash,
    parse_static_endpoints,
)
from kvpool.domain.planner import PoolPlan, plan_pool
from kvpool.domain.revision import revision_of
from tests.builders import (
    modelpool_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
    tierpolicy_manifest,
)


def _pool_input(
    name: str = "chat", planned: bool = True, endpoints: tuple[Endpoint, ...] = ()
) -> PoolInput:
    pool = modelpool_manifest(name).peak(interactive=60).capacity(kvTokensPerReplica=200_000).obj()
    plan = plan_pool(pool, standard_tierpolicy_manifest().obj(), None)
    assert isinstance(plan, PoolPlan)
    return PoolInput(
        pool=pool,
        plan=plan.to_status() if planned else None,
        revision=revision_of(pool.spec),
        endpoints=endpoints,
    )


def _tenant(tenant: str, key: str | None = "sk-1", **policy: str) -> TenantInput:
    builder = (
        tenantbudget_manifest(tenant)
        .tiers("interactive", "batch")
        .limit("1h", 10_000, 100)
        .limit("1d", 50_000)
    )
    if policy:
        builder = builder.policy(policy["policy"])
    return TenantInput(budget=builder.obj(), key_sha256s=(api_key_digest(key) if key else None,))


def test_pool_plan_numbers_pass_through_unchanged() -> None:
    item = _pool_input()
    config = build_admission_config(
        "default", [item], [standard_tierpolicy_manifest().obj()], []
    ).config
    pool = config.pools[0]
    plan = item.plan
    assert plan is not None
    assert (pool.replicas, pool.tokens_per_replica, pool.slots_per_replica) == (
        plan.replicas,
        plan.usable_kv_tokens_per_replica,
        plan.slots_per_replica,
    )
    assert (pool.total_tokens, pool.shared_tokens, pool.shared_slots) == (
        plan.total_tokens,
        plan.shared_tokens,
        plan.shared_slots,
    )
    assert {name: a.floor_tokens for name, a in pool.tiers.items()} == {
        t.name: t.floor_tokens for t in plan.tiers
    }
    assert pool.plan_ok and pool.served_name == "chat" and pool.tier_policy == "tiers"
    assert pool.tracks[0].name == "stable" and pool.tracks[0].weight == 100


def test_pool_without_a_plan_admits_nothing() -> None:
    pool = build_admission_config("default", [_pool_input(planned=False)], [], []).config.pools[0]
    assert not pool.plan_ok and pool.total_tokens == 0 and pool.tiers == {}


def test_policy_is_resolved_to_ranks_seconds_and_engine_priorities() -> None:
    policy = (
        tierpolicy_manifest("p")
        .tier("interactive", floor=50, max_wait="2s", ttftP95Target="500ms")
        .tier(
            "batch",
            floor=30,
            lend=50,
            max_wait="10m",
            enginePriority=7,
            reclaim="Preempt",
            budgetUnavailable="Reject",
        )
        .rule("batch", pathPrefix="/v1/completions")
        .obj()
    )
    compiled = build_admission_config("default", [], [policy], []).config.tier_policies[0]
    assert [(t.name, t.rank, t.engine_priority) for t in compiled.tiers] == [
        ("interactive", 0, 0),
        ("batch", 1, 7),
    ]
    assert compiled.tiers[0].max_queue_wait_seconds == 2.0
    assert compiled.tiers[0].ttft_p95_target_seconds == 0.5
    assert compiled.tiers[1].max_queue_wait_seconds == 600.0
    assert compiled.tiers[1].reclaim == "Preempt" and compiled.tiers[1].lend_percent == 50
    # Redis-down behaviour: declared on batch, left to the gateway's flag on interactive
    assert [t.budget_unavailable for t in compiled.tiers] == [None, "Reject"]
    assert compiled.classification[0].path_prefix == "/v1/completions"


def test_tenants_carry_a_key_digest_never_the_key() -> None:
    config = build_admission_config(
        "default", [], [standard_tierpolicy_manifest().obj()], [_tenant("acme", "sk-secret")]
    ).config
    tenant = config.tenants[0]
    assert tenant.key_sha256 == hashlib.sha256(b"sk-secret").hexdigest()
    assert "sk-secret" not in config.to_json()
    assert [(w.window_seconds, w.tokens, w.requests) for w in tenant.limits] == [
        (3600.0, 10_000, 100),
        (86400.0, 50_000, None),
    ]
    assert (
        tenant.tiers == ["interactive", "batch"]
        and tenant.weight == 1
        and tenant.over_budget == "Reject"
    )


A, B = api_key_digest("sk-old"), api_key_digest("sk-new")
KEY_SETS = {
    "one-key": ((A,), A, None),
    "rotation-both-resolved": ((A, B), A, [B]),
    "new-key-not-created-yet": ((A, None), A, None),
    "old-key-secret-gone": ((None, B), B, None),
    "same-key-twice": ((A, A), A, None),
}


@pytest.mark.parametrize(("digests", "first", "more"), KEY_SETS.values(), ids=KEY_SETS.keys())
def test_every_resolved_key_of_a_tenant_is_compiled_first_reference_first(
    digests: tuple[str | None, ...], first: str, more: list[str] | None
) -> None:
    budget = tenantbudget_manifest("acme").tiers("interactive").obj()

    (tenant,) = build_admission_config(
        "default", [], [], [TenantInput(budget, digests)]
    ).config.tenants

    assert (tenant.key_sha256, tenant.additional_key_sha256) == (first, more)
    assert tenant.key_digests() == (first, *(more or []))


def test_a_single_key_tenant_compiles_to_the_same_document_as_before() -> None:
    config = build_admission_config("default", [], [], [_tenant("acme")]).config

    assert "additionalKeySha256" not in config.to_json()


def test_tenant_without_a_resolvable_key_is_left_out_and_reported() -> None:
    compiled = build_admission_config(
        "default", [], [], [_tenant("acme"), _tenant("ghost", key=None)]
    )
    assert [t.tenant for t in compiled.config.tenants] == ["acme"]
    assert compiled.skipped == (("ghost", SKIPPED_NO_KEY),)


@pytest.mark.parametrize(
    ("policies", "ref", "expected"),
    [(["only"], None, "only"), (["a", "b"], None, None), (["a", "b"], "b", "b")],
    ids=["the-only-policy", "ambiguous", "explicit-ref"],
)
def test_tenant_policy_resolution(
    policies: list[str], ref: str | None, expected: str | None
) -> None:
    objs = [
        tierpolicy_manifest(n).tier("interactive", floor=50).tier("batch", floor=10).obj()
        for n in policies
    ]
    tenant = _tenant("acme", policy=ref) if ref else _tenant("acme")
    assert (
        build_admission_config("default", [], objs, [tenant]).config.tenants[0].tier_policy
        == expected
    )


def test_output_is_deterministic_and_hash_ignores_generated_at() -> None:
    pools = [_pool_input("b"), _pool_input("a")]
    tenants = [_tenant("zed", "k1"), _tenant("acme", "k2")]
    one = build_admission_config(
        "ns", pools, [standard_tierpolicy_manifest().obj()], tenants, generated_at="t1"
    ).config
    two = build_admission_config(
        "ns", pools[::-1], [standard_tierpolicy_manifest().obj()], tenants[::-1], generated_at="t2"
    ).config
    assert [p.name for p in one.pools] == ["a", "b"]
    assert [t.tenant for t in one.tenants] == ["acme", "zed"]
    assert config_hash(one) == config_hash(two)
    assert one.to_json() != two.to_json()  # generatedAt differs
    changed = build_admission_config(
        "ns", pools[:1], [standard_tierpolicy_manifest().obj()], tenants
    ).config
    assert config_hash(changed) != config_hash(one)


def test_the_json_round_trips_through_the_contract() -> None:
    config = build_admission_config(
        "ns",
        [_pool_input()],
        [standard_tierpolicy_manifest().obj()],
        [_tenant("acme")],
        generated_at="2026-01-01T00:00:00Z",
    ).config
    text = config.to_json()
    assert json.loads(text)["formatVersion"] == 1
    assert AdmissionConfig.model_validate_json(text) == config


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([PodView("p-1", "10.0.0.7", True, "stable")], [("p-1", "http://10.0.0.7:8000", True)]),
        ([PodView("p-1", None, False, "stable")], []),
        ([PodView("p-1", "10.0.0.7", True, "canary")], []),
        (
            [
                PodView("p-2", "10.0.0.8", False, "stable"),
                PodView("p-1", "10.0.0.7", True, "stable"),
            ],
            [("p-1", "http://10.0.0.7:8000", True), ("p-2", "http://10.0.0.8:8000", False)],
        ),
    ],
    ids=["ready-pod", "pending-without-ip", "other-track", "sorted-with-readiness"],
)
def test_endpoints_from_pods(pods: list[PodView], expected: list[tuple[str, str, bool]]) -> None:
    assert [(e.name, e.url, e.ready) for e in build_endpoints(pods, 8000, "stable")] == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8001", [("static-0", "http://127.0.0.1:8001")]),
        ("a=http://h:1/, b=http://h:2", [("a", "http://h:1"), ("b", "http://h:2")]),
        ("  ", []),
    ],
    ids=["one-url", "named-comma-separated", "empty"],
)
def test_static_endpoints_annotation(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(e.name, e.url) for e in parse_static_endpoints(text)] == expected
