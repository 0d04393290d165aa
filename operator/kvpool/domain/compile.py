"""Compiling a namespace's pools, policies and tenants into the gateway's admission config.

Why it exists: the gateway must decide per request in microseconds, with no Kubernetes
API calls and no interpretation left to do. So the operator resolves everything once -
tier order, durations in seconds, engine priorities, per-tier floors of every pool, the
endpoints of every track, and tenant API keys reduced to SHA-256 digests - into one
:class:`~kvpool.api.admission_config.AdmissionConfig` per namespace
(ConfigMap ``kvpool-admission``, key ``config.json``; format in docs/0002-admission-config.md).

The output is deterministic: pools, policies and tenants are sorted by name and
``generatedAt`` is left out of :func:`config_hash`, so the ConfigMap is rewritten only
when something the gateway enforces changed.

A tenant has one API key or several (a rotation: old and new valid together); every key
that resolves is compiled (``keySha256``, then ``additionalKeySha256``). Tenants none of
whose keys can be resolved (Secret or key missing) are left out and reported in
``skipped``: without a digest the gateway could not authenticate them anyway.

Worked example: a pool ``chat`` planned at 2 replicas x 900 usable tokens and 4 slots,
under a policy ``interactive 50% / batch 30%``, compiles to ``totalTokens 1800``,
``tiers.interactive.floorTokens 900``, ``tiers.batch.floorTokens 540``,
``sharedTokens 360`` - the numbers are the plan's; compile adds no arithmetic of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.api.admission_config import (
    AdmissionConfig,
    BudgetWindow,
    CompiledPool,
    CompiledRule,
    CompiledTenant,
    CompiledTier,
    CompiledTierPolicy,
    Endpoint,
    TierAllocation,
    Track,
    TrackPlan,
)
from kvpool.api.common import parse_duration
from kvpool.api.modelpool import ModelPool
from kvpool.api.plan import PlanStatus
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy

SKIPPED_NO_KEY = "no key resolved (Secret or key missing)"


@dataclass(frozen=True)
class PodView:
    """What the compile needs of one engine pod."""

    name: str  # pod name, the replica id in gateway metrics
    ip: str | None  # status.podIP (None while pending)
    ready: bool  # the Ready condition
    track: str  # kvpool.dev/track label


@dataclass(frozen=True)
class CanaryInput:
    """The canary track of a pool during a rollout (from ``status.rollout``)."""

    revision: str  # the canary revision
    weight: int  # percent of canary-eligible traffic
    all_tiers: bool  # promotion: every tier may reach the canary
    plan: PlanStatus | None  # the canary's own plan (None: admit nothing on it)
    endpoints: tuple[Endpoint, ...]  # canary endpoints (pods or static)


@dataclass(frozen=True)
class PoolInput:
    """One pool as the operator knows it right now."""

    pool: ModelPool
    plan: PlanStatus | None  # the plan being enforced (None: no plan ever made)
    revision: str  # the stable engine revision
    endpoints: tuple[Endpoint, ...]  # stable-track endpoints (pods or static)
    canary: CanaryInput | None = None  # the canary track while a rollout runs


def plan_slots_per_replica(plan: PlanStatus) -> int:
    """A plan's admission slots per replica (a plan made before the field existed had its
    live sequences there)."""
    return plan.slots_per_replica or plan.live_sequences_per_replica


def build_track_plan(plan: PlanStatus) -> TrackPlan:
    """A plan as a track's own plan in the compiled config."""
    return TrackPlan(
        replicas=plan.replicas,
        tokens_per_replica=plan.usable_kv_tokens_per_replica,
        slots_per_replica=plan_slots_per_replica(plan),
        total_tokens=plan.total_tokens,
        total_slots=plan.total_slots,
        shared_tokens=plan.shared_tokens,
        shared_slots=plan.shared_slots,
        tiers={
            t.name: TierAllocation(
                floor_tokens=t.floor_tokens,
                floor_slots=t.floor_slots,
                lendable_tokens=t.lendable_tokens,
                lendable_slots=t.lendable_slots,
            )
            for t in plan.tiers
        },
    )


def build_canary_tiers(item: PoolInput, policy: TierPolicy | None) -> list[str]:
    """Tiers allowed on the canary: every tier at promotion, else ``canaryTiers``, else
    the policy's top tier (batch tiers stay on stable unless listed).

    Without a canary the spec's list is kept as it is (informational).
    """
    spec_tiers = list(item.pool.spec.rollout.canary_tiers)
    if item.canary is None:
        return spec_tiers
    names = [t.name for t in policy.spec.tiers] if policy is not None else []
    if item.canary.all_tiers:
        return names
    if spec_tiers:
        return spec_tiers
    return names[:1]


@dataclass(frozen=True)
class TenantInput:
    """One TenantBudget with the digests of its API keys."""

    budget: TenantBudget
    # one per key reference, in TenantBudget.key_refs() order; None when not resolvable
    key_sha256s: tuple[str | None, ...]

    @property
    def resolved(self) -> tuple[str, ...]:
        """The digests that authenticate the tenant, first reference first, each once.

        >>> TenantInput(None, ("b" * 64, None, "b" * 64)).resolved == ("b" * 64,)
        True
        """
        return tuple(dict.fromkeys(d for d in self.key_sha256s if d is not None))


@dataclass(frozen=True)
class CompiledNamespace:
    """The compiled config and what had to be left out of it."""

    config: AdmissionConfig
    skipped: tuple[tuple[str, str], ...]  # (TenantBudget name, reason)


def build_endpoints(pods: Sequence[PodView], port: int, track: str) -> tuple[Endpoint, ...]:
    """Endpoints of one track from its pods; pods without an IP are not routable yet.

    >>> build_endpoints([PodView("p-1", "10.0.0.7", True, "stable")], 8000, "stable")[0].url
    'http://10.0.0.7:8000'
    """
    return tuple(
        Endpoint(name=p.name, url=f"http://{p.ip}:{port}", ready=p.ready)
        for p in sorted(pods, key=lambda p: p.name)
        if p.track == track and p.ip
    )


def parse_static_endpoints(text: str) -> tuple[Endpoint, ...]:
    """Endpoints from the ``kvpool.dev/static-endpoints`` annotation (local mode).

    Comma- or whitespace-separated base URLs, each optionally named ``name=url``:

    >>> [e.name for e in parse_static_endpoints("a=http://127.0.0.1:8001, http://h:2")]
    ['a', 'static-1']
    """
    endpoints = []
    for index, item in enumerate(text.replace(",", " ").split()):
        name, sep, url = item.partition("=")
        if not sep:
            name, url = f"static-{index}", item
        endpoints.append(Endpoint(name=name, url=url.rstrip("/"), ready=True))
    return tuple(endpoints)


def build_compiled_policy(policy: TierPolicy) -> CompiledTierPolicy:
    """A TierPolicy resolved: ranks, seconds and engine priorities."""
    return CompiledTierPolicy(
        name=policy.metadata.name,
        tiers=[
            CompiledTier(
                name=t.name,
                rank=rank,
                floor_percent=t.floor_percent,
                lend_percent=t.lend_percent,
                max_queue_wait_seconds=parse_duration(t.max_queue_wait),
                ttft_p95_target_seconds=(
                    parse_duration(t.ttft_p95_target) if t.ttft_p95_target else None
                ),
                engine_priority=policy.engine_priority(t.name),
                reclaim=t.reclaim,
                budget_unavailable=t.budget_unavailable,
            )
            for rank, t in enumerate(policy.spec.tiers)
        ],
        classification=[
            CompiledRule(
                path_prefix=r.path_prefix,
                host=r.host,
                tenant_selector=r.tenant_selector,
                tier=r.tier,
            )
            for r in policy.spec.classification
        ],
    )


def build_tracks(item: PoolInput) -> list[Track]:
    """The stable track and, during a rollout, the canary track with its own plan."""
    canary = item.canary
    weight = canary.weight if canary is not None else 0
    tracks = [
        Track(
            name="stable",
            revision=item.revision,
            weight=100 - weight,
            endpoints=list(item.endpoints),
        )
    ]
    if canary is not None:
        tracks.append(
            Track(
                name="canary",
                revision=canary.revision,
                # a canary without a plan of its own admits nothing: route nothing to it
                weight=weight if canary.plan is not None else 0,
                endpoints=list(canary.endpoints),
                plan=build_track_plan(canary.plan) if canary.plan is not None else None,
            )
        )
    return tracks


def build_compiled_pool(item: PoolInput, policy: TierPolicy | None = None) -> CompiledPool:
    """A pool with its plan; no plan means ``planOk: false`` (the gateway admits nothing)."""
    spec = item.pool.spec
    plan = build_track_plan(item.plan) if item.plan is not None else None
    return CompiledPool(
        name=item.pool.metadata.name,
        served_name=spec.model.served_name,
        model_version=spec.model.version,
        tier_policy=spec.tier_policy_ref.name,
        max_model_len=spec.engine.max_model_len,
        prompt_tokens_mean=spec.workload.prompt_tokens.mean,
        prompt_tokens_p95=spec.workload.prompt_tokens.p95,
        output_tokens_mean=spec.workload.output_tokens.mean,
        output_tokens_p95=spec.workload.output_tokens.p95,
        tokenizer_path=spec.model.tokenizer_path,
        replicas=plan.replicas if plan else 0,
        tokens_per_replica=plan.tokens_per_replica if plan else 0,
        slots_per_replica=plan.slots_per_replica if plan else 0,
        total_tokens=plan.total_tokens if plan else 0,
        total_slots=plan.total_slots if plan else 0,
        shared_tokens=plan.shared_tokens if plan else 0,
        shared_slots=plan.shared_slots if plan else 0,
        tiers=plan.tiers if plan else {},
        canary_tiers=build_canary_tiers(item, policy),
        tracks=build_tracks(item),
        plan_ok=plan is not None,
    )


def _tenant_policy(budget: TenantBudget, policies: Sequence[TierPolicy]) -> str | None:
    if budget.spec.tier_policy_ref is not None:
        return budget.spec.tier_policy_ref.name
    return policies[0].metadata.name if len(policies) == 1 else None


def build_compiled_tenant(item: TenantInput, policies: Sequence[TierPolicy]) -> CompiledTenant:
    """A tenant with its key digests (the caller checked that one at least is resolved)."""
    spec = item.budget.spec
    first, *more = item.resolved or ("",)
    return CompiledTenant(
        tenant=spec.tenant,
        key_sha256=first,
        additional_key_sha256=more or None,
        labels=dict(item.budget.metadata.labels),
        tier_policy=_tenant_policy(item.budget, policies),
        tiers=list(spec.tiers),
        limits=[
            BudgetWindow(
                window_seconds=parse_duration(limit.window),
                tokens=limit.tokens,
                requests=limit.requests,
            )
            for limit in spec.limits
        ],
        max_concurrency=spec.max_concurrency,
        weight=spec.weight,
        over_budget=spec.over_budget,
    )


def build_admission_config(
    namespace: str,
    pools: Sequence[PoolInput],
    policies: Sequence[TierPolicy],
    tenants: Sequence[TenantInput],
    generated_at: str | None = None,
) -> CompiledNamespace:
    """The admission config of one namespace (deterministic: everything sorted by name)."""
    ordered_policies = sorted(policies, key=lambda p: p.metadata.name)
    by_name = {p.metadata.name: p for p in ordered_policies}
    skipped = tuple(
        (t.budget.metadata.name, SKIPPED_NO_KEY)
        for t in sorted(tenants, key=lambda t: t.budget.metadata.name)
        if not t.resolved
    )
    config = AdmissionConfig(
        namespace=namespace,
        generated_at=generated_at,
        tier_policies=[build_compiled_policy(p) for p in ordered_policies],
        pools=[
            build_compiled_pool(p, by_name.get(p.pool.spec.tier_policy_ref.name))
            for p in sorted(pools, key=lambda p: p.pool.metadata.name)
        ],
        tenants=[
            build_compiled_tenant(t, ordered_policies)
            for t in sorted(tenants, key=lambda t: (t.budget.spec.tenant, t.budget.metadata.name))
            if t.resolved
        ],
    )
    return CompiledNamespace(config=config, skipped=skipped)


def config_hash(config: AdmissionConfig) -> str:
    """A hash of what the gateway enforces (``generatedAt`` excluded)."""
    content = config.model_copy(update={"generated_at": None}).to_json()
    return hashlib.sha256(content.encode()).hexdigest()[:16]
