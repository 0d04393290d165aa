"""One leased plan (a pool's track) and the steps around it that need no I/O.

Why this module exists: :mod:`kvpool.gateway.leases` runs the renewal protocol (Redis
calls, modes, nudges). What it renews is per plan, and three steps of it only compute:
an admission snapshot becomes this replica's demand report, the report becomes the lease
this replica wishes for (the allocation over every replica's last report), and the
leases of a pool's tracks become the pool view its runtime admits against. They live
here so that the keeper reads as the protocol, and each step can be read alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvpool.api.admission_config import CompiledPool, TrackPlan
from kvpool.domain.admission import AdmissionSnapshot
from kvpool.domain.admission.amount import Amount
from kvpool.domain.lease import Lease, LeasePlan, Report, plan_leases
from kvpool.domain.lease.model import report_of
from kvpool.domain.lease.peaks import PEAK_WINDOW_SECONDS, PeakWindow, Presence
from kvpool.domain.routing import CANARY, STABLE, build_track_pool

# for this long after it starts leasing a plan, a replica counts a ``Preempt`` tier that
# came to another replica as arriving here too (marked presumed: a standby, no floor
# part): it cannot know yet whether the balancer sends it that tier, and without it its
# first such request has no standby and waits for the others to release a floor piece
# (two renewals, 50-150 ms). Not as long as the presence window: where the balancer
# never sends the tier, a standby is floor its borrowers cannot use (with 30 s, four
# replicas with chats at one of them packed the engine's KV to 57 % against 65 %;
# bench/results/scaleout-sparse-floor-presume30.json)
JOIN_PRESUMPTION_SECONDS = PEAK_WINDOW_SECONDS


@dataclass(frozen=True)
class _Inputs:
    """What a desired lease is computed from (compared, never hashed: reports hold dicts)."""

    member: str
    report: Report
    table: dict[str, Report]
    plan: LeasePlan
    tenants: frozenset[str]


@dataclass
class LeasedPlan:
    """One leased plan: a pool's track, what Redis granted and what the others report."""

    pool: str
    track: str
    view: CompiledPool  # the track's whole plan, as compiled
    plan: LeasePlan  # its leasable components (all limited tenants)
    lease: Lease = field(default_factory=Lease)
    table: dict[str, Report] = field(default_factory=dict)  # the others' last reports
    peaks: PeakWindow = field(default_factory=PeakWindow)
    tenant_peaks: PeakWindow = field(default_factory=PeakWindow)
    presence: Presence = field(default_factory=Presence)  # tiers that arrived lately
    granted: Lease = field(default_factory=Lease)  # the last lease Redis granted
    claim: dict[str, int] = field(default_factory=dict)  # what Redis counts as held by us
    joined: float | None = None  # when this replica first reported for the plan
    # the last desired lease and what it was computed from (:meth:`desired`)
    _last: tuple[_Inputs, Lease] | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.pool, self.track

    def report(
        self,
        snapshot: AdmissionSnapshot | None,
        tenants: Mapping[str, tuple[int, int]],
        now: float,
    ) -> Report:
        """This replica's demand at ``now``: what each tier holds and waits for (and its
        recent peak), and the limited tenants' requests (in flight, queued)."""
        if snapshot is None:
            return Report()
        current = {
            t.tier: Amount(t.in_use_tokens + t.queued_tokens, t.in_use_slots + t.queued_slots)
            for t in snapshot.tiers
        }
        busy = {k: v for k, v in current.items() if not v.is_zero}
        peaks = self.peaks.observe(now, busy)
        seen = self.presence.observe(now, busy)
        counts = {t: Amount(0, n + q) for t, (n, q) in tenants.items() if n + q}
        tenant_peaks = {t: a.slots for t, a in self.tenant_peaks.observe(now, counts).items()}
        return report_of(
            snapshot.tiers, peaks, tenants, tenant_peaks, seen, presumed=self._presumed(now)
        )

    def _presumed(self, now: float) -> frozenset[str]:
        """The ``Preempt`` tiers that arrive at another replica, while this replica is new
        to the plan (:data:`JOIN_PRESUMPTION_SECONDS`)."""
        if self.joined is None:
            self.joined = now
        if now - self.joined >= JOIN_PRESUMPTION_SECONDS:
            return frozenset()
        return frozenset(
            t for t in self.plan.preempt if any(r.came(t) for r in self.table.values())
        )

    def in_play(self, report: Report) -> LeasePlan:
        """The plan with only the tenants someone reports or holds (not every tenant of
        the config: the renewal carries what is in play)."""
        names = set(report.tenants) | {t for r in self.table.values() for t in r.tenants}
        names |= set(self.lease.tenants)
        tenants = {t: self.plan.tenants[t] for t in names if t in self.plan.tenants}
        return LeasePlan(
            tiers=self.plan.tiers,
            floors=self.plan.floors,
            lend_percent=self.plan.lend_percent,
            preempt=self.plan.preempt,
            shared=self.plan.shared,
            per_engine=self.plan.per_engine,
            tenants=tenants,
        )

    def desired(self, member: str, report: Report) -> Lease:
        """The lease ``member`` (this replica, reporting ``report``) wishes for, on the
        last table of the others' reports.

        The allocation is pure, so its answer is kept for the inputs it was computed from
        (the table, the report, the plan and the tenants this replica holds): a renewal
        asks for it once or twice, and asks again when the answer's fresher table moves
        it; the next ask often has the same inputs (the demand did not move meanwhile).
        Under the scale-out bench's flood half of the asks were such repeats (a third at
        the busiest replica), and the allocation was half of a renewal's CPU (docs/0008)."""
        inputs = _Inputs(member, report, dict(self.table), self.plan, frozenset(self.lease.tenants))
        if self._last is not None and self._last[0] == inputs:
            return self._last[1]
        lease = plan_leases(self.in_play(report), {**self.table, member: report})[member]
        self._last = (inputs, lease)
        return lease


def track_views(pool: CompiledPool) -> dict[str, CompiledPool]:
    """Each track of ``pool`` with a plan of its own, as a pool (stable always)."""
    views = {STABLE: build_track_pool(pool, STABLE) or pool}
    canary = build_track_pool(pool, CANARY)
    if canary is not None:
        views[CANARY] = canary
    return views


def leased_pool(pool: CompiledPool, leased: Mapping[str, CompiledPool]) -> CompiledPool:
    """``pool`` as admitted on leases: the stable track's leased view, with every other
    leased track's own plan replaced by its leased figures."""
    stable = leased.get(STABLE, pool)
    tracks = []
    for compiled in pool.tracks:
        if compiled.name in leased and compiled.name != STABLE and compiled.plan is not None:
            v = leased[compiled.name]
            own = TrackPlan(
                replicas=v.replicas,
                tokens_per_replica=v.tokens_per_replica,
                slots_per_replica=v.slots_per_replica,
                total_tokens=v.total_tokens,
                total_slots=v.total_slots,
                shared_tokens=v.shared_tokens,
                shared_slots=v.shared_slots,
                tiers=dict(v.tiers),
            )
            tracks.append(compiled.model_copy(update={"plan": own}))
            continue
        tracks.append(compiled)
    return stable.model_copy(update={"tracks": tracks})
