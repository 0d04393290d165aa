"""Capacity leases: this replica's share of each plan, following demand, renewed in Redis.

Why this module exists: with several gateway replicas, each admits against a *lease* of
every plan instead of a fixed percent (:mod:`kvpool.gateway.capacity`), so that capacity
goes where the requests are whatever the balancer does. :class:`LeaseKeeper` is the
:class:`~kvpool.gateway.capacity.CapacityShare` that does it:

- **renew** every ``period`` (and at once when a request here has to wait with nothing
  queued ahead of it, or another replica nudges): per plan (a pool's stable track, and a
  canary with a plan of its own) report the demand
  (:func:`~kvpool.domain.lease.model.report_of`), compute the desired lease on the last
  table of every replica's reports (:func:`~kvpool.domain.lease.plan_leases`), shrink to
  it locally *before* sending, and let the Redis script grant
  (:mod:`kvpool.adapters.lease.store`). When the others' reports the answer brings change
  what is desired, renew once more at once;
- **apply**: a pool whose lease moved is re-applied (``PoolRegistry.refresh_capacity``:
  its runtime adopts the new view, keeping every reservation in flight); every controller
  is told the lease's end (``set_admission_until``: a replica stopped past its lease starts
  nothing on it when it resumes), and its part of each limited tenant's ``maxConcurrency``;
- **fall back** while Redis is unreachable (:mod:`kvpool.domain.lease.fallback`: the last
  lease while valid, then the smaller of it and the equal split of the last known
  membership, then that equal split), with a log line at every change of mode and the
  ``kvpool_gateway_lease_mode`` gauge;
- **nudge**: after a renewal in which this replica has requests waiting, or gave capacity
  up, it publishes a nudge; the others renew at once, so capacity moves in a few Redis
  round trips rather than a few periods;
- **hurry** for a ``Preempt`` tier: a renewal woken early waits half a period after the
  last one (a flood keeps requests waiting everywhere), except when a request of a
  ``Preempt`` tier (the latency-sensitive one, whose floor one replica would find at
  once) waits here: then this replica renews at once and its nudge is *urgent*, so
  the replica that holds the floor renews at once too and its nudge that it gave the
  floor up is urgent as well; the chat waits three Redis round trips, not up to two
  half-periods. Urgency goes two nudges deep (``URGENT_HOPS``) and no renewal comes
  sooner than ``URGENT_GAP_SECONDS`` after the last;
- **leave**: a gateway that stops (SIGTERM: a rolling update, a scale-down) deletes its
  claims and membership once its requests have ended, and nudges, so the others take its
  capacity at once instead of when its claims expire.

The steps that only compute (a plan's demand report, the lease wished for, the leased pool
view) are in :mod:`kvpool.gateway.lease_plans`.

Membership follows the renewals (the script counts the live members), so nobody sets N:
the engine poll period and, while Redis is down, the equal split use the live count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from kvpool.adapters.lease.store import LeaseStoreError, PlanRenewal, RedisLeaseStore
from kvpool.api.admission_config import (
    AdmissionConfig,
    CompiledPool,
    CompiledTenant,
    CompiledTier,
)
from kvpool.domain.admission import AdmissionSnapshot
from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.lease import (
    Lease,
    LeaseClock,
    LeaseMode,
    Report,
    apply_lease,
    build_lease_plan,
    decide_lease_mode,
    equal_split,
    shrunk,
    tenant_shares_in_mode,
)
from kvpool.domain.lease.model import held_components, shrink_to, smaller_somewhere
from kvpool.gateway.lease_metrics import LeaseMetrics
from kvpool.gateway.lease_plans import LeasedPlan, leased_pool, track_views
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pool_runtime import PoolRuntime

log = logging.getLogger("kvpool.gateway")

# A renewal woken early (a request waits here, a peer nudged) comes at most this fraction
# of a period after the last one: under a flood every replica always has requests waiting,
# and renewing at each of them made four replicas renew ~50 times a second each.
WAKE_GAP_FRACTION = 0.5
# ... except for a request of a Preempt tier that waits here (module docstring: hurry);
# the gap bounds even a flood of waiting chats to 100 renewals a second a replica
URGENT_GAP_SECONDS = 0.01
# a hurried renewal's nudge is urgent for the replicas that may give (hop 2), and theirs,
# that they gave it, for the replica that waits (hop 1); nothing urgent after that
URGENT_HOPS = 2


def default_member_id() -> str:
    """This replica's id: its pod name (``POD_NAME``, the chart sets it), else host and pid,
    with a random suffix so that a restarted process is a new member."""
    base = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    return f"{base}-{random.getrandbits(24):06x}"


class LeaseKeeper:
    """A :class:`~kvpool.gateway.capacity.CapacityShare` by capacity leases (see above)."""

    def __init__(
        self,
        store: RedisLeaseStore,
        metrics: GatewayMetrics,
        *,
        member: str | None = None,
        clock: LeaseClock | None = None,
    ) -> None:
        self.store = store
        self.member = member or default_member_id()
        self.clock = clock or LeaseClock(redis_timeout=store.timeout)
        self.metrics = LeaseMetrics(metrics)
        self._plans: dict[tuple[str, str], LeasedPlan] = {}
        self._runtimes: Callable[[], dict[str, PoolRuntime]] = dict
        self._refresh: Callable[[str], None] = lambda _pool: None
        self._applied: dict[tuple[str, str], Lease] = {}  # the effective lease last applied
        self._tenant_limits: dict[str, int] = {}  # tenant -> maxConcurrency (limited only)
        self._members = 1
        self._settled = False  # a renewal answered outside Redis's warm-up since start
        self._last_ok: float | None = None
        self._failing_since: float | None = None
        self._mode = LeaseMode.NONE
        self._wake = asyncio.Event()
        self._urgency = 0  # the next renewal's urgent nudge hops + 1 (0: not urgent)
        self._urgent = asyncio.Event()  # _urgency was raised
        self._last_start = float("-inf")
        self._nudged_for: dict[tuple[str, str], dict[str, int]] = {}  # the wish last nudged
        self._set_mode(LeaseMode.NONE, quiet=True)

    # -- CapacityShare ---------------------------------------------------------------------

    def attach(
        self,
        runtimes: Callable[[], dict[str, PoolRuntime]],
        refresh: Callable[[str], None],
    ) -> None:
        """Where the runtimes are and how to re-apply a pool's share (the registry's)."""
        self._runtimes, self._refresh = runtimes, refresh
        for pool, runtime in runtimes().items():
            runtime.on_queued = partial(self._queued, pool)

    def configure(self, config: AdmissionConfig) -> None:
        """A new config: its tenants' ``maxConcurrency`` is leased too."""
        self._tenant_limits = {
            t.tenant: t.max_concurrency for t in config.tenants if t.max_concurrency is not None
        }

    def pool_view(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> CompiledPool:
        """The pool as this replica admits it: each track's plan replaced by its lease."""
        views = track_views(pool)
        for key in [k for k in self._plans if k[0] == pool.name and k[1] not in views]:
            del self._plans[key]
        leased: dict[str, CompiledPool] = {}
        for track, view in views.items():
            state = self._plans.get((pool.name, track))
            plan = build_lease_plan(view, tiers, self._tenant_limits)
            if state is None:
                state = self._plans[(pool.name, track)] = LeasedPlan(pool.name, track, view, plan)
            else:
                state.view, state.plan = view, plan
            effective = self._effective(state)
            self._applied[(pool.name, track)] = effective
            leased[track] = apply_lease(view, plan, effective)
        return leased_pool(pool, leased)

    def tenant_view(self, tenant: CompiledTenant, pool: str) -> CompiledTenant:
        """Unchanged: the leased part of a tenant's limit is set on the controllers."""
        return tenant

    def poll_period(self, seconds: float) -> float:
        """The live replicas share each engine's poll budget."""
        return seconds * max(1, self._members)

    def unready_reason(self) -> str | None:
        """Why this replica cannot admit (for ``/readyz``), or None."""
        if self._mode is LeaseMode.NONE:
            return "no capacity lease yet (Redis not reached since start)"
        if not self._settled:
            return (
                "Redis has just started: leases grow once every replica's claims are known,"
                f" one member TTL ({self.clock.member_ttl:g} s) after its first renewal"
            )
        return None

    @property
    def mode(self) -> LeaseMode:
        """How this replica admits right now."""
        return self._mode

    @property
    def members(self) -> int:
        """Live gateway replicas at the last renewal."""
        return self._members

    # -- the loop --------------------------------------------------------------------------

    async def leave(self) -> None:
        """Give every claim back now (the gateway stopped, its requests ended, the renewals
        too): the others are nudged and grow at their next renewal instead of a member TTL
        later. If Redis does not answer, the claims expire as a dead replica's do."""
        plans = sorted(self._plans)
        try:
            await self.store.leave(self.member, plans)
        except LeaseStoreError as exc:
            log.warning(
                "lease: could not give this replica's capacity back (%s); the others take "
                "it when its claims expire, within %g s",
                exc,
                self.clock.member_ttl,
            )
        else:
            log.info("lease: capacity of %d plans given back to the other replicas", len(plans))
        finally:
            await self.store.close()

    def wake(self, urgency: int = 0) -> None:
        """Renew soon (a request had to wait here, or another replica nudged); with
        ``urgency`` (hops + 1 for the nudge that follows), as soon as the urgent gap allows."""
        if urgency > self._urgency:
            self._urgency = urgency
            self._urgent.set()
        self._wake.set()

    def _nudged(self, hops: int) -> None:
        """Another replica nudged, urgent for ``hops`` more hops: never more than a
        waiting chat's own nudge says, whatever the channel carries (a longer chain would
        keep every replica renewing at the urgent gap)."""
        self.wake(min(hops, URGENT_HOPS))

    def _queued(self, pool: str, tier: str) -> None:
        """A request of ``tier`` waits here in ``pool`` with none ahead of it: renew, and
        hurry if the tier is a ``Preempt`` one in that pool's plans (module docstring; two
        pools' policies may name a tier alike and reclaim it differently)."""
        urgent = any(
            tier in state.plan.preempt for state in self._plans.values() if state.pool == pool
        )
        self.wake(URGENT_HOPS + 1 if urgent else 0)

    async def run(self) -> None:
        """Renew until cancelled; listen for the other replicas' nudges meanwhile."""
        listener = asyncio.create_task(self._listen(), name="kvpool:lease nudges")
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.clock.period)
                self._wake.clear()
                await self._keep_gap()
                urgency, self._urgency = self._urgency, 0
                self._urgent.clear()
                if urgency:
                    cause = "waiting" if urgency > URGENT_HOPS else "nudge"
                    self.metrics.hurried.labels(cause).inc()
                try:
                    await self.renew(urgency)
                except Exception:  # one bad renewal must not end the keeper
                    log.exception("lease renewal failed unexpectedly")
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener

    async def _keep_gap(self) -> None:
        """Wait until the wake gap after the last renewal's start has passed: half a
        period, or ``URGENT_GAP_SECONDS`` once something urgent waits (also when the
        urgency comes while this waits)."""
        loop = asyncio.get_running_loop()
        normal = self.clock.period * WAKE_GAP_FRACTION
        while True:
            least = min(normal, URGENT_GAP_SECONDS) if self._urgency else normal
            rest = self._last_start + least - loop.time()
            if rest <= 0:
                return
            if self._urgency:
                await asyncio.sleep(rest)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), rest)

    async def _listen(self) -> None:
        while True:
            try:
                await self.store.listen(self.member, self._nudged)
            except LeaseStoreError:
                await asyncio.sleep(max(self.clock.period, 0.5))

    async def renew(self, urgency: int = 0) -> None:
        """One renewal of every plan (and one more at once if the answer moved what is
        desired); applies the result or the fallback. ``urgency``: this renewal's nudge
        is urgent for ``urgency - 1`` more hops (module docstring: hurry)."""
        loop = asyncio.get_running_loop()
        self._last_start = loop.time()
        plans = [p for p in self._plans.values() if p.pool in self._runtimes()]
        if not plans:
            return
        tables = {p.key: p.table for p in plans}
        gave_up, asked, sent = await self._call(plans, loop)
        if self._mode is LeaseMode.LEASED:
            # the answer brought a fresher table: where the others' reports moved, ask again
            # if they change the wish for the demand just sent (a change here since then is
            # the next renewal's; recomputing the allocation for it was a third of a
            # replica's renewal samples in a profile)
            again = [
                p
                for p in plans
                if p.table != tables[p.key]
                and p.desired(self.member, sent[p.key]).components() != asked[p.key]
            ]
            if again:
                gave_up_again, _, _ = await self._call(again, loop)
                gave_up |= gave_up_again
        self._apply(loop.time())
        hops = max(0, urgency - 1)
        # the replica where a chat waits nudges even about a wish it nudged about before
        # (a holder may be sleeping out its gap on that plain nudge); the others only when
        # they gave something up or wish anew, so a flood of chats everywhere does not
        # make every urgent renewal wake every replica again
        if self._mode is LeaseMode.LEASED and (
            gave_up or self._new_unmet_wish(plans, asked, again=hops >= URGENT_HOPS)
        ):
            with contextlib.suppress(LeaseStoreError):
                await self.store.nudge(self.member, hops)

    def _new_unmet_wish(
        self,
        plans: list[LeasedPlan],
        asked: dict[tuple[str, str], dict[str, int]],
        *,
        again: bool = False,
    ) -> bool:
        """Whether requests wait here for capacity another replica holds, with a wish the
        others have not been nudged about yet (a flood that stays at its fair share
        nudges once, not at every renewal); ``again``: nudged about or not (urgent)."""
        unmet: dict[tuple[str, str], dict[str, int]] = {}
        for key, wish in asked.items():
            state = self._plans.get(key)
            if state is None:  # a reload removed it meanwhile
                continue
            granted = state.granted.components()
            if any(v > granted.get(c, 0) for c, v in wish.items()):
                unmet[key] = wish
        if not unmet or not self._waiting(plans):
            self._nudged_for = {}
            return False
        if unmet == self._nudged_for and not again:
            return False
        self._nudged_for = unmet
        return True

    async def _call(
        self, plans: list[LeasedPlan], loop: asyncio.AbstractEventLoop
    ) -> tuple[bool, dict[tuple[str, str], dict[str, int]], dict[tuple[str, str], Report]]:
        """One script call for ``plans``: whether this replica gave capacity up, and per
        plan the desired lease it asked for and the report it sent."""
        now = loop.time()
        renewals: list[PlanRenewal] = []
        asked: dict[tuple[str, str], dict[str, int]] = {}
        sent_reports: dict[tuple[str, str], Report] = {}
        # per plan, what of its floors this replica may lend at home (part lent away)
        lendable_here: dict[tuple[str, str], Mapping[str, Amount]] = {}
        gave_up = False
        for state in plans:
            snapshot, tenants = self._usage(state)
            report = state.report(snapshot, tenants, now)
            desired = state.desired(self.member, report)
            lendable_here[state.key] = desired.lendable_here
            smaller = shrink_to(state.lease, desired)
            if smaller.components() != state.lease.components():
                state.lease = replace(smaller, lendable_here=desired.lendable_here)
                gave_up = True
                self._refresh(state.pool)  # give it up here before Redis hands it out
                snapshot, tenants = self._usage(state)  # the shrink may have moved them
            # an expired lease holds nothing but what runs: after a stop past the lease
            # TTL its capacity may have gone to the others (with Redis restarted, the
            # warm-up would grant it back to this replica while they hold it)
            holding = state.lease if self._lease_valid(now) else Lease()
            held = held_components(
                holding,
                snapshot.tiers if snapshot is not None else (),
                Amount(snapshot.shared_used_tokens, snapshot.shared_used_slots)
                if snapshot is not None
                else ZERO,
                {t: n for t, (n, _) in tenants.items()},
                in_use=Amount(snapshot.in_use_tokens, snapshot.in_use_slots)
                if snapshot is not None
                else ZERO,
                previous=state.claim,
            )
            plan = state.in_play(report)
            asked[state.key] = desired.components()
            sent_reports[state.key] = report
            renewals.append(
                PlanRenewal(
                    state.pool, state.track, plan.groups(), desired.components(), held, report
                )
            )
        sent = loop.time()
        try:
            answer = await self.store.renew(self.member, renewals, member_ttl=self.clock.member_ttl)
        except LeaseStoreError as exc:
            self.metrics.renewals.labels("error").inc()
            if self._failing_since is None:
                self._failing_since = sent
                log.warning("lease renewal failed (%s): keeping the last lease while valid", exc)
            self._update_mode(loop.time())
            return gave_up, asked, sent_reports
        self.metrics.renewals.labels("ok").inc()
        self.metrics.renewal_seconds.observe(loop.time() - sent)
        if self._failing_since is not None:
            log.info("lease renewal answered again after %.1f s", sent - self._failing_since)
        self._last_ok, self._failing_since = sent, None
        self._members = max(1, answer.members)
        self._settled = self._settled or not answer.warming
        for state, grant in zip(plans, answer.plans, strict=True):
            state.table = {m: r for m, r in grant.reports.items() if m != self.member}
            state.granted = Lease.from_components(grant.granted)
            state.claim = grant.claim
            if smaller_somewhere(state.granted, state.lease):
                gave_up = True
            self.metrics.count_handover(state.pool, state.lease, state.granted)
            state.lease = replace(state.granted, lendable_here=lendable_here[state.key])
        self._update_mode(loop.time())
        return gave_up, asked, sent_reports

    # -- demand ----------------------------------------------------------------------------

    def _usage(
        self, state: LeasedPlan
    ) -> tuple[AdmissionSnapshot | None, dict[str, tuple[int, int]]]:
        runtime = self._runtimes().get(state.pool)
        controller = runtime.controllers.get(state.track) if runtime is not None else None
        if controller is None:
            return None, {}
        limited = self._tenant_limits
        tenants = {t: c for t, c in controller.tenant_requests().items() if t in limited}
        return controller.snapshot(), tenants

    def _waiting(self, plans: list[LeasedPlan]) -> bool:
        for state in plans:
            snapshot, _ = self._usage(state)
            if snapshot is not None and snapshot.queued:
                return True
        return False

    # -- applying --------------------------------------------------------------------------

    def _effective(self, state: LeasedPlan) -> Lease:
        """What this replica admits against in the current mode."""
        if self._mode is LeaseMode.LEASED:
            return state.lease
        equal = equal_split(state.plan, self._members)
        if self._mode is LeaseMode.SHRUNK:
            return shrunk(state.lease, equal)
        if self._mode is LeaseMode.EQUAL:
            return equal
        return Lease()

    def _lease_valid(self, now: float) -> bool:
        """Whether the last granted lease still holds at ``now`` (it ends a lease TTL after
        the renewal that granted it)."""
        return self._last_ok is not None and now < self._last_ok + self.clock.lease_ttl

    def _update_mode(self, now: float) -> None:
        mode = decide_lease_mode(
            now, last_ok=self._last_ok, failing_since=self._failing_since, clock=self.clock
        )
        if mode is not self._mode:
            self._set_mode(mode)

    def _set_mode(self, mode: LeaseMode, *, quiet: bool = False) -> None:
        before, self._mode = self._mode, mode
        for m in LeaseMode:
            self.metrics.mode.labels(m.value).set(1 if m is mode else 0)
        if not quiet:
            log.warning(
                "lease mode %s -> %s (%d live replicas at the last renewal)%s",
                before.value,
                mode.value,
                self._members,
                _MODE_NOTES.get(mode, ""),
            )

    def _apply(self, now: float) -> None:
        """Re-apply every pool's effective lease, its end, and its tenant limits."""
        self._update_mode(now)
        if self._mode is LeaseMode.LEASED and self._last_ok is not None:
            until: float | None = self._last_ok + self.clock.lease_ttl
        elif self._mode in (LeaseMode.SHRUNK, LeaseMode.EQUAL):
            until = now + 3 * self.clock.period  # renewed by this loop while it runs
        else:
            until = now
        runtimes = self._runtimes()
        moved = {
            state.pool
            for key, state in self._plans.items()
            if _admits_differently(self._effective(state), self._applied.get(key, Lease()))
        }
        for pool in moved:
            self._refresh(pool)  # calls pool_view: applies and records the new leases
        for state in self._plans.values():
            runtime = runtimes.get(state.pool)
            if runtime is None:
                continue
            runtime.on_queued = partial(self._queued, state.pool)
            effective = self._effective(state)
            runtime.set_tenant_limits(state.track, self._tenant_shares(state))
            self.metrics.export_lease(state.pool, state.track, state.plan.tiers, effective)
        for runtime in runtimes.values():
            runtime.set_admission_until(until)
        if self._last_ok is not None:
            self.metrics.age.set(max(0.0, now - self._last_ok))
        self.metrics.members.set(self._members)

    def _tenant_shares(self, state: LeasedPlan) -> dict[str, int]:
        return tenant_shares_in_mode(
            self._mode,
            state.lease.tenants,
            state.plan.tenants,
            self._members,
            failing=self._failing_since is not None,
        )


_MODE_NOTES = {
    LeaseMode.SHRUNK: ": Redis unreachable, admitting against the smaller of the last lease "
    "and the equal split",
    LeaseMode.EQUAL: ": Redis unreachable, admitting against the equal split of the plans",
    LeaseMode.EXPIRED: ": the lease ran out without a renewal (was this process stopped?); "
    "admitting nothing until Redis answers",
    LeaseMode.LEASED: "",
}


def _admits_differently(lease: Lease, applied: Lease) -> bool:
    """Whether ``lease`` gives this replica another pool view than ``applied``: another
    claim, or another part of its floors lendable here (part lent to the others)."""
    return (
        lease.components() != applied.components() or lease.lendable_here != applied.lendable_here
    )
