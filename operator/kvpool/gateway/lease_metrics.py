"""The capacity-lease series of a gateway replica (``kvpool_gateway_lease_*``).

Why this module exists: what a replica may admit, how it admits (the lease mode) and how
its lease moves are what an operator reads when replicas disagree about load; the series
and how a lease is written into them live here, apart from the renewal loop
(:mod:`kvpool.gateway.leases`) that feeds them.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from kvpool.domain.admission.amount import ZERO
from kvpool.domain.lease import Lease
from kvpool.gateway.metrics import GatewayMetrics

RENEWAL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class LeaseMetrics:
    """The lease series (``kvpool_gateway_lease_*``), in the gateway's registry."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        r, p = metrics.registry, "kvpool_gateway_lease_"
        self.mode = Gauge(
            p + "mode", "1 for the lease mode this replica admits in.", ["mode"], registry=r
        )
        self.members = Gauge(p + "members", "Live gateway replicas (last renewal).", registry=r)
        self.age = Gauge(
            p + "age_seconds", "Seconds since the last renewal that Redis answered.", registry=r
        )
        self.capacity = Gauge(
            p + "capacity",
            "What this replica may admit per plan: kind floor and standby (per tier), "
            "shared, loan, total; dimension tokens or slots.",
            ["pool", "track", "tier", "kind", "dimension"],
            registry=r,
        )
        self.handovers = Counter(
            p + "handovers_total",
            "Lease changes of this replica by pool: grew (capacity taken over) or shrank "
            "(given up).",
            ["pool", "direction"],
            registry=r,
        )
        self.renewals = Counter(
            p + "renewals_total", "Lease renewals by result (ok, error).", ["result"], registry=r
        )
        self.hurried = Counter(
            p + "hurried_renewals_total",
            "Renewals that skipped the wake gap: a request of a Preempt tier waited here "
            "(cause waiting) or another replica's urgent nudge asked (cause nudge).",
            ["cause"],
            registry=r,
        )
        for cause in ("waiting", "nudge"):  # both series exist from the start, at 0
            self.hurried.labels(cause)
        self.renewal_seconds = Histogram(
            p + "renewal_seconds",
            "Round trip of one renewal (the Redis script).",
            buckets=RENEWAL_BUCKETS,
            registry=r,
        )

    def export_lease(self, pool: str, track: str, tiers: Sequence[str], lease: Lease) -> None:
        """The lease a replica admits against, per tier floor and per kind."""
        for tier in tiers:
            floor = lease.floors.get(tier, ZERO)
            self.capacity.labels(pool, track, tier, "floor", "tokens").set(floor.tokens)
            self.capacity.labels(pool, track, tier, "floor", "slots").set(floor.slots)
            standby = lease.standby.get(tier, ZERO)
            self.capacity.labels(pool, track, tier, "standby", "tokens").set(standby.tokens)
            self.capacity.labels(pool, track, tier, "standby", "slots").set(standby.slots)
        loans = sum(lease.loans.values(), ZERO)
        for kind, amount in (("shared", lease.shared), ("loan", loans), ("total", lease.total)):
            self.capacity.labels(pool, track, "", kind, "tokens").set(amount.tokens)
            self.capacity.labels(pool, track, "", kind, "slots").set(amount.slots)

    def count_handover(self, pool: str, before: Lease, after: Lease) -> None:
        """A lease change: grew (capacity taken over) and/or shrank (given up)."""
        b, a = before.total, after.total
        if a.tokens > b.tokens or a.slots > b.slots:
            self.handovers.labels(pool, "grew").inc()
        if a.tokens < b.tokens or a.slots < b.slots:
            self.handovers.labels(pool, "shrank").inc()
