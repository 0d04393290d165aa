"""What is leased: the parts of a plan, a replica's demand report, and a lease.

Why this module exists: a plan (a pool's, or a rollout track's) is not one number. Per
tier it has a floor (of which a lendable part), then a shared remainder no tier owns,
and the capacity of one engine replica; each in two dimensions, KV tokens and slots. A
lease gives one gateway replica a part of each *component* of the plan:

- ``floor.<dim>.<tier>``: part of the tier's floor (its lendable part follows from the
  tier's ``lendPercent``, as in the planner);
- ``shared.<dim>``: part of the shared remainder;
- ``loan.<dim>.<tier>``: part of the tier's *idle lendable floor* placed on another replica
  where borrowers wait (to this replica, it is shared capacity). For a ``reclaim: Wait``
  tier the lender's floor shrinks by what it lends, and the tier gets it back as the
  borrowers finish, as on one replica. For a ``reclaim: Preempt`` tier the loan is booked
  twice on purpose: the lender keeps its floor and admits into it at once, and the engines'
  priority scheduler preempts the borrowers, exactly what ``Preempt`` means on one replica
  (docs/0003 §3); such loans are bounded by the tier's lendable floor. What is lent away
  is no longer lendable *at the lender* (:attr:`Lease.lendable_here`): on one replica a
  piece of idle floor has one borrower, so the lender's own lower tiers do not borrow the
  piece another replica's borrowers run on;
- ``standby.<dim>.<tier>``: for a ``reclaim: Preempt`` tier only, one request's worth of
  that tier's idle lendable floor placed on another replica, given ahead of demand to a
  replica where the tier arrives but whose own part of the floor has no room left for its
  next request (with four replicas and a floor of four slots, most replicas hold none).
  It is the tier's floor at that replica, not lendable there (only the tier's requests
  use it). Booked twice like a ``Preempt`` loan: the replica that holds the floor keeps
  it (and may lend it to its own borrowers), and when a request starts on the standby the
  engines' priority scheduler preempts the borrowers, as on one replica. Standbys and
  loans of a tier share one bound, its lendable floor;
- ``tenant.<name>``: part of a tenant's ``maxConcurrency`` in this pool and track.

The Redis grant checks each constraint group (:meth:`LeasePlan.groups`: the sum over
replicas never exceeds the plan's figure); everything else (lendable parts, totals,
per-engine capacity) is derived from the components, so a lease that passes the check is
a consistent plan.

Worked example (one engine of 1,843 usable tokens and 8 slots; floors interactive 921/4,
batch 552/2, eval 192/1, shared 178/1; two gateways, chat on ``b``, batch and eval on
``a``): :func:`~kvpool.domain.lease.allocation.plan_leases` gives ``b`` the whole
interactive floor and ``a`` batch's and eval's floors and the shared remainder, plus a
loan of interactive's idle lendable floor (what ``b``'s chats do not use); applied to the
pool view (:func:`apply_lease`), ``a`` admits against 921 + 178 + loan tokens as one
replica would let batch borrow the idle interactive floor.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvpool.api.admission_config import CompiledPool, CompiledTier, TierAllocation
from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.verdicts import TierUsage

DIMENSIONS = ("tokens", "slots")


def _part(amount: Amount, dim: str) -> int:
    return amount.tokens if dim == "tokens" else amount.slots


def _amount(parts: Mapping[str, int]) -> Amount:
    return Amount(parts.get("tokens", 0), parts.get("slots", 0))


@dataclass(frozen=True)
class LeasePlan:
    """The leasable components of one plan (a pool's or a track's), from its compiled view."""

    tiers: tuple[str, ...]  # priority order, highest first
    floors: Mapping[str, Amount]  # tier -> its floor, over the whole pool
    lend_percent: Mapping[str, int]  # tier -> lendPercent
    preempt: frozenset[str]  # tiers whose idle lendable floor may be loaned (reclaim Preempt)
    shared: Amount  # the shared remainder
    per_engine: Amount  # what one engine replica holds
    tenants: Mapping[str, int] = field(default_factory=dict)  # tenant -> maxConcurrency

    @property
    def total(self) -> Amount:
        """Floors plus the shared remainder (the plan's total)."""
        return sum(self.floors.values(), ZERO) + self.shared

    def lendable(self, tier: str, floor: Amount) -> Amount:
        """The lendable part of ``floor`` (a part of tier's floor), as the planner rounds."""
        pct = self.lend_percent.get(tier, 0)
        return Amount(floor.tokens * pct // 100, floor.slots * pct // 100)

    def groups(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """Constraint groups: name -> (the plan's figure, the components that share it).

        What the leases of all replicas may sum to, per group. A tier's floor and the loans
        of its idle floor share one group (a ``Wait`` tier lends what it does not hold),
        except for a ``Preempt`` tier, whose loans and standbys are booked twice and bounded
        apart, together, by its lendable floor (see the module docstring)."""
        groups: dict[str, tuple[int, tuple[str, ...]]] = {}
        for dim in DIMENSIONS:
            for tier in self.tiers:
                floor, loan = f"floor.{dim}.{tier}", f"loan.{dim}.{tier}"
                figure = _part(self.floors[tier], dim)
                if tier in self.preempt:
                    groups[floor] = (figure, (floor,))
                    lendable = _part(self.lendable(tier, self.floors[tier]), dim)
                    groups[loan] = (lendable, (loan, f"standby.{dim}.{tier}"))
                else:
                    groups[floor] = (figure, (floor, loan))
            groups[f"shared.{dim}"] = (_part(self.shared, dim), (f"shared.{dim}",))
        for tenant, limit in self.tenants.items():
            groups[f"tenant.{tenant}"] = (limit, (f"tenant.{tenant}",))
        return groups


@dataclass(frozen=True)
class TierDemand:
    """One tier's demand on one replica."""

    now: Amount = ZERO  # reserved by its requests in flight plus what its queue waits for
    peak: Amount = ZERO  # the largest ``now`` of the last few seconds (where it arrives)
    head_tokens: int = 0  # what the tier's next request here reserves (0: none waits)
    held: Amount = ZERO  # of ``now``, what its requests in flight reserve (the rest waits)


@dataclass(frozen=True)
class Report:
    """What one replica reports for one plan at a renewal."""

    tiers: Mapping[str, TierDemand] = field(default_factory=dict)
    tenants: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # (now, peak) requests
    # of the tiers reported with no demand, those a replica new to the plan only presumes
    # arrive here (they arrive at another replica; gateway/lease_plans.py)
    presumed: frozenset[str] = frozenset()

    def demand(self, tier: str) -> TierDemand:
        """The tier's demand (none if it did not report the tier)."""
        return self.tiers.get(tier, TierDemand())

    def arrives(self, tier: str) -> bool:
        """Whether ``tier`` had demand here lately (its peak, or a longer presence window:
        a replica reports such a tier even while it has none), or is presumed to."""
        return tier in self.tiers

    def came(self, tier: str) -> bool:
        """Whether ``tier``'s requests did arrive here lately (not only presumed to)."""
        return tier in self.tiers and tier not in self.presumed

    @property
    def active(self) -> bool:
        """Whether any tier had demand here in the last few seconds."""
        return any(not d.peak.is_zero or not d.now.is_zero for d in self.tiers.values())


@dataclass(frozen=True)
class Lease:
    """One replica's part of a plan. Missing components are zero."""

    floors: Mapping[str, Amount] = field(default_factory=dict)
    shared: Amount = ZERO
    loans: Mapping[str, Amount] = field(default_factory=dict)
    tenants: Mapping[str, int] = field(default_factory=dict)
    standby: Mapping[str, Amount] = field(default_factory=dict)  # Preempt tier -> its standby
    # Preempt tier -> what of its floor here this replica's own lower tiers may borrow,
    # where the allocation lent part of it to the others: its idle lendable part less the
    # loans booked on it (absent: the floor's lendable part). Not a claim (not in
    # :meth:`components`): Redis never sees it
    lendable_here: Mapping[str, Amount] = field(default_factory=dict)

    @property
    def total(self) -> Amount:
        """Everything this replica may admit against."""
        loans = sum(self.loans.values(), ZERO) + sum(self.standby.values(), ZERO)
        return sum(self.floors.values(), ZERO) + self.shared + loans

    def components(self) -> dict[str, int]:
        """The lease as the flat component vector the grant checks (zeros left out)."""
        out: dict[str, int] = {}
        for dim in DIMENSIONS:
            for tier, floor in self.floors.items():
                if value := _part(floor, dim):
                    out[f"floor.{dim}.{tier}"] = value
            for tier, loan in self.loans.items():
                if value := _part(loan, dim):
                    out[f"loan.{dim}.{tier}"] = value
            for tier, standby in self.standby.items():
                if value := _part(standby, dim):
                    out[f"standby.{dim}.{tier}"] = value
            if value := _part(self.shared, dim):
                out[f"shared.{dim}"] = value
        for tenant, limit in self.tenants.items():
            if limit:
                out[f"tenant.{tenant}"] = limit
        return out

    @classmethod
    def from_components(cls, components: Mapping[str, int]) -> Lease:
        """The inverse of :meth:`components` (unknown names are ignored)."""
        floors: dict[str, dict[str, int]] = {}
        loans: dict[str, dict[str, int]] = {}
        standby: dict[str, dict[str, int]] = {}
        shared: dict[str, int] = {}
        tenants: dict[str, int] = {}
        for name, value in components.items():
            kind, _, rest = name.partition(".")
            if kind == "tenant":
                tenants[rest] = value
                continue
            dim, _, tier = rest.partition(".")
            if dim not in DIMENSIONS:
                continue
            if kind == "shared" and not tier:
                shared[dim] = value
            elif kind == "floor" and tier:
                floors.setdefault(tier, {})[dim] = value
            elif kind == "loan" and tier:
                loans.setdefault(tier, {})[dim] = value
            elif kind == "standby" and tier:
                standby.setdefault(tier, {})[dim] = value
        return cls(
            floors={t: _amount(p) for t, p in floors.items()},
            shared=_amount(shared),
            loans={t: _amount(p) for t, p in loans.items()},
            tenants=tenants,
            standby={t: _amount(p) for t, p in standby.items()},
        )


def build_lease_plan(
    view: CompiledPool,
    tiers: Sequence[CompiledTier],
    tenants: Mapping[str, int] | None = None,
) -> LeasePlan:
    """The leasable components of a pool's (or a track's) compiled view.

    ``tiers`` are the pool's policy tiers; ``tenants`` the ``maxConcurrency`` of the tenants
    that have one (each replica's part of it is leased like capacity)."""
    ordered = sorted(tiers, key=lambda t: t.rank)
    floors = {
        t.name: Amount(
            view.tiers[t.name].floor_tokens if t.name in view.tiers else 0,
            view.tiers[t.name].floor_slots if t.name in view.tiers else 0,
        )
        for t in ordered
    }
    return LeasePlan(
        tiers=tuple(t.name for t in ordered),
        floors=floors,
        lend_percent={t.name: t.lend_percent for t in ordered},
        preempt=frozenset(t.name for t in ordered if t.reclaim == "Preempt"),
        shared=Amount(view.shared_tokens, view.shared_slots).clamp0(),
        per_engine=Amount(view.tokens_per_replica, view.slots_per_replica),
        tenants=dict(tenants or {}),
    )


def _scaled(whole: int, part: int, of: int) -> int:
    """``whole * part / of``, floored, never above ``whole`` (0 when ``of`` is 0)."""
    if of <= 0:
        return 0
    return min(whole, whole * part // of)


def apply_lease(view: CompiledPool, plan: LeasePlan, lease: Lease) -> CompiledPool:
    """The pool view one replica admits against under ``lease``.

    Floors and their lendable parts are the lease's, a tier's standby added to its floor
    but not to the lendable part (only the tier's own requests start on it), the lendable
    part no more than :attr:`Lease.lendable_here` where the floor lends to other replicas
    (one borrower a piece, as on one replica); the shared
    remainder is the lease's shared part plus its loans (a borrower does not care whose
    idle floor it uses); an engine replica's capacity is scaled by the lease's share of
    the plan's total, so that what all gateway replicas route to one engine stays within
    it (loans and standbys aside).
    """
    tiers = {
        name: TierAllocation(
            floor_tokens=floor.tokens + standby.tokens,
            floor_slots=floor.slots + standby.slots,
            lendable_tokens=lendable.tokens,
            lendable_slots=lendable.slots,
        )
        for name in plan.tiers
        for floor, standby in [(lease.floors.get(name, ZERO), lease.standby.get(name, ZERO))]
        for lendable in [plan.lendable(name, floor).min(lease.lendable_here.get(name, floor))]
    }
    shared = lease.shared + sum(lease.loans.values(), ZERO)
    total = lease.total
    whole = plan.total
    return view.model_copy(
        update={
            "tiers": tiers,
            "shared_tokens": shared.tokens,
            "shared_slots": shared.slots,
            "total_tokens": total.tokens,
            "total_slots": total.slots,
            "tokens_per_replica": _scaled(view.tokens_per_replica, total.tokens, whole.tokens),
            "slots_per_replica": _scaled(view.slots_per_replica, total.slots, whole.slots),
        }
    )


def sum_components(vectors: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Component-wise sum of several lease (or claim) vectors."""
    out: dict[str, int] = {}
    for vector in vectors:
        for name, value in vector.items():
            out[name] = out.get(name, 0) + value
    return out


def report_of(
    tiers: Iterable[TierUsage],
    peaks: Mapping[str, Amount],
    tenants: Mapping[str, tuple[int, int]],
    tenant_peaks: Mapping[str, int],
    seen: Collection[str] = (),
    presumed: Collection[str] = (),
) -> Report:
    """A replica's report from its controller's snapshot: per tier reserved plus queued
    (``now``) and the largest of that over the last seconds (``peaks``, kept by the
    caller); per limited tenant its requests in flight plus queued, and their peak. A
    tier in ``seen`` (it had demand here lately, over a longer window than the peaks) is
    reported even with no demand, as all zeros: the tier still arrives here; so is a tier
    in ``presumed`` (a replica new to the plan presumes it arrives), marked as such."""
    out: dict[str, TierDemand] = {}
    only_presumed: set[str] = set()
    for t in tiers:
        now = Amount(t.in_use_tokens + t.queued_tokens, t.in_use_slots + t.queued_slots)
        peak = now.max(peaks.get(t.tier, ZERO))
        idle = now.is_zero and peak.is_zero
        if idle and (t.tier in seen or t.tier in presumed):
            out[t.tier] = TierDemand()
            if t.tier not in seen:
                only_presumed.add(t.tier)
        elif not idle:
            held = Amount(t.in_use_tokens, t.in_use_slots)
            out[t.tier] = TierDemand(now=now, peak=peak, head_tokens=t.head_tokens, held=held)
    counts = {
        name: (inflight + queued, max(inflight + queued, tenant_peaks.get(name, 0)))
        for name, (inflight, queued) in tenants.items()
    }
    for name, recent in tenant_peaks.items():
        if name not in counts and recent > 0:
            counts[name] = (0, recent)
    return Report(tiers=out, tenants=counts, presumed=frozenset(only_presumed))


def held_components(
    lease: Lease,
    tiers: Iterable[TierUsage],
    shared_used: Amount,
    tenant_inflight: Mapping[str, int],
    *,
    in_use: Amount = ZERO,
    previous: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """What a replica still holds of each component: its lease, or what its requests in
    flight use where that is more.

    Use is attributed as the controller does (a tier's own use of its floor plus what
    borrowers hold of it; borrowing from the shared remainder first, then from the loans).
    Requests admitted under a larger lease may not fit that attribution once the lease
    shrank; what is left over (``in_use`` minus what was attributed, per dimension) stays
    claimed where the replica claimed it before (``previous``: its last claim), then on the
    shared remainder - so what a replica claims always covers what it has in flight, and
    nobody is granted capacity its requests still hold.

    >>> lease = Lease(floors={"a": Amount(100, 2)}, shared=Amount(10, 1),
    ...               loans={"b": Amount(90, 1)})
    >>> usage = TierUsage("a", 0, 150, 3, 100, 2, 50, 1, 0, 0, 0, 0)  # 50 tokens over floor
    >>> held = held_components(lease, [usage], Amount(50, 1), {"acme": 2})
    >>> held["shared.tokens"], held["loan.tokens.b"], held["tenant.acme"]
    (10, 90, 2)
    >>> small = Lease(floors={"a": Amount(20, 1)})  # shrunk below what is in flight
    >>> usage = TierUsage("a", 0, 150, 3, 20, 1, 130, 2, 0, 0, 0, 0)
    >>> held = held_components(small, [usage], ZERO, {}, in_use=Amount(150, 3),
    ...                        previous={"floor.tokens.a": 150, "floor.slots.a": 3})
    >>> held["floor.tokens.a"], held["floor.slots.a"]
    (150, 3)
    """
    used: dict[str, int] = {}
    for t in tiers:
        own = Amount(t.in_use_tokens - t.borrowed_tokens, t.in_use_slots - t.borrowed_slots)
        floor = own + Amount(t.lent_tokens, t.lent_slots)
        # what the tier's floor holds above its leased part is on its standby first
        leased_floor, standby = lease.floors.get(t.tier, ZERO), lease.standby.get(t.tier, ZERO)
        on_standby = (floor - leased_floor).clamp0().min(standby)
        floor -= on_standby
        for dim in DIMENSIONS:
            used[f"floor.{dim}.{t.tier}"] = _part(floor, dim)
            if value := _part(on_standby, dim):
                used[f"standby.{dim}.{t.tier}"] = value
    for dim in DIMENSIONS:
        over = _part(shared_used, dim) - _part(lease.shared, dim)
        used[f"shared.{dim}"] = _part(shared_used, dim) - max(0, over)
        for tier, loan in lease.loans.items():
            take = min(max(0, over), _part(loan, dim))
            used[f"loan.{dim}.{tier}"] = take
            over -= take
    for tenant, count in tenant_inflight.items():
        used[f"tenant.{tenant}"] = count
    leased = lease.components()
    held = {c: max(v, leased.get(c, 0)) for c, v in used.items()}
    for c, v in leased.items():
        held.setdefault(c, v)
    for dim in DIMENSIONS:
        left = _part(in_use, dim) - sum(
            v for c, v in held.items() if c.split(".")[1:2] == [dim] and not c.startswith("t")
        )
        for c, before in sorted((previous or {}).items()):
            if left <= 0:
                break
            if c.split(".")[1:2] == [dim] and before > held.get(c, 0):
                extra = min(left, before - held.get(c, 0))
                held[c] = held.get(c, 0) + extra
                left -= extra
        if left > 0:
            held[f"shared.{dim}"] = held.get(f"shared.{dim}", 0) + left
    return {c: v for c, v in held.items() if v > 0}


def shrink_to(lease: Lease, desired: Lease) -> Lease:
    """Component-wise minimum of the current and the desired lease."""
    mine, want = lease.components(), desired.components()
    return Lease.from_components({c: min(v, want.get(c, 0)) for c, v in mine.items()})


def smaller_somewhere(new: Lease, old: Lease) -> bool:
    """Whether ``new`` is below ``old`` in some component (capacity was given up)."""
    got = new.components()
    return any(got.get(c, 0) < v for c, v in old.components().items())
