"""One pool's admission controller, wired to the event loop: futures, deadlines, replicas.

Why this module exists: :class:`kvpool.domain.admission.AdmissionController` is pure (it
gets ``now`` and returns verdicts). Something has to turn its ``Queue`` verdict into a
future the request handler awaits, resolve those futures from the :class:`Wakeups` every
mutator returns, call ``expire`` when the earliest queued deadline comes, and take a
replica out of routing while outlier ejection (:mod:`kvpool.gateway.ejection`) says so.
That is this class; it holds no policy of its own.

Time is the event loop's monotonic clock (``loop.time()``), passed to the controller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kvpool.api.admission_config import CompiledPool, CompiledTier
from kvpool.domain.admission import (
    AdmissionController,
    AdmissionRequest,
    AdmissionSnapshot,
    Admit,
    Queue,
    Reject,
    Wakeups,
)
from kvpool.gateway.metrics import GatewayMetrics

log = logging.getLogger("kvpool.gateway")

REASON_POOL_REMOVED = "pool_removed"


class PoolRuntime:
    """Admission of one pool on the running event loop."""

    def __init__(
        self,
        pool: CompiledPool,
        tiers: Sequence[CompiledTier],
        metrics: GatewayMetrics,
    ) -> None:
        self.pool = pool
        self.controller = AdmissionController(pool, tiers)
        self.metrics = metrics
        self._waiters: dict[str, asyncio.Future[Admit | Reject]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at: float | None = None
        self._ejected: set[str] = set()  # replicas out of routing (outlier ejection)

    @staticmethod
    def now() -> float:
        """The admission clock (the loop's monotonic time)."""
        return asyncio.get_running_loop().time()

    async def admit(self, request: AdmissionRequest) -> Admit | Reject:
        """Offer the request; wait if it is queued. Cancelling the caller withdraws it."""
        verdict = self.controller.offer(request, self.now())
        if not isinstance(verdict, Queue):
            self._record(verdict)
            self._schedule_expiry()
            return verdict
        self.metrics.decisions.labels(self.pool.name, request.tier, "queued").inc()
        future: asyncio.Future[Admit | Reject] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = future
        self._schedule_expiry()
        try:
            result = await future
        except asyncio.CancelledError:
            self._withdraw(request.request_id, future)
            raise
        finally:
            self._waiters.pop(request.request_id, None)
        self._record(result)
        return result

    def _withdraw(self, request_id: str, future: asyncio.Future[Admit | Reject]) -> None:
        if future.done() and not future.cancelled():
            result = future.result()
            if isinstance(result, Admit):
                self.release(result.reservation_id)
            return
        self._apply(self.controller.cancel(request_id, self.now()))

    def release(self, reservation_id: str, actual_tokens: int | None = None) -> None:
        """End a reservation (idempotent) and start whatever can start now."""
        self._apply(self.controller.release(reservation_id, self.now(), actual_tokens))

    def reconfigure(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> None:
        """Adopt a new plan, keeping in-flight reservations."""
        self.pool = pool
        self._apply(self.controller.reconfigure(pool, tiers, self.now()))
        for name in self._ejected:  # a new config does not bring an ejected replica back
            self._apply(self.controller.set_replica_ready(name, False, self.now()))

    def set_borrowing_paused(self, paused: bool) -> None:
        """Pause (or resume) borrowing: the engines' measured KV usage is near the target."""
        self._apply(self.controller.set_borrowing_paused(paused, self.now()))

    def set_lent_limit(self, tier: str, limit: int | None) -> None:
        """Limit the requests of tiers below ``tier`` running on borrowed capacity."""
        self._apply(self.controller.set_lent_limit(tier, limit, self.now()))

    def set_replica_ejected(self, name: str, ejected: bool) -> None:
        """Take a replica out of routing, or put it back if the config lists it ready
        (outlier ejection decides when: :mod:`kvpool.gateway.ejection`)."""
        if ejected:
            self._ejected.add(name)
            self._apply(self.controller.set_replica_ready(name, False, self.now()))
            return
        self._ejected.discard(name)
        if any(e.ready and e.name == name for t in self.pool.tracks for e in t.endpoints):
            self._apply(self.controller.set_replica_ready(name, True, self.now()))

    def close(self) -> None:
        """The pool left the config: reject whoever still waits; in-flight requests finish."""
        for request_id, future in list(self._waiters.items()):
            if not future.done():
                future.set_result(
                    Reject(
                        request_id=request_id,
                        tier="",
                        outcome="rejected-capacity",
                        reason=REASON_POOL_REMOVED,
                        message=f"model pool {self.pool.name!r} was removed from the config",
                        retry_after_seconds=1.0,
                    )
                )
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = None

    def snapshot(self) -> AdmissionSnapshot:
        """The controller's in-use vs plan view."""
        return self.controller.snapshot()

    def _record(self, verdict: Admit | Reject) -> None:
        tier = verdict.tier
        self.metrics.decisions.labels(self.pool.name, tier, verdict.outcome).inc()
        if isinstance(verdict, Admit):
            self.metrics.queue_seconds.labels(self.pool.name, tier).observe(verdict.queued_seconds)
            if verdict.preempts:
                self.metrics.preempt_admissions.labels(self.pool.name).inc()

    def _apply(self, wakeups: Wakeups) -> None:
        verdicts: list[Admit | Reject] = [*wakeups.admitted, *wakeups.rejected]
        for verdict in verdicts:
            future = self._waiters.get(verdict.request_id)
            if future is not None and not future.done():
                future.set_result(verdict)
            elif isinstance(verdict, Admit):
                # its caller is gone (cancelled between the decision and now): give it back
                self._apply(self.controller.release(verdict.reservation_id, self.now()))
        self._schedule_expiry()

    def _schedule_expiry(self) -> None:
        deadline = self.controller.next_deadline()
        if deadline == self._expiry_at:
            return
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._expiry_at = deadline
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._expiry = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        self._expiry_at = None
        self._apply(self.controller.expire(self.now()))
