"""Classification: tier from path / host / tenant labels only; 403 and demotion verdicts."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.domain.classify import (
    Classified,
    Demoted,
    NoLowerTier,
    TierForbidden,
    decide_demotion,
    decide_tier,
    normalize_host,
)
from tests.builders import compiled_policy, compiled_rule, compiled_tenant

TIERS = ["interactive", "standard", "batch"]
POLICY = compiled_policy(
    TIERS,
    [
        compiled_rule("interactive", path_prefix="/v1/chat", labels={"plan": "gold"}),
        compiled_rule("batch", host="batch.example.com"),
        compiled_rule("standard", path_prefix="/v1/chat"),
    ],
)
GOLD = compiled_tenant("acme", ["interactive", "standard", "batch"], labels={"plan": "gold"})
FREE = compiled_tenant("zed", ["standard", "batch"], labels={"plan": "free"})
BATCH_ONLY = compiled_tenant("bulk", ["batch"])


@pytest.mark.parametrize(
    ("tenant", "path", "host", "tier", "rule"),
    [
        (GOLD, "/v1/chat/completions", "api.example.com", "interactive", 0),
        (FREE, "/v1/chat/completions", "api.example.com", "standard", 2),
        (GOLD, "/v1/completions", "batch.example.com", "batch", 1),
        (GOLD, "/v1/completions", "BATCH.example.com:443", "batch", 1),
        (GOLD, "/v1/completions", "api.example.com", "batch", None),
        (GOLD, "/v1/completions", None, "batch", None),
        (GOLD, "/v1/chat/completions", "batch.example.com", "interactive", 0),
        (FREE, "/v1/chat/completions", "batch.example.com", "batch", 1),
    ],
    ids=[
        "path-and-label",
        "path-only-rule-for-other-labels",
        "host",
        "host-case-and-port-ignored",
        "unmatched-goes-to-lowest",
        "no-host-header",
        "first-match-wins",
        "first-matching-rule-in-order",
    ],
)
def test_decide_tier_classifies(tenant, path, host, tier, rule) -> None:
    verdict = decide_tier(POLICY, tenant, path, host)
    assert verdict == Classified(tier=POLICY.tiers[TIERS.index(tier)], rule_index=rule)


@pytest.mark.parametrize(
    ("tenant", "path", "host", "tier"),
    [
        (BATCH_ONLY, "/v1/chat/completions", "api.example.com", "standard"),
        (FREE, "/v1/chat/completions", None, "standard"),
    ],
    ids=["batch-tenant-on-chat-endpoint", "allowed-standard"],
)
def test_tier_not_allowed_is_forbidden(tenant, path, host, tier) -> None:
    verdict = decide_tier(POLICY, tenant, path, host)
    if tier in tenant.tiers:
        assert isinstance(verdict, Classified)
        assert verdict.tier.name == tier
    else:
        assert verdict == TierForbidden(tier=tier, tenant=tenant.tenant)
        assert verdict.http_status == 403
        assert tenant.tenant not in verdict.message


def test_policy_without_rules_sends_everything_to_lowest_tier() -> None:
    policy = compiled_policy(TIERS)
    verdict = decide_tier(policy, GOLD, "/v1/chat/completions", "x")
    assert isinstance(verdict, Classified)
    assert verdict.tier.name == "batch"


@pytest.mark.parametrize(
    ("tenant", "current", "expected"),
    [
        (GOLD, "interactive", "standard"),
        (GOLD, "standard", "batch"),
        (GOLD, "batch", None),
        (compiled_tenant("skip", ["interactive", "batch"]), "interactive", "batch"),
        (compiled_tenant("top", ["interactive"]), "interactive", None),
        (GOLD, "no-such-tier", None),
    ],
    ids=["one-down", "to-lowest", "lowest-has-none", "skips-disallowed", "only-one", "unknown"],
)
def test_decide_demotion(tenant, current, expected) -> None:
    verdict = decide_demotion(POLICY, tenant, current)
    if expected is None:
        assert verdict == NoLowerTier(from_tier=current)
    else:
        assert isinstance(verdict, Demoted)
        assert verdict.tier.name == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("API.example.com", "api.example.com"),
        ("api.example.com:8443", "api.example.com"),
        ("[::1]:8080", "::1"),
        ("", None),
        (None, None),
    ],
    ids=["case", "port", "ipv6", "empty", "none"],
)
def test_normalize_host(raw, expected) -> None:
    assert normalize_host(raw) == expected


def test_rule_naming_unknown_tier_is_a_config_error() -> None:
    policy = compiled_policy(["a"], [compiled_rule("ghost", path_prefix="/")])
    with pytest.raises(ValueError, match="ghost"):
        decide_tier(policy, compiled_tenant("t", ["a"]), "/v1", None)


def test_verdict_inputs_are_path_host_and_tenant_only() -> None:
    """Caller-supplied priority cannot reach classification: it is not a parameter (the
    server strips ``priority`` from the body and priority-looking headers)."""
    assert list(inspect.signature(decide_tier).parameters) == ["policy", "tenant", "path", "host"]


def _oracle(path: str, host: str | None, labels: dict[str, str]) -> str:
    """The rules of POLICY written out by hand, first match wins."""
    host_norm = (host or "").split(":")[0].lower()
    if path.startswith("/v1/chat") and labels.get("plan") == "gold":
        return "interactive"
    if host_norm == "batch.example.com":
        return "batch"
    if path.startswith("/v1/chat"):
        return "standard"
    return "batch"


@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/chat"]),
    host=st.sampled_from([None, "api.example.com", "batch.example.com", "Batch.Example.com:80"]),
    plan=st.sampled_from([None, "gold", "free"]),
    priority=st.integers(min_value=-1000, max_value=1000),
)
def test_classification_matches_the_rules_whatever_priority_is_claimed(
    path, host, plan, priority
) -> None:
    labels = {"plan": plan} if plan else {}
    labels["priority"] = str(priority)  # even a label named priority carries no weight
    tenant = compiled_tenant("any", TIERS, labels=labels)
    verdict = decide_tier(POLICY, tenant, path, host)
    assert isinstance(verdict, Classified)
    assert verdict.tier.name == _oracle(path, host, labels)
