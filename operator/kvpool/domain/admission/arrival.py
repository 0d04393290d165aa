"""The refusals at arrival: what a request is rejected for before it is ever queued.

Why it exists: some requests can be answered at once, whatever the queue holds: the pool
has no capacity plan yet, the tier is unknown (or removed from the policy), the request
can never fit the plan, or no replica (of the request's track) is ready. Answering them
at once, with a reason a client can act on (see :mod:`.verdicts`), is cheaper and clearer
than queueing them until their deadline. :func:`reject_on_arrival` makes those checks in
that order; :class:`~.controller.AdmissionController` calls it first on every offer. A
pool with no replicas listed (a plan alone) rejects no request for want of a ready one.
"""

from __future__ import annotations

from typing import Literal

from kvpool.domain.admission.feasibility import never_fits, too_large_detail, too_large_message
from kvpool.domain.admission.state import PoolState
from kvpool.domain.admission.verdicts import (
    REASON_NO_PLAN,
    REASON_NO_READY_REPLICA,
    REASON_TOO_LARGE_FOR_POOL,
    REASON_UNKNOWN_TIER,
    AdmissionRequest,
    Reject,
)


def reject_on_arrival(state: PoolState, request: AdmissionRequest) -> Reject | None:
    """The rejection ``request`` gets at once in ``state`` (``rejected-capacity``), or None
    when it may queue."""
    pool = state.pool
    tier = state.tiers.get(request.tier)

    def reject(
        outcome: Literal["rejected-deadline", "rejected-capacity"],
        reason: str,
        message: str,
        detail: str = "",
    ) -> Reject:
        return Reject(request.request_id, request.tier, outcome, reason, message, detail=detail)

    if not pool.plan_ok:
        return reject(
            "rejected-capacity",
            REASON_NO_PLAN,
            f"pool {pool.name!r} has no capacity plan yet: retry later",
        )
    if tier is None or tier.removed:
        return reject(
            "rejected-capacity",
            REASON_UNKNOWN_TIER,
            f"pool {pool.name!r} has no tier {request.tier!r}",
        )
    if never_fits(state, request, tier):
        return reject(
            "rejected-capacity",
            REASON_TOO_LARGE_FOR_POOL,
            too_large_message(state, request, tier),
            too_large_detail(state, request, tier),
        )
    if state.replicas and not any(
        r.ready and (request.track is None or r.track == request.track)
        for r in state.replicas.values()
    ):
        return reject(
            "rejected-capacity",
            REASON_NO_READY_REPLICA,
            f"no ready replica of pool {pool.name!r}"
            + (f" on track {request.track!r}" if request.track else ""),
        )
    return None
