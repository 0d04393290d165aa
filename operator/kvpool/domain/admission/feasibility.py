"""Whether a state of the pool is feasible, and who lends what: floors, shared, borrowing.

Why this module exists: this is the accounting rule of admission, stated once and used
by the dispatcher (may this request start?), the arrival checks (could it ever start?)
and the snapshot (who lends, what runs over the plan). Tokens and slots are two
independent dimensions, each checked the same way (every figure is an
:class:`~.amount.Amount`). Per tier ``t``: in use ``U_t``, floor ``F_t``, lendable
``L_t``; shared ``S``; total ``T`` (= S + sum F). The part of ``U_t`` inside the floor is
``own_t = min(U_t, F_t)``, the rest ``over_t`` is borrowed, first from the shared
remainder, then from other tiers' *idle lendable* floor ``idle_u = min(L_u, F_u - own_u)``.
A state is **feasible** iff ``sum U <= T`` and ``max(0, sum over - S) <= sum idle``
(docs/0003-admission.md §3 "Accounting").

Worked example (tokens only; tiers hi, lo with F = 400 each, L = 400 each, S = 200, T =
1000): with lo using 300, adding lo 500 gives lo 800: own 400, over 400 = shared 200 + hi's
idle 200, so the position's deficit is 0 (feasible), and :func:`borrow_sources` names
``("shared", "hi")``; adding hi 300 next would leave hi's own 300 > its 200 not lent: the
deficit is 100 (not feasible).
"""

from __future__ import annotations

from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.ledger import Position, TierState
from kvpool.domain.admission.state import PoolState
from kvpool.domain.admission.verdicts import SHARED, AdmissionRequest


def position(
    state: PoolState,
    tier: TierState | None,
    size: Amount,
    wants: dict[str, Amount] | None,
) -> Position:
    """The state with a request of ``size`` added to ``tier``: feasible iff the deficit
    is <= 0 in both dimensions.

    ``wants`` (tier -> what its next request needs) hold back part of a tier's idle
    floor from borrowers: a tier waiting for its own floor does not lend it out again.
    """
    deficit = state.used + size - state.total
    over = idle = lower = ZERO
    for t in state.order:
        used = t.used + size if t is tier else t.used
        own = used.min(t.floor)
        over += used - own
        if tier is not None and t.rank > tier.rank:
            lower += used - own
        if wants is not None and t is not tier and t.name in wants:
            # held for the tier's next request as if it were running already
            want = wants[t.name]
            over -= used - own
            used += want
            deficit += want
            own = used.min(t.floor)
            over += used - own
        idle += t.lend.min(t.floor - own)
    return Position(deficit.max(over - state.shared - idle), lower)


def lent_by_tier(state: PoolState) -> dict[str, Amount]:
    """Who lends what to borrowers: lowest-priority lenders first (accounting only)."""
    over = ZERO
    idle: list[tuple[TierState, Amount]] = []
    for t in state.order:
        own = t.used.min(t.floor)
        over += t.used - own
        idle.append((t, t.lend.min(t.floor - own)))
    need = (over - state.shared).clamp0()
    lent: dict[str, Amount] = {}
    for t, free in reversed(idle):
        if need.is_zero:
            break
        give = need.min(free).clamp0()
        if not give.is_zero:
            lent[t.name] = give
            need -= give
    return lent


def shared_in_use(state: PoolState) -> Amount:
    """The part of the shared remainder borrowers hold."""
    over = sum(((t.used - t.floor).clamp0() for t in state.order), ZERO)
    return over.min(state.shared)


def borrow_sources(state: PoolState, tier: TierState, size: Amount) -> tuple[str, ...]:
    """Who lends to a borrowing request of ``size``: the shared remainder and/or tier
    floors (the difference its start makes to :func:`lent_by_tier`)."""
    lent_before, shared_before = lent_by_tier(state), shared_in_use(state)
    tier.used += size
    lent_after, shared_after = lent_by_tier(state), shared_in_use(state)
    tier.used -= size
    sources: list[str] = []
    if not shared_after.fits_in(shared_before):
        sources.append(SHARED)
    for t in state.order:
        if t is not tier and not lent_after.get(t.name, ZERO).fits_in(
            lent_before.get(t.name, ZERO)
        ):
            sources.append(t.name)
    return tuple(sources)


def within_floor(tier: TierState, request: AdmissionRequest) -> bool:
    """Whether the request starts on the tier's own floor: it fits in what is left of the
    floor, or the tier has a floor and nothing running (a floor always holds one request,
    whatever its size: the part above the floor is borrowed, but it goes before every
    borrower - the tier would otherwise starve behind busier tiers)."""
    return (tier.used + request.amount).fits_in(tier.floor) or (
        tier.floor.tokens > 0 and tier.floor.slots > 0 and tier.used.is_zero
    )


def inside_floor(tier: TierState, request: AdmissionRequest) -> bool:
    """Whether the request fits entirely inside what is left of the tier's floor."""
    return (tier.used + request.amount).fits_in(tier.floor)


def ceiling(state: PoolState, tier: TierState) -> Amount:
    """The most one request of ``tier`` could ever hold in an otherwise idle pool: in the
    whole plan where this controller admits against a lease of it (a request too large
    for the lease but not for the pool waits for the lease to grow; it is not refused)."""
    whole = state.whole
    if whole is not None and tier.name in whole.tiers:
        return ceiling(whole, whole.tiers[tier.name])
    others = sum((t.lend for t in state.order if t is not tier), ZERO)
    cap = state.total.min(tier.floor + state.shared + others)
    if state.replicas:
        cap = cap.min(state.per_replica)
    return cap


def never_fits(state: PoolState, request: AdmissionRequest, tier: TierState) -> bool:
    """Whether even its smallest reservation exceeds :func:`ceiling`."""
    smallest = Amount(request.borrowing_tokens, request.slots)
    return not smallest.fits_in(ceiling(state, tier))


def too_large_message(state: PoolState, request: AdmissionRequest, tier: TierState) -> str:
    """Why a request can never fit, for the tenant: no capacity figures (a tenant must
    not learn the pool's per-tier capacity from error texts, issue 18.8); the figures are
    :func:`too_large_detail`'s, for the operator's log."""
    return (
        f"the request is larger than tier {tier.name!r} of pool {state.pool.name!r} can "
        "ever hold for one request: lower max_tokens (or n), or shorten the prompt"
    )


def too_large_detail(state: PoolState, request: AdmissionRequest, tier: TierState) -> str:
    """The figures of a request that can never fit (operator log)."""
    cap = ceiling(state, tier)
    return (
        f"needs {request.borrowing_tokens} KV tokens and {request.slots} slot(s); tier "
        f"{tier.name!r} of pool {state.pool.name!r} holds at most {cap.tokens} tokens and "
        f"{cap.slots} slots for one request"
    )
