"""A table of invalid kvpool objects, each a small change to a valid baseline.

Shared by the operator's tests (written straight into storage, the operator must flag and
never publish them) and the emulator's (``kubectl apply`` must be refused, as
``kvpool validate`` refuses them). The baseline is ``standard_tierpolicy_manifest()`` (``tiers``:
interactive, batch, eval), the pool ``chat`` and the tenant ``acme``.

Each case names the object it breaks (kind and name), the field path the operator's
message must carry, and the reason the affected object gets (a pool whose TierPolicy is
invalid is ``TierPolicyInvalid``; the policy itself is ``InvalidSpec``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.builders import (
    ModelPoolManifestBuilder,
    declared_modelpool_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
    tierpolicy_manifest,
)


def baseline_pool(name: str = "chat") -> ModelPoolManifestBuilder:
    """The valid pool of the operator tests."""
    return declared_modelpool_manifest(name)


@dataclass(frozen=True)
class InvalidCase:
    """One invalid object and what must be said about it."""

    id: str
    kind: str  # TierPolicy, ModelPool or TenantBudget
    body: dict[str, Any]  # the invalid object (namespace default)
    path: str  # the field path the finding names
    reason: str  # the finding's reason (its start, when it goes on)
    server_rejects: bool = True  # False: a rule across objects or beyond CEL (an API
    # server accepts the object; kvpool validate and the operator refuse it)
    # where an API server says it, when kvpool says it more precisely (a CEL rule over a
    # whole list names the values; kvpool names each entry at fault by its index)
    server_path: str | None = None
    server_reason: str | None = None


def _policy_rule_unknown_tier() -> dict[str, Any]:
    return standard_tierpolicy_manifest().rule("gold", pathPrefix="/v1/gold").dict()


def _pool_canary_tiers(*tiers: str) -> dict[str, Any]:
    doc: dict[str, Any] = baseline_pool().dict()
    doc["spec"]["rollout"] = {"canaryTiers": list(tiers)}
    return doc


INVALID_CASES: tuple[InvalidCase, ...] = (
    InvalidCase(
        "policy-floors-over-100",
        "TierPolicy",
        tierpolicy_manifest().tier("interactive", floor=60).tier("batch", floor=50).dict(),
        "spec.tiers",
        "the floors of all tiers (floorPercent) must sum to at most 100, not 110",
    ),
    InvalidCase(
        "policy-rule-names-unknown-tier",
        "TierPolicy",
        _policy_rule_unknown_tier(),
        "spec.classification[0].tier",
        "tier 'gold' is not in spec.tiers (tiers: batch, eval, interactive)",
        server_path="spec.classification",
        server_reason="every classification rule must name a tier defined in spec.tiers "
        "(interactive, batch, eval); not defined: gold",
    ),
    InvalidCase(
        "policy-negative-floor",
        "TierPolicy",
        tierpolicy_manifest().tier("interactive", floor=-5).tier("batch", floor=30).dict(),
        "spec.tiers[0].floorPercent",
        "must be at least 0 (got -5)",
    ),
    InvalidCase(
        "pool-peak-names-unknown-tier",
        "ModelPool",
        baseline_pool().peak(interactive=6, premium=4).dict(),
        "spec.capacity.peakConcurrency.premium",
        "tier 'premium' is not in TierPolicy 'tiers'",
        server_rejects=False,
    ),
    InvalidCase(
        "pool-canary-names-unknown-tier",
        "ModelPool",
        _pool_canary_tiers("gold"),
        "spec.rollout.canaryTiers[0]",
        "tier 'gold' is not in TierPolicy 'tiers'",
        server_rejects=False,
    ),
    InvalidCase(
        "pool-max-model-len-not-a-number",
        "ModelPool",
        baseline_pool().engine(maxModelLen="big").dict(),
        "spec.engine.maxModelLen",
        "must be an integer (got 'big')",
    ),
    InvalidCase(
        "pool-p95-below-mean",
        "ModelPool",
        baseline_pool().lengths((100, 50), (50, 100)).dict(),
        "spec.workload.promptTokens.p95",
        "p95 (50) must be greater than or equal to mean (100)",
    ),
    InvalidCase(
        "budget-names-unknown-tier",
        "TenantBudget",
        tenantbudget_manifest("acme").tiers("interactive", "gold").limit("1h", 10_000).dict(),
        "spec.tiers[1]",
        "tier 'gold' is not in TierPolicy 'tiers'",
        server_rejects=False,
    ),
    InvalidCase(
        "budget-same-window-twice",
        "TenantBudget",
        tenantbudget_manifest("acme").tiers("interactive").limit("1h", 10).limit("60m", 5).dict(),
        "spec.limits[1].window",
        "'60m' is the same window as spec.limits[0].window",
        server_rejects=False,
    ),
)
PLURALS = {"TierPolicy": "tierpolicies", "ModelPool": "modelpools", "TenantBudget": "tenantbudgets"}
