"""Fail-static for admission: keep the last good compiled entry of an object gone bad.

Why it exists: the gateway enforces only what the compiled config holds. If a TierPolicy
in use is deleted (its in-use finalizer removed by hand, or deleted while no operator ran)
or edited into an invalid state, or a ModelPool's spec becomes invalid, compiling only
what is valid now would drop the entry and every request for those models would get
503 ``pool_not_ready``: a typo would be an outage. Instead the last published entry is
carried over, marked ``stale: true`` with a ``staleReason`` (and the objects' conditions
say so), until the object is fixed or nothing needs it any more.

Worked example: the previous config holds TierPolicy ``tiers``; it is now deleted but
pool ``chat`` still names it. ``keep_last_good(new, previous, {"tiers": "deleted while
in use"}, {})`` returns ``new`` plus the previous ``tiers`` with ``stale: true``.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvpool.api.admission_config import AdmissionConfig


def keep_last_good(
    config: AdmissionConfig,
    previous: AdmissionConfig | None,
    policies: Mapping[str, str],
    pools: Mapping[str, str],
) -> AdmissionConfig:
    """``config`` plus the previous entries of the named policies and pools (name ->
    why it is kept) that ``config`` lacks, marked stale. Entries the previous config
    did not have cannot be kept (they were never good); a kept pool whose served name a
    current pool now uses is not kept (two pools must never serve one name)."""
    if previous is None or (not policies and not pools):
        return config
    have_policies = {p.name for p in config.tier_policies}
    kept_policies = [
        p.model_copy(update={"stale": True, "stale_reason": policies[p.name]})
        for p in previous.tier_policies
        if p.name in policies and p.name not in have_policies
    ]
    have_pools = {p.name for p in config.pools}
    served = {p.served_name for p in config.pools}
    kept_pools = [
        p.model_copy(update={"stale": True, "stale_reason": pools[p.name]})
        for p in previous.pools
        if p.name in pools and p.name not in have_pools and p.served_name not in served
    ]
    if not kept_policies and not kept_pools:
        return config
    return config.model_copy(
        update={
            "tier_policies": sorted([*config.tier_policies, *kept_policies], key=lambda p: p.name),
            "pools": sorted([*config.pools, *kept_pools], key=lambda p: p.name),
        }
    )
