"""KV-aware admission of one pool (the algorithm: docs/0003-admission.md).

Why this package exists: admission is the product's core decision and the largest pure
part of kvpool; it is split so each piece can be read alone:

- :mod:`.amount`: ``Amount(tokens, slots)``, the two dimensions everything is counted in;
- :mod:`.verdicts`: requests, verdicts (``Admit | Queue | Reject``, each with a reason),
  wake-ups and snapshots;
- :mod:`.ledger`: the records admission keeps per tier, replica, reservation and waiter;
- :mod:`.state`: what one pool has reserved and what waits, and the commit/uncommit of a
  reservation;
- :mod:`.fair_queue`: the waiting requests - per tier, per tenant FIFO, the fair pick
  (lowest in-use / weight), deadlines;
- :mod:`.feasibility`: whether a state fits the plan (floors, shared, lending), who lends;
- :mod:`.dispatch`: which waiting requests start, by priority, floors and fairness;
- :mod:`.wait_estimate`: the expected wait and the fast rejection past ``maxQueueWait``;
- :mod:`.holds`: prefill holds of tiers with a ``ttftP95Target``;
- :mod:`.lending`: the borrowing pause and the lent limits;
- :mod:`.arrival`: what a request is rejected for at once, before it queues;
- :mod:`.controller`: ``AdmissionController`` - the one object the gateway talks to;
- :mod:`.snapshot`: the controller's snapshot - in use versus plan per tier and replica;
- :mod:`.learning`: the learned output reservation and the adaptive overcommit ratio;
- :mod:`.limiter`: the TTFT limiter that throttles what is lent to lower tiers.

Everything public is re-exported here: ``from kvpool.domain.admission import ...``.
"""

from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.controller import AdmissionController
from kvpool.domain.admission.verdicts import (
    OUTCOMES,
    REASON_DEADLINE_PASSED,
    REASON_NO_PLAN,
    REASON_NO_READY_REPLICA,
    REASON_QUEUE_WAIT,
    REASON_TIER_REMOVED,
    REASON_TOO_LARGE_FOR_POOL,
    REASON_UNKNOWN_TIER,
    SHARED,
    AdmissionRequest,
    AdmissionSnapshot,
    Admit,
    Outcome,
    Queue,
    Reject,
    ReplicaUsage,
    TierUsage,
    Verdict,
    Wakeups,
    build_admission_request,
)
from kvpool.domain.admission.wait_estimate import EWMA_ALPHA

__all__ = [
    "EWMA_ALPHA",
    "OUTCOMES",
    "REASON_DEADLINE_PASSED",
    "REASON_NO_PLAN",
    "REASON_NO_READY_REPLICA",
    "REASON_QUEUE_WAIT",
    "REASON_TIER_REMOVED",
    "REASON_TOO_LARGE_FOR_POOL",
    "REASON_UNKNOWN_TIER",
    "SHARED",
    "ZERO",
    "AdmissionController",
    "AdmissionRequest",
    "AdmissionSnapshot",
    "Admit",
    "Amount",
    "Outcome",
    "Queue",
    "Reject",
    "ReplicaUsage",
    "TierUsage",
    "Verdict",
    "Wakeups",
    "build_admission_request",
]
