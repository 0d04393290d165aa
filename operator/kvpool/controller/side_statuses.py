"""The statuses of TierPolicies and TenantBudgets: pools using a policy, a tenant's key.

Why it exists: these statuses follow every config publish of a namespace but must never
delay it (a namespace may hold thousands of tenants), so they run on their own coalescing
queue in the background. The decisions are pure (:mod:`kvpool.domain.pool_status`); this
module reads the cache and patches a status only when it differs from what is stored or
was last written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pydantic

from kvpool.adapters import kube
from kvpool.api.tenantbudget import TenantBudgetStatus
from kvpool.api.tierpolicy import TierPolicyStatus
from kvpool.controller.clock import utc_now
from kvpool.domain.pool_status import build_budget_status, build_policy_status

if TYPE_CHECKING:
    from kvpool.controller.context import Operator

Body = Mapping[str, Any]


async def apply_side_statuses(op: Operator, namespace: str) -> None:
    """TierPolicy and TenantBudget statuses of a namespace (pools using it, key resolved)."""
    await _apply_policy_statuses(op, namespace)
    await _apply_budget_statuses(op, namespace)


async def _apply_aux_status(
    op: Operator, resource: kube.Resource, body: Body, status: dict[str, Any]
) -> None:
    """Patch a TierPolicy/TenantBudget status unless it already says this."""
    meta = body["metadata"]
    key = (resource.plural, meta.get("namespace") or "default", meta["name"])
    if op.written.get(key) == status or body.get("status") == status:
        return
    await kube.apply_status(op.kube, resource, key[1], key[2], status)
    op.written[key] = status


async def _apply_policy_statuses(op: Operator, namespace: str) -> None:
    pools = list(op.cache.pools.get(namespace, {}).values())
    for body in list(op.cache.policies.get(namespace, {}).values()):
        name = body["metadata"]["name"]
        using = sum(
            1
            for p in pools
            if ((p.get("spec") or {}).get("tierPolicyRef") or {}).get("name") == name
        )
        prior = _parse_or_none(TierPolicyStatus, body.get("status"))
        status = build_policy_status(prior, body["metadata"].get("generation"), using, utc_now())
        await _apply_aux_status(op, kube.TIERPOLICIES, body, status.to_wire())


async def _apply_budget_statuses(op: Operator, namespace: str) -> None:
    for body in list(op.cache.budgets.get(namespace, {}).values()):
        ref = ((body.get("spec") or {}).get("apiKeySecretRef")) or {}
        secret, key = str(ref.get("name", "")), str(ref.get("key", ""))
        resolved = key in op.cache.secrets.get((namespace, secret), {})
        prior = _parse_or_none(TenantBudgetStatus, body.get("status"))
        status = build_budget_status(
            prior, body["metadata"].get("generation"), secret, key, resolved, utc_now()
        )
        await _apply_aux_status(op, kube.TENANTBUDGETS, body, status.to_wire())


def _parse_or_none(model: Any, raw: Any) -> Any:
    try:
        return model.model_validate(raw) if raw else None
    except pydantic.ValidationError:
        return None
