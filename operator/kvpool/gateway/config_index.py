"""One admission config, indexed for the request path; replaced whole on every reload.

Why this module exists: the request path looks a tenant up by its key digest, a pool by
its served name and a policy by its name, many times a second; the config lists them.
:class:`ConfigIndex` is those three dictionaries, built once per config. It is immutable,
so a reload is one assignment and a request keeps the index it started with; the pipeline,
the pool registry and the HTTP handlers all read it, none of them owns it.

The index holds the config as compiled (the whole plan). This replica's share of it is
applied where it is enforced (:mod:`kvpool.gateway.capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.api.admission_config import (
    AdmissionConfig,
    CompiledPool,
    CompiledTenant,
    CompiledTier,
    CompiledTierPolicy,
)


@dataclass(frozen=True)
class ConfigIndex:
    """One config, indexed for the request path. Immutable: replaced whole on reload."""

    config: AdmissionConfig
    tenants: dict[str, CompiledTenant]  # key sha256 hex -> tenant
    pools: dict[str, CompiledPool]  # served name -> pool
    policies: dict[str, CompiledTierPolicy]  # name -> policy

    @classmethod
    def build(cls, config: AdmissionConfig) -> ConfigIndex:
        """Index a config."""
        return cls(
            config=config,
            # every key of a tenant authenticates it (a rotation: old and new together)
            tenants={digest: t for t in config.tenants for digest in t.key_digests()},
            pools={p.served_name: p for p in config.pools},
            policies={p.name: p for p in config.tier_policies},
        )

    def tiers_of(self, pool: CompiledPool) -> list[CompiledTier]:
        """The tiers of a pool's policy (empty if the policy is missing)."""
        policy = self.policies.get(pool.tier_policy)
        return list(policy.tiers) if policy is not None else []
