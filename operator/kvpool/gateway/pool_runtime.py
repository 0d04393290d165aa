"""One pool's admission controller, wired to the event loop: futures, deadlines, replicas.

Why this module exists: :class:`kvpool.domain.admission.AdmissionController` is pure (it
gets ``now`` and returns verdicts). Something has to turn its ``Queue`` verdict into a
future the request handler awaits, resolve those futures from the :class:`Wakeups` every
mutator returns, call ``expire`` when the earliest queued deadline comes, and take a
replica out of routing while outlier ejection (:mod:`kvpool.gateway.ejection`) says so.
That is this class; it holds no policy of its own.

Per-track admission: during a rollout the pool has a stable and a canary track, and each
track admits against what *it* holds - one controller per track, each built from
:func:`kvpool.domain.routing.build_track_pool` (the canary's own plan: its measured KV
tokens per replica and floors over its replicas). A request goes to the controller of the
track :func:`~kvpool.domain.routing.decide_track` chose; a track that left the config
keeps its controller until its in-flight reservations are released.

Time is the event loop's monotonic clock (``loop.time()``), passed to the controllers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

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
from kvpool.domain.routing import STABLE, build_track_pool
from kvpool.gateway.errors import DEFAULT_RETRY_AFTER
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.outcomes import REASON_POOL_REMOVED

log = logging.getLogger("kvpool.gateway")


class PoolRuntime:
    """Admission of one pool on the running event loop."""

    def __init__(
        self,
        pool: CompiledPool,
        tiers: Sequence[CompiledTier],
        metrics: GatewayMetrics,
        *,
        whole: CompiledPool | None = None,
    ) -> None:
        """``whole``: the compiled pool when ``pool`` is this replica's share of it (a
        request too large for the share but not for the pool then waits, see
        :meth:`AdmissionController.reconfigure`)."""
        self.pool = pool
        self.controllers: dict[str, AdmissionController] = {}
        self._reserved: dict[str, str] = {}  # reservation id -> track
        # a request of the tier given waits, none ahead of it (the lease keeper renews)
        self.on_queued: Callable[[str], None] | None = None
        self._build_controllers(pool, tiers, whole)
        self.metrics = metrics
        self._waiters: dict[str, asyncio.Future[Admit | Reject]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at: float | None = None
        self._ejected: set[str] = set()  # replicas out of routing (outlier ejection)

    @staticmethod
    def now() -> float:
        """The admission clock (the loop's monotonic time)."""
        return asyncio.get_running_loop().time()

    @property
    def controller(self) -> AdmissionController:
        """The stable track's controller (the pool's plan)."""
        return self.controllers[STABLE]

    def _track_pool(self, pool: CompiledPool, track: str) -> CompiledPool | None:
        if track == STABLE:
            return build_track_pool(pool, STABLE) or pool.model_copy(update={"tracks": []})
        return build_track_pool(pool, track)

    def _whole_view(self, whole: CompiledPool | None, track: str) -> CompiledPool | None:
        return None if whole is None else self._track_pool(whole, track)

    def _build_controllers(
        self, pool: CompiledPool, tiers: Sequence[CompiledTier], whole: CompiledPool | None
    ) -> None:
        for track in [STABLE, *(t.name for t in pool.tracks if t.name != STABLE)]:
            view = self._track_pool(pool, track)
            if view is not None:
                self.controllers[track] = AdmissionController(
                    view, tiers, whole=self._whole_view(whole, track)
                )

    def _controller_for(self, request: AdmissionRequest) -> tuple[str, AdmissionRequest]:
        track = request.track or STABLE
        if track not in self.controllers or (
            track != STABLE and not any(t.name == track for t in self.pool.tracks)
        ):
            # the track has no controller (no plan of its own): admit on stable
            return STABLE, dataclasses.replace(request, track=STABLE if request.track else None)
        return track, request

    async def admit(self, request: AdmissionRequest) -> Admit | Reject:
        """Offer the request on its track; wait if queued. Cancelling the caller withdraws it."""
        track, request = self._controller_for(request)
        self._reserved[request.request_id] = track
        try:
            return await self._admit(track, request)
        finally:
            self._forget_unless_admitted(request.request_id, track)

    def _forget_unless_admitted(self, request_id: str, track: str) -> None:
        controller = self.controllers.get(track)
        if controller is None or controller.verdict_of(request_id) != "admitted":
            self._reserved.pop(request_id, None)

    async def _admit(self, track: str, request: AdmissionRequest) -> Admit | Reject:
        verdict = self.controllers[track].offer(request, self.now())
        if not isinstance(verdict, Queue):
            self._record(verdict)
            self._schedule_expiry()
            return verdict
        self.metrics.decisions.labels(self.pool.name, request.tier, "queued").inc()
        if self.on_queued is not None and verdict.ahead_tokens <= 0:
            # only the head of a queue asks for an early renewal: behind it, a queue that
            # stays long (a flood) has asked already, and the periodic renewal follows it
            self.on_queued(request.tier)
        future: asyncio.Future[Admit | Reject] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = future
        self._schedule_expiry()
        try:
            result = await future
        except asyncio.CancelledError:
            self._withdraw(track, request.request_id, future)
            raise
        finally:
            self._waiters.pop(request.request_id, None)
        self._record(result)
        return result

    def _withdraw(
        self, track: str, request_id: str, future: asyncio.Future[Admit | Reject]
    ) -> None:
        if future.done() and not future.cancelled():
            result = future.result()
            if isinstance(result, Admit):
                self.release(result.reservation_id)
            return
        self._apply(self.controllers[track].cancel(request_id, self.now()), track)

    def release(self, reservation_id: str, actual_tokens: int | None = None) -> None:
        """End a reservation (idempotent) and start whatever can start now."""
        track = self._reserved.pop(reservation_id, STABLE)
        controller = self.controllers.get(track) or self.controller
        self._apply(controller.release(reservation_id, self.now(), actual_tokens), track)
        self._drop_retired()

    def first_token(self, reservation_id: str) -> None:
        """The request's first token was relayed: lower tiers may use its replica again."""
        track = self._reserved.get(reservation_id, STABLE)
        controller = self.controllers.get(track) or self.controller
        self._apply(controller.first_token(reservation_id, self.now()), track)

    def reconfigure(
        self,
        pool: CompiledPool,
        tiers: Sequence[CompiledTier],
        *,
        whole: CompiledPool | None = None,
    ) -> None:
        """Adopt a new plan on every track, keeping in-flight reservations (``whole`` as
        in the constructor)."""
        old, self.pool = self.pool, pool
        listed = {t.name for t in pool.tracks} | {STABLE}
        for track in sorted(listed | set(self.controllers)):
            view = self._track_pool(pool, track) if track in listed else None
            controller = self.controllers.get(track)
            if view is None and controller is not None:
                # the track left the config: route nothing new to it; its queue is
                # rejected at its deadline and its reservations end normally
                view = self._retired_view(old, track)
            if view is None:
                continue
            entire = self._whole_view(whole, track) if track in listed else None
            if controller is None:
                self.controllers[track] = AdmissionController(view, tiers, whole=entire)
            else:
                self._apply(controller.reconfigure(view, tiers, self.now(), whole=entire), track)
        for name in self._ejected:  # a new config does not bring an ejected replica back
            for track, controller in list(self.controllers.items()):
                self._apply(controller.set_replica_ready(name, False, self.now()), track)
        self._drop_retired()

    def _each(self, call: Callable[[AdmissionController], Wakeups]) -> None:
        """Apply one mutation to every track's controller."""
        for track, controller in list(self.controllers.items()):
            self._apply(call(controller), track)

    def set_borrowing_paused(self, paused: bool) -> None:
        """Pause (or resume) borrowing: the engines' measured KV usage is near the target."""
        self._each(lambda c: c.set_borrowing_paused(paused, self.now()))

    def set_admission_until(self, until: float | None) -> None:
        """Start nothing from ``until`` (the loop's clock) on: the end of this replica's
        capacity lease (None: no end)."""
        self._each(lambda c: c.set_admission_until(until, self.now()))

    def set_tenant_limits(self, track: str, limits: Mapping[str, int] | None) -> None:
        """This replica's leased part of each limited tenant's maxConcurrency on a track."""
        controller = self.controllers.get(track)
        if controller is not None:
            self._apply(controller.set_tenant_limits(limits, self.now()), track)

    def set_lent_limit(self, tier: str, limit: int | None) -> None:
        """Limit the requests of tiers below ``tier`` running on borrowed capacity."""
        self._each(lambda c: c.set_lent_limit(tier, limit, self.now()))

    def set_replica_ejected(self, name: str, ejected: bool) -> None:
        """Take a replica out of routing, or put it back if the config lists it ready
        (outlier ejection decides when: :mod:`kvpool.gateway.ejection`)."""
        if ejected:
            self._ejected.add(name)
            self._each(lambda c: c.set_replica_ready(name, False, self.now()))
            return
        self._ejected.discard(name)
        if any(e.ready and e.name == name for t in self.pool.tracks for e in t.endpoints):
            self._each(lambda c: c.set_replica_ready(name, True, self.now()))

    def _retired_view(self, old: CompiledPool, track: str) -> CompiledPool:
        """The last view of a track that left the config, with no ready endpoint."""
        stale = next((t for t in old.tracks if t.name == track), None)
        view = self._track_pool(old, track) or old
        if stale is None:
            return view.model_copy(update={"tracks": []})
        endpoints = [e.model_copy(update={"ready": False}) for e in stale.endpoints]
        gone = stale.model_copy(update={"endpoints": endpoints, "weight": 0})
        return view.model_copy(update={"tracks": [gone]})

    def _drop_retired(self) -> None:
        listed = {t.name for t in self.pool.tracks}
        for track in [t for t in self.controllers if t != STABLE and t not in listed]:
            busy = track in self._reserved.values()
            if not busy and self.controllers[track].next_deadline() is None:
                del self.controllers[track]

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
                        retry_after_seconds=DEFAULT_RETRY_AFTER,
                    )
                )
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = None

    def snapshot(self) -> AdmissionSnapshot:
        """The stable track's in-use vs plan view (the pool's plan)."""
        return self.controller.snapshot()

    def track_snapshots(self) -> list[tuple[str, AdmissionSnapshot]]:
        """Every track's in-use vs plan view, stable first (a canary with its own plan, and
        a retired track while its requests finish)."""
        return [(track, c.snapshot()) for track, c in self.controllers.items()]

    def _record(self, verdict: Admit | Reject) -> None:
        tier = verdict.tier
        self.metrics.decisions.labels(self.pool.name, tier, verdict.outcome).inc()
        if isinstance(verdict, Admit):
            self.metrics.queue_seconds.labels(self.pool.name, tier).observe(verdict.queued_seconds)
            if verdict.preempts:
                self.metrics.preempt_admissions.labels(self.pool.name).inc()

    def _apply(self, wakeups: Wakeups, track: str = STABLE) -> None:
        verdicts: list[Admit | Reject] = [*wakeups.admitted, *wakeups.rejected]
        controller = self.controllers.get(track) or self.controller
        for verdict in verdicts:
            future = self._waiters.get(verdict.request_id)
            if future is not None and not future.done():
                future.set_result(verdict)
            elif isinstance(verdict, Admit):
                # its caller is gone (cancelled between the decision and now): give it back
                self._reserved.pop(verdict.reservation_id, None)
                self._apply(controller.release(verdict.reservation_id, self.now()), track)
        self._schedule_expiry()

    def _schedule_expiry(self) -> None:
        deadlines = [d for c in self.controllers.values() if (d := c.next_deadline()) is not None]
        deadline = min(deadlines) if deadlines else None
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
        for track, controller in list(self.controllers.items()):
            self._apply(controller.expire(self.now()), track)
        self._drop_retired()
