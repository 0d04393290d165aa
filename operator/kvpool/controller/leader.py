"""One active operator replica: Kubernetes Lease leader election (coordination.k8s.io/v1).

Why it exists: the chart runs ``operator.replicas: 2`` so that a node loss does not stop
reconciling; only one replica may act. Every replica runs kopf and keeps its cache warm
(a hot standby), but the work queues run only while :attr:`LeaderElector.leading` is
true. The decision is pure (:mod:`kvpool.domain.leadership`); this module reads and
writes the Lease every ``retry`` seconds:

- a standby acquires the Lease once it is released or expired (``leaseDurationSeconds``
  after its holder's last renew), then requests a reconcile of everything it knows;
- a leader that cannot renew for ``renew_deadline`` (2/3 of the duration) stops acting
  before any standby may take over, and tries to acquire again like a standby. That
  deadline is this process's own and runs on the monotonic clock: a wall clock stepped
  back while renewals fail must not stretch it (the Lease's times, which other replicas
  read, are wall-clock times, as in Kubernetes' own leader election);
- on shutdown the leader releases the Lease (empty holder), so a standby takes over at
  its next retry instead of after the whole duration.

The identity defaults to the host name, which in a pod is the pod name: a restarted
container of the same pod re-acquires its own Lease at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvpool.adapters import kube
from kvpool.controller.clock import Clock, SystemClock
from kvpool.domain.leadership import Acquire, Follow, decide_lease, still_leading

log = logging.getLogger(__name__)


@dataclass
class LeaderElector:
    """Keeps (or waits for) the Lease ``namespace/name`` for ``identity``."""

    client: kube.KubeClient
    namespace: str
    name: str
    identity: str
    duration: float = 15.0  # leaseDurationSeconds
    clock: Clock = field(default_factory=SystemClock)  # injected in tests
    on_started: Callable[[], Awaitable[None]] | None = None  # called once per acquisition
    on_stopped: Callable[[], None] | None = None  # called when leadership is lost
    leading: bool = field(default=False, init=False)
    _renewed: float | None = field(default=None, init=False)  # last good write (monotonic)
    _acquired: float | None = field(default=None, init=False)  # wall clock, for the Lease

    @property
    def retry(self) -> float:
        """Seconds between attempts (a fifth of the duration, at most 2 s)."""
        return min(self.duration / 5, 2.0)

    @property
    def renew_deadline(self) -> float:
        return self.duration * 2 / 3

    async def step(self) -> None:
        """One round: read the Lease, decide, write; update :attr:`leading`."""
        now, started = self.clock.wall(), self.clock.monotonic()
        try:
            current = await self.client.get(kube.LEASES, self.namespace, self.name)
            record = kube.lease_record(current)
            verdict = decide_lease(record, self.identity, now)
            if isinstance(verdict, Follow):
                self._set(False)
                return
            if isinstance(verdict, Acquire):
                transitions, self._acquired = verdict.transitions, now
            else:
                transitions = record.transitions if record is not None else 0
            spec = kube.build_lease_spec(
                self.identity, self.duration, now, transitions, self._acquired
            )
            if await kube.write_lease(self.client, self.namespace, self.name, current, spec):
                self._renewed = started
                await self._became(True)
                return
        except kube.ApiError as exc:
            log.warning("leader election: %s", exc)
        if not still_leading(self._renewed, self.clock.monotonic(), self.renew_deadline):
            self._set(False)

    async def _became(self, leading: bool) -> None:
        was, self.leading = self.leading, leading
        if leading and not was:
            log.info("leader election: %s leads (Lease %s/%s)", self.identity, *self._where())
            if self.on_started is not None:
                await self.on_started()

    def _set(self, leading: bool) -> None:
        was, self.leading = self.leading, leading
        if was and not leading:
            log.warning("leader election: %s lost the Lease %s/%s", self.identity, *self._where())
            self._renewed = None
            if self.on_stopped is not None:
                self.on_stopped()

    def _where(self) -> tuple[str, str]:
        return self.namespace, self.name

    async def run(self) -> None:
        """Attempt every :attr:`retry` seconds until cancelled."""
        while True:
            await self.step()
            await self.clock.sleep(self.retry)

    async def release(self) -> None:
        """Give the Lease up (on shutdown) so a standby takes over at once."""
        if not self.leading:
            return
        self._set(False)
        try:
            current = await self.client.get(kube.LEASES, self.namespace, self.name)
            record = kube.lease_record(current)
            if record is None or record.holder != self.identity:
                return
            spec = kube.build_lease_spec("", 1, self.clock.wall(), record.transitions, None)
            await kube.write_lease(self.client, self.namespace, self.name, current, spec)
        except kube.ApiError as exc:
            log.warning("leader election: releasing the Lease failed: %s", exc)
