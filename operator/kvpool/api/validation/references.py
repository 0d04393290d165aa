"""Rules across objects: references must resolve within the manifests given, per namespace.

A real cluster would accept a ModelPool whose TierPolicy does not exist yet; the operator
would then report it as not Ready. ``kvpool validate`` sees the whole set a user is about
to apply, so it reports a dangling reference before anything is applied:

- ModelPool ``tierPolicyRef`` names a TierPolicy of its namespace; the tiers named in
  ``capacity.peakConcurrency`` and ``rollout.canaryTiers`` are tiers of that policy;
- TenantBudget ``tiers`` are tiers of its ``tierPolicyRef`` policy or, without a ref, of
  the namespace's only TierPolicy (several policies and no ref is ambiguous);
- each TenantBudget key reference (``apiKeySecretRef``, ``apiKeySecretRefs[i]``) names a
  Secret that has the key and the label
  ``kvpool.dev/api-key`` (the operator reads no other Secret). A Secret that is not in
  the set at all is a *warning*: GitOps repositories often leave Secrets to External
  Secrets or SOPS, so only the cluster can have it (``kvpool validate
  --require-secrets`` makes it an error);
- no two objects of a kind share a namespace and name, no two TenantBudgets share a
  tenant id, no two ModelPools serve the same model name (the gateway routes by it).

A reference to an object that is in the set but invalid gives no problem here: the
object's own problems say what to fix, and one bad TierPolicy must not add a line for
every pool and tenant that uses it.

Objects without a namespace are in ``default``. Worked example: a ModelPool in ``default``
with ``tierPolicyRef: {name: tiers}`` and no TierPolicy ``tiers`` in ``default`` gives
``spec.tierPolicyRef.name: TierPolicy 'tiers' not found in namespace 'default'``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from kvpool.api.common import SecretKeyReference
from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import API_KEY_SECRET_LABEL, TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.api.validation.results import DEFAULT_NAMESPACE, Finding, Problem, SecretData

T = TypeVar("T")


@dataclass(frozen=True)
class Located(Generic[T]):
    """An object and the file it came from."""

    source: str  # file name, as the user gave it
    obj: T  # the parsed object


@dataclass(frozen=True)
class References:
    """What the checks across objects found: problems, and warnings a cluster may resolve."""

    problems: list[Problem]
    warnings: list[Problem]


Invalid = frozenset[tuple[str, str, str]] | set[tuple[str, str, str]]  # (kind, ns, name)
KeyDigest = Callable[[str], str]  # an API key's value -> what the gateway compares


def _namespace(obj: ModelPool | TierPolicy | TenantBudget) -> str:
    return obj.metadata.namespace or DEFAULT_NAMESPACE


def _names(items: Iterable[str]) -> str:
    listed = sorted(items)
    return ", ".join(listed) if listed else "none"


def _problem(item: Located[ModelPool] | Located[TenantBudget], path: str, reason: str) -> Problem:
    return Problem(item.source, item.obj.kind, item.obj.metadata.name, path, reason)


def _duplicates(
    items: Sequence[Located[ModelPool] | Located[TierPolicy] | Located[TenantBudget]],
) -> list[Problem]:
    first: dict[tuple[str, str, str], str] = {}
    problems = []
    for item in items:
        key = (item.obj.kind, _namespace(item.obj), item.obj.metadata.name)
        if key in first:
            problems.append(
                Problem(
                    item.source,
                    item.obj.kind,
                    item.obj.metadata.name,
                    "metadata.name",
                    f"duplicate {item.obj.kind} in namespace {key[1]!r} (first in {first[key]})",
                )
            )
        else:
            first[key] = item.source
    return problems


def pool_tier_findings(pool: ModelPool, policy: TierPolicy) -> list[Finding]:
    """Tiers a pool names (``peakConcurrency``, ``canaryTiers``) that its policy lacks.

    Shared by ``kvpool validate`` and the operator, which runs it on every reconcile.
    """
    tiers = set(policy.tier_names())
    named = policy.metadata.name
    findings = [
        Finding(
            f"spec.capacity.peakConcurrency.{tier}",
            f"tier {tier!r} is not in TierPolicy {named!r} (tiers: {_names(tiers)})",
        )
        for tier in pool.spec.capacity.peak_concurrency
        if tier not in tiers
    ]
    findings += [
        Finding(
            f"spec.rollout.canaryTiers[{index}]",
            f"tier {tier!r} is not in TierPolicy {named!r} (tiers: {_names(tiers)})",
        )
        for index, tier in enumerate(pool.spec.rollout.canary_tiers)
        if tier not in tiers
    ]
    return findings


def _policy_tier_problems(item: Located[ModelPool], policy: TierPolicy) -> list[Problem]:
    return [_problem(item, f.path, f.reason) for f in pool_tier_findings(item.obj, policy)]


def check_pools(
    pools: Sequence[Located[ModelPool]],
    policies: dict[tuple[str, str], TierPolicy],
    invalid: Invalid = frozenset(),
) -> list[Problem]:
    """Pool -> policy references, pool tiers, and served model names unique per namespace."""
    problems = []
    served: dict[tuple[str, str], str] = {}
    for item in pools:
        namespace = _namespace(item.obj)
        ref = item.obj.spec.tier_policy_ref.name
        policy = policies.get((namespace, ref))
        if policy is None and ("TierPolicy", namespace, ref) in invalid:
            pass  # the policy's own problems are reported
        elif policy is None:
            in_ns = [name for ns, name in policies if ns == namespace]
            problems.append(
                _problem(
                    item,
                    "spec.tierPolicyRef.name",
                    f"TierPolicy {ref!r} not found in namespace {namespace!r} "
                    f"(TierPolicies there: {_names(in_ns)})",
                )
            )
        else:
            problems.extend(_policy_tier_problems(item, policy))
        served_name = item.obj.spec.model.served_name
        if (namespace, served_name) in served:
            problems.append(
                _problem(
                    item,
                    "spec.model.servedName",
                    f"{served_name!r} is also served by ModelPool/"
                    f"{served[(namespace, served_name)]}; the gateway routes by this name",
                )
            )
        else:
            served[(namespace, served_name)] = item.obj.metadata.name
    return problems


def resolve_budget_policy(
    budget: TenantBudget, in_namespace: Mapping[str, TierPolicy]
) -> TierPolicy | Finding:
    """The TierPolicy a budget's tiers belong to: its ``tierPolicyRef``, else the
    namespace's only policy; a :class:`Finding` when there is none or it is ambiguous."""
    namespace = _namespace(budget)
    ref = budget.spec.tier_policy_ref
    if ref is not None:
        if ref.name in in_namespace:
            return in_namespace[ref.name]
        return Finding(
            "spec.tierPolicyRef.name",
            f"TierPolicy {ref.name!r} not found in namespace {namespace!r} "
            f"(TierPolicies there: {_names(in_namespace)})",
        )
    if len(in_namespace) == 1:
        return next(iter(in_namespace.values()))
    if not in_namespace:
        reason = f"no TierPolicy in namespace {namespace!r} for this tenant's tiers"
    else:
        reason = (
            f"required: namespace {namespace!r} has {len(in_namespace)} TierPolicies "
            f"({_names(in_namespace)}); name the one this tenant uses"
        )
    return Finding("spec.tierPolicyRef", reason)


def budget_tier_findings(budget: TenantBudget, policy: TierPolicy) -> list[Finding]:
    """Tiers a budget names that its policy lacks."""
    tiers = set(policy.tier_names())
    return [
        Finding(
            f"spec.tiers[{index}]",
            f"tier {tier!r} is not in TierPolicy {policy.metadata.name!r} (tiers: {_names(tiers)})",
        )
        for index, tier in enumerate(budget.spec.tiers)
        if tier not in tiers
    ]


def _budget_policy(
    item: Located[TenantBudget],
    policies: dict[tuple[str, str], TierPolicy],
    invalid: Invalid = frozenset(),
) -> TierPolicy | Problem | None:
    """The budget's policy, a problem, or None when it is in the set but invalid."""
    namespace = _namespace(item.obj)
    in_ns = {name: p for (ns, name), p in policies.items() if ns == namespace}
    broken = {name for kind, ns, name in invalid if kind == "TierPolicy" and ns == namespace}
    ref = item.obj.spec.tier_policy_ref
    if ref is not None and ref.name in broken:
        return None
    if ref is None and broken:
        if len(in_ns) + len(broken) == 1:
            return None  # the namespace's only policy is invalid
        names = _names([*in_ns, *broken])
        reason = (
            f"required: namespace {namespace!r} has {len(in_ns) + len(broken)} TierPolicies "
            f"({names}); name the one this tenant uses"
        )
        return _problem(item, "spec.tierPolicyRef", reason)
    found = resolve_budget_policy(item.obj, in_ns)
    return _problem(item, found.path, found.reason) if isinstance(found, Finding) else found


def _key_ref_problem(
    ref: SecretKeyReference,
    path: str,
    namespace: str,
    secrets: dict[tuple[str, str], SecretData],
    invalid: Invalid,
) -> tuple[str, str, str] | None:
    """(severity, field path, reason) for one API key reference, or None when it resolves."""
    secret = secrets.get((namespace, ref.name))
    if secret is None and ("Secret", namespace, ref.name) in invalid:
        return None  # the Secret's own problems are reported
    if secret is None:
        return (
            "warning",
            f"{path}.name",
            f"Secret {ref.name!r} is not in the given manifests: the operator reads it from "
            f'namespace {namespace!r} (labelled {API_KEY_SECRET_LABEL}: "true"); until it '
            "exists there, this key gets 401",
        )
    if API_KEY_SECRET_LABEL not in secret.labels:
        return (
            "error",
            f"{path}.name",
            f'Secret {ref.name!r} lacks the label {API_KEY_SECRET_LABEL}: "true" '
            "(the operator reads only labelled Secrets)",
        )
    if ref.key not in secret.values:
        return (
            "error",
            f"{path}.key",
            f"Secret {ref.name!r} has no key {ref.key!r} (keys: {_names(secret.values)})",
        )
    return None


def check_budgets(
    budgets: Sequence[Located[TenantBudget]],
    policies: dict[tuple[str, str], TierPolicy],
    secrets: dict[tuple[str, str], SecretData],
    invalid: Invalid = frozenset(),
) -> References:
    """Budget -> policy and tiers, budget -> Secret key, tenant ids unique per namespace."""
    problems: list[Problem] = []
    warnings: list[Problem] = []
    tenants: dict[tuple[str, str], str] = {}
    for item in budgets:
        namespace = _namespace(item.obj)
        policy = _budget_policy(item, policies, invalid)
        if isinstance(policy, Problem):
            problems.append(policy)
        elif policy is not None:
            problems += [
                _problem(item, f.path, f.reason) for f in budget_tier_findings(item.obj, policy)
            ]
        for path, ref in item.obj.key_refs():
            found = _key_ref_problem(ref, path, namespace, secrets, invalid)
            if found is not None:
                severity, field, reason = found
                (warnings if severity == "warning" else problems).append(
                    _problem(item, field, reason)
                )
        tenant = item.obj.spec.tenant
        if (namespace, tenant) in tenants:
            problems.append(
                _problem(
                    item,
                    "spec.tenant",
                    f"tenant {tenant!r} is also claimed by TenantBudget/"
                    f"{tenants[(namespace, tenant)]}",
                )
            )
        else:
            tenants[(namespace, tenant)] = item.obj.metadata.name
    return References(problems, warnings)


def shared_key_problems(
    budgets: Sequence[Located[TenantBudget]],
    secrets: Mapping[tuple[str, str], SecretData],
    key_digest: KeyDigest | None = None,
) -> list[Problem]:
    """A problem on every TenantBudget whose API key is another budget's too (in its
    namespace): the gateway could authenticate the key as either tenant, so neither is
    served. Two budgets on one Secret key, or two Secrets with the same value, are both
    caught. Keys are compared by ``key_digest`` (the gateway's digest, so keys that differ
    only in what it trims count as one); without it, by their exact values."""
    digest = key_digest or (lambda value: value)
    users: dict[tuple[str, str], list[tuple[Located[TenantBudget], str, str]]] = {}
    for item in budgets:
        namespace = _namespace(item.obj)
        for path, ref in item.obj.key_refs():
            secret = secrets.get((namespace, ref.name))
            value = secret.values.get(ref.key) if secret is not None else None
            if value is not None:
                where = f"key {ref.key!r} of Secret {ref.name!r}"
                users.setdefault((namespace, digest(value)), []).append((item, path, where))
    problems = []
    for entries in users.values():
        names = sorted({item.obj.metadata.name for item, _, _ in entries})
        for item, path, where in entries if len(names) > 1 else ():
            others = ", ".join(f"TenantBudget/{n}" for n in names if n != item.obj.metadata.name)
            reason = (
                f"the API key ({where}) is also the key of {others}: one key must identify "
                "one tenant (the gateway would authenticate it as either); neither is served"
            )
            problems.append(_problem(item, path, reason))
    return problems


def check_references(
    pools: Sequence[Located[ModelPool]],
    policies: Sequence[Located[TierPolicy]],
    budgets: Sequence[Located[TenantBudget]],
    secrets: Sequence[SecretData],
    invalid: Invalid = frozenset(),
    key_digest: KeyDigest | None = None,
) -> References:
    """Every cross-object problem and warning of a set of valid objects; ``invalid`` names
    the objects of the set that failed their own checks (no problem repeats theirs)."""
    by_key = {(_namespace(p.obj), p.obj.metadata.name): p.obj for p in policies}
    secret_by_key = {(s.namespace, s.name): s for s in secrets}
    budget_refs = check_budgets(budgets, by_key, secret_by_key, invalid)
    return References(
        problems=[
            *_duplicates([*policies, *pools, *budgets]),
            *check_pools(pools, by_key, invalid),
            *budget_refs.problems,
            *shared_key_problems(budgets, secret_by_key, key_digest),
        ],
        warnings=budget_refs.warnings,
    )
