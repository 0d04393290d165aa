"""Which objects of a namespace the operator may act on and publish - and, if not, why.

Why it exists: an API server's schema and CEL rules are not a guarantee (older servers,
``--validate=false`` paths, objects stored before a CRD upgrade), so the operator runs
the checks of ``kvpool validate`` itself before it marks anything Ready, plans a pool or
compiles anything into ``kvpool-admission``. The checks that need only the object
(schema, CEL, the model, the semantic checks: :func:`kvpool.api.validation.check_custom_object`)
give a :class:`Checked`; this module adds the checks across objects and returns one
:class:`Verdict` per object:

- TierPolicy: ``Valid`` or ``InvalidSpec``;
- ModelPool: ``InvalidSpec`` (its own findings, a tier in ``capacity.peakConcurrency`` or
  ``rollout.canaryTiers`` its policy lacks, a ``model.servedName`` an older pool already
  serves), ``TierPolicyNotFound``, ``TierPolicyInvalid`` or ``Valid``;
- TenantBudget: ``InvalidSpec`` (its own findings, a tier its policy lacks, several
  policies and no ``tierPolicyRef``, a tenant id an older budget already claims),
  ``TierPolicyNotFound``, ``TierPolicyInvalid`` or ``Valid``.

When two objects claim one name (a served model name, a tenant id) the older one keeps
it (``creationTimestamp``, then name): a newcomer never takes traffic from a working pool.

Worked example: a ModelPool with ``peakConcurrency: {premium: 4}`` under a policy with
tiers ``interactive, batch`` gets ``Verdict("InvalidSpec", ...)`` whose message is
``spec.capacity.peakConcurrency.premium: tier 'premium' is not in TierPolicy 'tiers'
(tiers: batch, interactive)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.api.validation import (
    Finding,
    budget_tier_findings,
    pool_tier_findings,
    resolve_budget_policy,
)
from kvpool.domain import conditions as c

M = TypeVar("M", ModelPool, TierPolicy, TenantBudget)

VALID = "Valid"


@dataclass(frozen=True)
class Checked(Generic[M]):
    """One object after the checks that need nothing else."""

    name: str  # metadata.name
    created: str  # metadata.creationTimestamp ("" when unknown): older claims win
    model: M | None  # the parsed object; None when there is any finding
    findings: tuple[Finding, ...] = ()  # field path + reason, in path order


@dataclass(frozen=True)
class Verdict:
    """Whether the operator may use an object, with the reason and the findings if not."""

    reason: str  # Valid, InvalidSpec, TierPolicyNotFound, TierPolicyInvalid, DuplicateApiKey
    findings: tuple[Finding, ...] = ()

    @property
    def valid(self) -> bool:
        return self.reason == VALID

    @property
    def message(self) -> str:
        """Every finding as ``path: reason``, joined by ``; ``.

        >>> Verdict("InvalidSpec", (Finding("spec.a", "too big"), Finding("", "x"))).message
        'spec.a: too big; x'
        """
        return "; ".join(f"{f.path}: {f.reason}" if f.path else f.reason for f in self.findings)


def _invalid(*findings: Finding) -> Verdict:
    return Verdict(c.INVALID_SPEC, tuple(findings))


def first_claims(claims: Iterable[tuple[str, str, str]]) -> dict[str, str]:
    """For each claimed value, the name of its oldest claimant.

    ``claims`` are ``(value, created, name)``; the oldest ``created`` wins, then the name.

    >>> first_claims([("chat", "t2", "b"), ("chat", "t1", "c"), ("code", "t3", "a")])
    {'chat': 'c', 'code': 'a'}
    """
    owners: dict[str, tuple[str, str]] = {}
    for value, created, name in claims:
        if value not in owners or (created, name) < owners[value]:
            owners[value] = (created, name)
    return {value: owner[1] for value, owner in owners.items()}


def shared_keys(keys: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    """For each object whose key (any of them) another object has too, the others' names.

    One API key must identify one tenant: unlike a tenant id, where the oldest claim wins,
    a shared key is refused to every holder (the gateway could not tell them apart).

    >>> shared_keys({"alice": ["k1"], "zed": ["k1", "k2"], "bob": ["k3", "k3"]})
    {'alice': ('zed',), 'zed': ('alice',)}
    """
    holders: dict[str, set[str]] = {}
    for name, digests in keys.items():
        for digest in digests:
            holders.setdefault(digest, set()).add(name)
    shared: dict[str, set[str]] = {}
    for names in holders.values():
        for name in names if len(names) > 1 else ():
            shared.setdefault(name, set()).update(names - {name})
    return {name: tuple(sorted(others)) for name, others in sorted(shared.items())}


def _shared_key(others: Sequence[str]) -> Verdict:
    listed = ", ".join(f"TenantBudget {o!r}" for o in others)
    reason = (
        f"its API key is also the key of {listed}: one key must identify one tenant (the "
        "gateway could authenticate it as either), so neither is published"
    )
    return Verdict(c.DUPLICATE_API_KEY, (Finding("spec.apiKeySecretRef", reason),))


def served_names(pools: Iterable[Checked[ModelPool]]) -> dict[str, str]:
    """Served model name -> the pool that keeps it (among pools passing their own checks)."""
    return first_claims(
        (p.model.spec.model.served_name, p.created, p.name) for p in pools if p.model is not None
    )


def tenant_ids(budgets: Iterable[Checked[TenantBudget]]) -> dict[str, str]:
    """Tenant id -> the TenantBudget that keeps it (among budgets passing their own checks)."""
    return first_claims(
        (b.model.spec.tenant, b.created, b.name) for b in budgets if b.model is not None
    )


def assess_policy(policy: Checked[TierPolicy]) -> Verdict:
    """A TierPolicy stands alone: valid when its own checks pass."""
    return Verdict(VALID) if policy.model is not None else _invalid(*policy.findings)


def _policy_invalid(name: str, policy: Checked[TierPolicy]) -> Verdict:
    detail = "; ".join(f"{f.path}: {f.reason}" for f in policy.findings)
    return Verdict(
        c.TIER_POLICY_INVALID,
        (Finding("spec.tierPolicyRef.name", f"TierPolicy {name!r} is invalid ({detail})"),),
    )


def assess_pool(
    pool: Checked[ModelPool],
    policy: Checked[TierPolicy] | None,
    served_by: Mapping[str, str],
) -> Verdict:
    """A ModelPool against its TierPolicy and the other pools' served names."""
    if pool.model is None:
        return _invalid(*pool.findings)
    served = pool.model.spec.model.served_name
    owner = served_by.get(served, pool.name)
    if owner != pool.name:
        return _invalid(
            Finding(
                "spec.model.servedName",
                f"{served!r} is already served by ModelPool {owner!r} (the gateway routes by "
                "this name; the older pool keeps it)",
            )
        )
    ref = pool.model.spec.tier_policy_ref.name
    if policy is None:
        return Verdict(
            c.TIER_POLICY_NOT_FOUND,
            (Finding("spec.tierPolicyRef.name", f"TierPolicy {ref!r} not found"),),
        )
    if policy.model is None:
        return _policy_invalid(ref, policy)
    findings = pool_tier_findings(pool.model, policy.model)
    return _invalid(*findings) if findings else Verdict(VALID)


def assess_budget(
    budget: Checked[TenantBudget],
    policies: Mapping[str, Checked[TierPolicy]],
    tenant_of: Mapping[str, str],
) -> Verdict:
    """A TenantBudget against the namespace's policies and the other budgets' tenant ids."""
    if budget.model is None:
        return _invalid(*budget.findings)
    tenant = budget.model.spec.tenant
    owner = tenant_of.get(tenant, budget.name)
    if owner != budget.name:
        return _invalid(
            Finding(
                "spec.tenant", f"tenant {tenant!r} is already claimed by TenantBudget {owner!r}"
            )
        )
    ref = budget.model.spec.tier_policy_ref
    if ref is not None and ref.name not in policies:
        return Verdict(
            c.TIER_POLICY_NOT_FOUND,
            (Finding("spec.tierPolicyRef.name", f"TierPolicy {ref.name!r} not found"),),
        )
    if ref is None and not policies:
        return Verdict(
            c.TIER_POLICY_NOT_FOUND,
            (Finding("spec.tierPolicyRef", "no TierPolicy in the namespace"),),
        )
    named = ref.name if ref is not None else (next(iter(policies)) if len(policies) == 1 else None)
    if named is not None and policies[named].model is None:
        return _policy_invalid(named, policies[named])
    valid = {name: p.model for name, p in policies.items() if p.model is not None}
    found = resolve_budget_policy(budget.model, valid)
    if isinstance(found, Finding):
        return _invalid(found)
    findings = budget_tier_findings(budget.model, found)
    return _invalid(*findings) if findings else Verdict(VALID)


@dataclass(frozen=True)
class NamespaceVerdicts:
    """A verdict per object of one namespace, by kind and name."""

    policies: dict[str, Verdict]
    pools: dict[str, Verdict]
    budgets: dict[str, Verdict]


def assess_namespace(
    pools: Iterable[Checked[ModelPool]],
    policies: Iterable[Checked[TierPolicy]],
    budgets: Iterable[Checked[TenantBudget]],
    key_digests: Mapping[str, Sequence[str]] | None = None,
) -> NamespaceVerdicts:
    """Every object of a namespace (objects being deleted left out by the caller).

    ``key_digests`` are each TenantBudget's resolved API key digests, by name: a budget
    that would be published with a key another such budget has too is refused
    (``DuplicateApiKey``, naming the others), and so are the others."""
    pools, budgets = list(pools), list(budgets)
    by_name = {p.name: p for p in policies}
    served, tenants = served_names(pools), tenant_ids(budgets)
    budget_verdicts = {b.name: assess_budget(b, by_name, tenants) for b in budgets}
    publishable = {
        name: digests
        for name, digests in (key_digests or {}).items()
        if name in budget_verdicts and budget_verdicts[name].reason != c.INVALID_SPEC
    }
    for name, others in shared_keys(publishable).items():
        budget_verdicts[name] = _shared_key(others)
    return NamespaceVerdicts(
        policies={name: assess_policy(p) for name, p in by_name.items()},
        pools={
            p.name: assess_pool(
                p,
                by_name.get(p.model.spec.tier_policy_ref.name) if p.model is not None else None,
                served,
            )
            for p in pools
        },
        budgets=budget_verdicts,
    )
