"""KV-aware admission of one pool (the algorithm: docs/0003-admission.md).

Why this package exists: admission is the product's core decision and the largest pure
part of kvpool; it is split so each piece can be read alone:

- :mod:`.amount`: ``Amount(tokens, slots)``, the two dimensions everything is counted in;
- :mod:`.verdicts`: requests, verdicts (``Admit | Queue | Reject``, each with a reason),
  wake-ups and snapshots;
- :mod:`.ledger`: the controller's mutable per-tier / per-replica accounting;
- :mod:`.fair_queue`: the waiting requests - per tier, per tenant FIFO, the fair pick
  (lowest in-use / weight), deadlines;
- :mod:`.controller`: ``AdmissionController`` - floors, borrowing by priority, deadlines,
  starvation freedom, lent limits and the borrowing pause;
- :mod:`.learning`: the learned output reservation and the adaptive overcommit ratio;
- :mod:`.limiter`: the TTFT limiter that throttles what is lent to lower tiers.

Everything public is re-exported here: ``from kvpool.domain.admission import ...``.
"""

from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.admission.controller import EWMA_ALPHA, AdmissionController
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
