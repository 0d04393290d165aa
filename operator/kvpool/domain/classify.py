"""Classify a request into a tier: from the endpoint and the tenant, never from the caller.

Why this module exists: the tier decides who gets KV capacity first, so it must not be
something a client can choose. The gateway derives it from three facts it trusts - the
request path, the Host it was addressed to, and the authenticated tenant's labels - by
the TierPolicy's classification rules. A ``priority`` field or header sent by the client
is not an input here at all (the server strips it), so the verdict can only depend on
(path, host, tenant).

The rules (``CompiledTierPolicy.classification``), in order; every matcher a rule gives
must match; **the first matching rule wins**; a request no rule matches goes to the
**lowest tier** (the last one). Matchers:

- ``path_prefix``: plain string prefix of the request path (query string excluded),
  e.g. ``/v1/chat`` matches ``/v1/chat/completions``;
- ``host``: exact, case-insensitive, compared without the port (``API.example.com:443``
  matches ``api.example.com``);
- ``tenant_selector``: a Kubernetes label selector on the tenant's labels.

If the resulting tier is not in the tenant's allowed ``tiers``, the verdict is
:class:`TierForbidden` (the server answers 403). There is no silent fallback to another
tier: a tenant sending to an endpoint it has not paid for is told so.

Demotion (over budget with ``overBudget: Demote``) needs "the next lower tier this
tenant may use": :func:`decide_demotion`.

Worked example (tiers interactive > standard > batch)::

    rules: [{pathPrefix: /v1/chat, tenantSelector: {plan: gold}, tier: interactive},
            {host: batch.example.com, tier: batch}]
    tenant acme {plan: gold}, tiers [interactive, batch]
      POST /v1/chat/completions, Host api.example.com  -> Classified(interactive, rule 0)
      POST /v1/completions,      Host batch.example.com -> Classified(batch, rule 1)
      POST /v1/completions,      Host api.example.com   -> no rule: lowest tier batch,
                                                           Classified(batch, rule None)
    tenant zed {plan: free}, tiers [standard]
      POST /v1/completions,      Host api.example.com   -> TierForbidden(batch)
    decide_demotion(policy, acme, "interactive") -> Demoted(batch)   (standard not allowed)
    decide_demotion(policy, acme, "batch")       -> NoLowerTier
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.api.admission_config import (
    CompiledRule,
    CompiledTenant,
    CompiledTier,
    CompiledTierPolicy,
)

FORBIDDEN_STATUS = 403
REASON_TIER_NOT_ALLOWED = "tier_not_allowed"
REASON_NO_TIERS = "policy_has_no_tiers"


@dataclass(frozen=True)
class Classified:
    """The request's tier; ``rule_index`` is the matching rule, None when none matched."""

    tier: CompiledTier  # the resolved tier (carries rank, engine_priority, max wait, reclaim)
    rule_index: int | None  # index into policy.classification; None = default (lowest tier)


@dataclass(frozen=True)
class TierForbidden:
    """The rules put the request in a tier the tenant may not use: answer 403."""

    tier: str  # the tier the rules chose
    tenant: str  # the tenant that may not use it
    reason: str = REASON_TIER_NOT_ALLOWED  # constant for logs/metrics
    http_status: int = FORBIDDEN_STATUS

    @property
    def message(self) -> str:
        """A client-facing message (names the tier, not other tenants)."""
        return f"this API key may not use tier {self.tier!r} for this endpoint"


ClassifyVerdict = Classified | TierForbidden


@dataclass(frozen=True)
class Demoted:
    """The next lower tier the tenant may use."""

    tier: CompiledTier


@dataclass(frozen=True)
class NoLowerTier:
    """The tenant may use no tier below the current one: the server rejects (429)."""

    from_tier: str


DemotionVerdict = Demoted | NoLowerTier


def normalize_host(host: str | None) -> str | None:
    """The Host header as compared by rules: lower case, without port.

    >>> normalize_host("API.Example.com:8443")
    'api.example.com'
    >>> normalize_host("[::1]:8080")
    '::1'
    """
    if not host:
        return None
    host = host.strip().lower()
    if host.startswith("["):  # IPv6 literal, [addr]:port
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host or None


def rule_matches(rule: CompiledRule, path: str, host: str | None, labels: dict[str, str]) -> bool:
    """Whether every matcher the rule gives matches (``host`` already normalized)."""
    if rule.path_prefix is not None and not path.startswith(rule.path_prefix):
        return False
    if rule.host is not None and (host is None or rule.host.lower() != host):
        return False
    return rule.tenant_selector is None or rule.tenant_selector.matches(labels)


def _tier_by_name(tiers: Sequence[CompiledTier], name: str) -> CompiledTier | None:
    for tier in tiers:
        if tier.name == name:
            return tier
    return None


def _lowest(tiers: Sequence[CompiledTier]) -> CompiledTier:
    return max(tiers, key=lambda t: t.rank)


def decide_tier(
    policy: CompiledTierPolicy, tenant: CompiledTenant, path: str, host: str | None
) -> ClassifyVerdict:
    """The tier of a request, from (path, host, tenant) only; see the module docstring.

    ``path`` is the URL path without query string; ``host`` the raw Host header (port
    and case are normalized here). Raises ValueError if the policy has no tiers (the
    compiled config guarantees 1-4) or a rule names an unknown tier (the CRD forbids it).
    """
    if not policy.tiers:
        raise ValueError(f"tier policy {policy.name!r} has no tiers")
    norm_host = normalize_host(host)
    chosen: CompiledTier | None = None
    rule_index: int | None = None
    for index, rule in enumerate(policy.classification):
        if rule_matches(rule, path, norm_host, tenant.labels):
            chosen = _tier_by_name(policy.tiers, rule.tier)
            if chosen is None:
                raise ValueError(
                    f"rule {index} of {policy.name!r} names unknown tier {rule.tier!r}"
                )
            rule_index = index
            break
    if chosen is None:
        chosen = _lowest(policy.tiers)
    if chosen.name not in tenant.tiers:
        return TierForbidden(tier=chosen.name, tenant=tenant.tenant)
    return Classified(tier=chosen, rule_index=rule_index)


def decide_demotion(
    policy: CompiledTierPolicy, tenant: CompiledTenant, current: str
) -> DemotionVerdict:
    """The next lower tier (higher rank) than ``current`` that the tenant may use.

    Tiers are skipped if the tenant may not use them, e.g. tenant tiers
    [interactive, batch] demote interactive -> batch (not standard).
    """
    now_tier = _tier_by_name(policy.tiers, current)
    if now_tier is None:
        return NoLowerTier(from_tier=current)
    lower = sorted((t for t in policy.tiers if t.rank > now_tier.rank), key=lambda t: t.rank)
    for tier in lower:
        if tier.name in tenant.tiers:
            return Demoted(tier=tier)
    return NoLowerTier(from_tier=current)
