"""Capacity leases: several gateway replicas admitting against one plan, as one.

Why this package exists: admission state (reservations, queues, fairness) lives in each
gateway process, and a platform runs several. Splitting the plan into equal static
shares halves the output the moment ingress is skewed (an L4 balancer, a few long-lived
HTTP/2 clients) and starves a tier whose requests reach the "wrong" replica; admitting the
whole plan in each replica promises floors and KV twice. A lease is the part of a plan
one replica may admit against right now. Leases follow demand: each replica reports what
its tiers hold and wait for, one pure function (:func:`plan_leases`) turns the reports of
all live replicas into one lease each (floors first where their tier's demand is, the
shared remainder by priority, max-min fair), and a grant step (:func:`decide_grant`,
executed atomically in Redis) never lets the leases of all replicas together exceed the
plan. The algorithm, its invariants and its costs are in docs/0008-gateway-scale-out.md.

Modules:

- :mod:`.model`: the leasable parts of a plan (:class:`LeasePlan`), a replica's report
  (:class:`Report`), a lease (:class:`Lease`), and the lease applied to a pool view;
- :mod:`.allocation`: :func:`plan_leases`, the pure allocation;
- :mod:`.grant`: :func:`decide_grant`, what the Redis script does (its reference model);
- :mod:`.fallback`: what a replica admits against while it cannot reach Redis.
"""

from kvpool.domain.lease.allocation import fill, fill_whole, plan_leases, spread
from kvpool.domain.lease.fallback import (
    LeaseClock,
    LeaseMode,
    decide_lease_mode,
    equal_split,
    equal_tenant_parts,
    shrunk,
    tenant_shares_in_mode,
)
from kvpool.domain.lease.grant import Grant, decide_grant
from kvpool.domain.lease.model import (
    Lease,
    LeasePlan,
    Report,
    TierDemand,
    apply_lease,
    build_lease_plan,
)

__all__ = [
    "Grant",
    "Lease",
    "LeaseClock",
    "LeaseMode",
    "LeasePlan",
    "Report",
    "TierDemand",
    "apply_lease",
    "build_lease_plan",
    "decide_grant",
    "decide_lease_mode",
    "equal_split",
    "equal_tenant_parts",
    "fill",
    "fill_whole",
    "plan_leases",
    "shrunk",
    "spread",
    "tenant_shares_in_mode",
]
