"""The shared budget store with a circuit breaker and a per-tier answer for when it is down.

Why this module exists: Redis being slow or gone must neither stall requests nor silently
change verdicts. This wrapper is the only place that decides what a failed call means:

- **Circuit breaker.** ``failure_threshold`` (3) *consecutive* failed calls open it; one
  slow call does not (each call is still bounded by the store's own timeout). While open,
  Redis is not asked at all for ``open_seconds`` (1 s); then the breaker is *half-open*: one
  call is let through as a probe, and its success closes the breaker while its failure
  opens it again. So an outage costs nothing per request, and recovery is noticed within
  ``open_seconds`` of Redis answering again.
- **Per-tier behaviour** (TierPolicy ``budgetUnavailable``, compiled into the config; the
  ``--fail-closed-tier`` flag is only the default for tiers that do not declare it):
  ``Allow`` charges the request against a *local allowance*, an in-memory budget of
  ``local_fraction`` (10 %) of each limit per gateway process (availability kept, overshoot
  bounded by replicas x 10 % per window) - or, where the replicas count each other
  (capacity leases, docs/0008), 10 % for all of them together, each live replica its
  equal part; ``Reject`` answers :class:`BudgetUnavailable`
  (503 with ``Retry-After``). A call that failed while the breaker was still closed gets
  the same fallback verdict.

Every fallback verdict is reported through ``on_fallback(tier, result)`` with result
``local`` (decided by the local allowance, admit or deny) or ``reject`` (503): the metric
``kvpool_gateway_budget_fallback_total{tier,result}``; a fail-closed tier never counts
``local``. Failed calls are reported through ``on_error(op, exc)`` and logged.

Settlement: a charge made on the local allowance settles locally; a Redis charge whose
settlement fails (or is skipped while the breaker is open) stays charged at its
reservation - conservative, the tenant loses at most that reservation's difference.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvpool.adapters.budget.memory import InMemoryBudgetStore
from kvpool.adapters.budget.protocol import (
    BudgetStore,
    BudgetStoreError,
    BudgetUnavailable,
    StoreVerdict,
    UnavailableMode,
)
from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import BudgetAllow, BudgetCharge, WindowUsage, scale_limits

log = logging.getLogger("kvpool.budget")

LOCAL_ORIGIN = "local"
RESULT_LOCAL = "local"
RESULT_REJECT = "reject"


@dataclass(frozen=True)
class FailoverPolicy:
    """How the wrapper behaves while the shared store fails (see the module docstring)."""

    fail_closed_tiers: frozenset[str] = frozenset()  # default Reject for these tiers
    local_fraction: float = 0.1  # Allow: local allowance per process, share of each limit
    failure_threshold: int = 3  # consecutive failures that open the breaker
    open_seconds: float = 1.0  # how long an open breaker keeps the store out of the path

    def mode(self, tier: str | None, declared: UnavailableMode | None) -> UnavailableMode:
        """The tier's declared behaviour, else the flag default (Allow unless listed)."""
        if declared is not None:
            return declared
        return "Reject" if tier is not None and tier in self.fail_closed_tiers else "Allow"


class CircuitBreaker:
    """Closed -> (N consecutive failures) -> open -> (after ``open_seconds``) half-open:
    one probe call; success closes, failure re-opens."""

    def __init__(
        self, failure_threshold: int, open_seconds: float, clock: Callable[[], float]
    ) -> None:
        self.failure_threshold = max(1, failure_threshold)
        self.open_seconds = open_seconds
        self._clock = clock
        self.failures = 0  # consecutive
        self._open_until: float | None = None
        self._probing = False

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open``."""
        if self._open_until is None:
            return "closed"
        return "open" if self._clock() < self._open_until else "half-open"

    def allow(self) -> bool:
        """Whether a call may go to the store now (claims the probe when half-open)."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self._probing:
            return False
        self._probing = True
        return True

    def abandon(self) -> None:
        """A call that ended without a verdict (cancelled): free the probe slot."""
        self._probing = False

    def success(self) -> None:
        self.failures = 0
        self._open_until = None
        self._probing = False

    def failure(self) -> bool:
        """Record a failure; True when this opened (or re-opened) the breaker."""
        self.failures += 1
        if self._probing or (self._open_until is None and self.failures >= self.failure_threshold):
            self._open_until = self._clock() + self.open_seconds
            self._probing = False
            return True
        return False


class FailoverBudgetStore:
    """A shared store behind a circuit breaker, with a local allowance (see module doc)."""

    remote = True

    def __init__(
        self,
        primary: BudgetStore,
        policy: FailoverPolicy | None = None,
        *,
        on_error: Callable[[str, BaseException], None] | None = None,
        on_fallback: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        replicas: Callable[[], int] | None = None,
    ) -> None:
        """``replicas``: the live gateway replicas (capacity leases count them); the local
        allowance is then ``local_fraction`` of each limit for all of them together, so the
        overshoot while Redis is down does not grow with the replicas (None: per process)."""
        self.primary = primary
        self._replicas = replicas
        self.policy = policy or FailoverPolicy()
        self.breaker = CircuitBreaker(
            self.policy.failure_threshold, self.policy.open_seconds, clock
        )
        self._on_error = on_error
        self._on_fallback = on_fallback
        self._local = InMemoryBudgetStore()
        self.errors = 0

    @property
    def available(self) -> bool:
        """False while the breaker keeps the shared store out of the request path."""
        return self.breaker.state != "open"

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors += 1
        opened = self.breaker.failure()
        log.warning(
            "budget store %s failed (%s)%s",
            op,
            exc,
            f"; breaker open for {self.policy.open_seconds:g}s" if opened else "",
        )
        if self._on_error is not None:
            self._on_error(op, exc)

    async def reserve(
        self,
        subject: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
        when_unavailable: UnavailableMode | None = None,
    ) -> StoreVerdict:
        if limits and self.breaker.allow():
            try:
                verdict = await self.primary.reserve(subject, limits, tokens, now, tier)
            except BudgetStoreError as exc:
                self._failed("reserve", exc)
            except BaseException:  # cancelled (client gone): no verdict on Redis either way
                self.breaker.abandon()
                raise
            else:
                self.breaker.success()
                return verdict
        elif not limits:
            return self._local.reserve_now(subject, limits, tokens, now)
        return self._fallback(subject, limits, tokens, now, tier, when_unavailable)

    def _fallback(
        self,
        subject: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None,
        declared: UnavailableMode | None,
    ) -> StoreVerdict:
        label = tier or ""
        if self.policy.mode(tier, declared) == "Reject":
            self._report(label, RESULT_REJECT)
            return BudgetUnavailable(
                retry_after=max(1.0, self.policy.open_seconds),
                reason=f"budget store unavailable; tier {label!r} fails closed",
            )
        self._report(label, RESULT_LOCAL)
        share = self.policy.local_fraction
        if self._replicas is not None:
            share /= max(1, self._replicas())
        local_limits = scale_limits(limits, share)
        verdict = self._local.reserve_now(subject, local_limits, tokens, now)
        if isinstance(verdict, BudgetAllow):
            charge = dataclasses.replace(verdict.charge, origin=LOCAL_ORIGIN)
            return dataclasses.replace(verdict, charge=charge)
        return verdict

    def _report(self, tier: str, result: str) -> None:
        if self._on_fallback is not None:
            self._on_fallback(tier, result)

    async def settle(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        if charge.origin == LOCAL_ORIGIN:
            self._local.settle_now(charge, actual_tokens, now)
            return
        if not self.breaker.allow():
            return  # stays charged at its reservation (conservative)
        try:
            await self.primary.settle(charge, actual_tokens, now)
        except BudgetStoreError as exc:
            self._failed("settle", exc)
        except BaseException:
            self.breaker.abandon()
            raise
        else:
            self.breaker.success()

    async def usage(
        self, subject: str, limits: Sequence[BudgetWindow], now: float
    ) -> list[WindowUsage]:
        return await self.primary.usage(subject, limits, now)

    async def close(self) -> None:
        await self.primary.close()
