"""The waiting requests of one pool: per tier, per tenant FIFO, fair picks, deadlines.

Why this module exists: the order in which waiting requests start is the fairness promise
of a tier - the waiting tenant with the lowest ``in-use tokens / weight`` goes next (FIFO
within a tenant; a tenant at its ``max_concurrency`` is skipped) - and the deadlines are
its latency promise. Keeping the queue apart from the capacity accounting (:mod:`.state`,
:mod:`.feasibility`) lets each be read alone. Removal is lazy (a dead entry is skipped in
its deque and in the deadline heap), so every operation is O(tenants of a tier) at most.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

from kvpool.domain.admission.ledger import TierState, Waiting


class FairQueue:
    """Waiting requests of every tier of a pool (see the module docstring)."""

    def __init__(self, tenant_inflight: dict[str, int]) -> None:
        self._waiting: dict[str, Waiting] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._seq = 0
        self._inflight = tenant_inflight  # shared with the controller: tenant -> admitted
        # this gateway replica's part of each limited tenant's maxConcurrency, when several
        # replicas share it by lease (None: every request's own max_concurrency; a limited
        # tenant missing from the map may start nothing here until its lease arrives)
        self.tenant_limits: Mapping[str, int] | None = None

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting

    def __len__(self) -> int:
        return len(self._waiting)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def get(self, request_id: str) -> Waiting | None:
        """The waiting entry of an id, if queued."""
        return self._waiting.get(request_id)

    def values(self) -> list[Waiting]:
        """Every waiting entry (a copy: safe to unqueue while iterating)."""
        return list(self._waiting.values())

    def next_seq(self) -> int:
        """Arrival order (ties in the fair pick go to the oldest)."""
        self._seq += 1
        return self._seq

    def enqueue(self, waiting: Waiting) -> None:
        """Add a request behind its tenant's queue in its tier."""
        req, tier = waiting.request, waiting.tier
        self._waiting[req.request_id] = waiting
        tier.queues.setdefault(req.tenant, deque()).append(waiting)
        tier.queued += req.amount
        tier.queued_count += 1
        heapq.heappush(self._deadlines, (waiting.deadline, waiting.seq, req.request_id))
        tier.head_valid = False

    def unqueue(self, waiting: Waiting) -> None:
        """Remove a waiting request (lazy in its deque and in the deadline heap)."""
        if not waiting.alive:
            return
        waiting.alive = False
        req, tier = waiting.request, waiting.tier
        del self._waiting[req.request_id]
        tier.queued -= req.amount
        tier.queued_count -= 1
        queue = tier.queues.get(req.tenant)
        if queue is not None:
            while queue and not queue[0].alive:
                queue.popleft()
            if not queue:
                del tier.queues[req.tenant]
        tier.head_valid = False

    def head(self, tier: TierState) -> Waiting | None:
        """The tier's next request: the waiting tenant with the lowest in-use/weight.

        Invariant kept by :meth:`unqueue`: the front of every tenant deque is alive. The
        pick is cached per tier until something it depends on changes (:meth:`touch`).
        """
        if tier.head_valid:
            return tier.head
        best: Waiting | None = None
        best_usage = 0.0
        inflight = self._inflight
        usage_of = tier.tenant_tokens
        for tenant, queue in tier.queues.items():
            head = queue[0]
            req = head.request
            limit = req.max_concurrency
            if limit is not None and self.tenant_limits is not None:
                limit = self.tenant_limits.get(tenant, 0)
            if limit is not None and inflight.get(tenant, 0) >= limit:
                continue
            usage = usage_of.get(tenant, 0) / (req.weight if req.weight > 0 else 1)
            if best is None or usage < best_usage or (usage == best_usage and head.seq < best.seq):
                best, best_usage = head, usage
        tier.head, tier.head_valid = best, True
        return best

    @staticmethod
    def touch(tier: TierState, tenant: str, order: Sequence[TierState]) -> None:
        """Invalidate cached picks after ``tenant``'s use in ``tier`` or its queue changed.

        The tier's pick depends on its queues and tenant usage; other tiers' picks depend
        on this tenant only through its in-flight count (``max_concurrency``).
        """
        tier.head_valid = False
        for other in order:
            if tenant in other.queues:
                other.head_valid = False

    def expired(self, now: float) -> Iterator[Waiting]:
        """Pop the live requests whose deadline is <= ``now`` (the caller unqueues them)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, rid = heapq.heappop(self._deadlines)
            waiting = self._waiting.get(rid)
            if waiting is not None and waiting.alive:
                yield waiting

    def earliest_deadline(self) -> float | None:
        """The earliest deadline of a live waiting request."""
        while self._deadlines:
            _, _, rid = self._deadlines[0]
            waiting = self._waiting.get(rid)
            if waiting is not None and waiting.alive:
                return self._deadlines[0][0]
            heapq.heappop(self._deadlines)
        return None
