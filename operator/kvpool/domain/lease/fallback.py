"""What a replica admits against when it has no fresh lease: fail-static, never fail-open.

Why this module exists: a lease is valid for ``lease_ttl`` seconds from the moment its
renewal was *sent* (on the replica's monotonic clock), and Redis forgets a replica's
claims ``member_ttl`` seconds after it last renewed (``member_ttl > lease_ttl``, so a
replica always stops using a lease before anyone else can be granted it). Without a
fresh lease there are two very different situations, told apart by whether renewals
*failed*:

- **Stalled** (no renewal failed; the process was stopped, or its loop blocked, for longer
  than the lease): the lease ran out and others may hold its capacity now. Admit nothing
  until a renewal answers (``EXPIRED``). A replica SIGSTOPped past its TTL thus never
  admits on its old lease when it resumes.
- **Redis unreachable** (renewals fail): nobody can be granted anything new, so what each
  replica holds stays safe as long as everyone moves to the fallback the same way:

  ============================  ==============================================  ========
  since the last good renewal   admit against                                   mode
  ============================  ==============================================  ========
  < lease_ttl                   the last lease (it is still valid)              LEASED
  lease_ttl .. + settle         min(last lease, equal split of the last         SHRUNK
                                known membership)
  later                         the equal split of the last known membership    EQUAL
  ============================  ==============================================  ========

  ``settle`` (two renewal periods plus two Redis timeouts) covers the spread between the
  replicas' last good renewals, so that when one replica moves to the equal split every
  other one admits against at most its equal part already: the sum never exceeds the
  plan. A replica that never had a lease (it started while Redis was down) knows no
  membership and admits nothing (``NONE``; its readiness says why).

A tenant's ``maxConcurrency`` is the one exception to "the last lease while valid": a
limited tenant is leased only where it has requests, so a tenant idle on this replica
when Redis goes away would start nothing here until the lease runs out (``lease_ttl``,
2.5 s by default: longer than an interactive tier's queue wait). While renewals fail, a
tenant this replica does not hold gets its equal part at once, as in ``SHRUNK``
(:func:`tenant_shares_in_mode`). That bounds one tenant's concurrency, not capacity: it may
be exceeded by at most those equal parts (at most the limit again) until the equal split
settles; the plan's tokens and slots stay fail-static.

The cost, said plainly: while Redis is down, capacity no longer follows demand (skewed
ingress gets the equal split), and a replica cut off from Redis *alone* (a partition, not
an outage) keeps its equal part while the others, after its claims expire in Redis, are
granted them again: the pool is then over-admitted by at most that replica's equal part
until the partition heals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from kvpool.domain.admission.amount import Amount
from kvpool.domain.lease.model import Lease, LeasePlan


class LeaseMode(StrEnum):
    """How a replica admits right now (the ``kvpool_gateway_lease_mode`` metric's label)."""

    LEASED = "leased"  # a lease granted by Redis, still valid
    SHRUNK = "shrunk"  # Redis unreachable: min(last lease, equal split)
    EQUAL = "equal"  # Redis unreachable for longer: the equal split
    EXPIRED = "expired"  # the lease ran out without a failed renewal (stalled): nothing
    NONE = "none"  # no lease ever, Redis unreachable: nothing


@dataclass(frozen=True)
class LeaseClock:
    """The timing of leases (seconds)."""

    period: float = 0.1  # between renewals
    lease_ttl: float = 2.5  # a lease is valid this long after its renewal was sent
    member_ttl: float = 3.0  # Redis forgets a replica's claims this long after its renewal
    redis_timeout: float = 0.1  # one renewal call

    @property
    def settle(self) -> float:
        """How long SHRUNK lasts: the spread of the replicas' last good renewals."""
        return 2 * (self.period + self.redis_timeout)


def decide_lease_mode(
    now: float,
    *,
    last_ok: float | None,
    failing_since: float | None,
    clock: LeaseClock,
) -> LeaseMode:
    """The mode at ``now`` (monotonic seconds). ``last_ok``: when the last successful
    renewal was sent (None: never); ``failing_since``: when the first renewal failed since
    then (None: none failed).

    >>> c = LeaseClock()
    >>> decide_lease_mode(10.0, last_ok=9.0, failing_since=None, clock=c)
    <LeaseMode.LEASED: 'leased'>
    >>> decide_lease_mode(20.0, last_ok=9.0, failing_since=None, clock=c)  # was stopped
    <LeaseMode.EXPIRED: 'expired'>
    >>> decide_lease_mode(11.7, last_ok=9.0, failing_since=9.1, clock=c)
    <LeaseMode.SHRUNK: 'shrunk'>
    >>> decide_lease_mode(20.0, last_ok=9.0, failing_since=9.1, clock=c)
    <LeaseMode.EQUAL: 'equal'>
    """
    if last_ok is None:
        return LeaseMode.NONE
    if now < last_ok + clock.lease_ttl:
        return LeaseMode.LEASED
    if failing_since is None:
        return LeaseMode.EXPIRED
    # measured from the later of "the lease ran out" and "the first failure": a replica
    # that was stopped and resumes into an outage goes through SHRUNK like everyone else
    shrunk_from = max(last_ok + clock.lease_ttl, failing_since)
    if now < shrunk_from + clock.settle:
        return LeaseMode.SHRUNK
    return LeaseMode.EQUAL


def equal_split(plan: LeasePlan, members: int) -> Lease:
    """One of ``members`` equal parts of ``plan`` (floored); no loans. A tenant's
    ``maxConcurrency`` part is at least one request (so a tenant with a limit below the
    number of replicas can still be served through each: at most ``members`` in all).

    >>> from kvpool.domain.lease.model import LeasePlan
    >>> p = LeasePlan(("hi",), {"hi": Amount(100, 4)}, {"hi": 100}, frozenset(),
    ...               Amount(21, 3), Amount(121, 7), {"t": 3})
    >>> half = equal_split(p, 2)
    >>> half.floors, half.shared, half.tenants
    ({'hi': Amount(tokens=50, slots=2)}, Amount(tokens=10, slots=1), {'t': 1})
    """
    n = max(1, members)

    def part(amount: Amount) -> Amount:
        return Amount(amount.tokens // n, amount.slots // n)

    return Lease(
        floors={t: part(plan.floors[t]) for t in plan.tiers},
        shared=part(plan.shared),
        loans={},
        tenants=equal_tenant_parts(plan.tenants, n),
    )


def equal_tenant_parts(limits: Mapping[str, int], members: int) -> dict[str, int]:
    """Each tenant's ``maxConcurrency`` in ``members`` equal parts, at least one request
    each (so a tenant with a limit below the number of replicas is served through each).

    >>> equal_tenant_parts({"t": 3, "u": 1}, 2)
    {'t': 1, 'u': 1}
    """
    n = max(1, members)
    return {t: max(1, limit // n) for t, limit in limits.items()}


def shrunk(last: Lease, equal: Lease) -> Lease:
    """Component-wise minimum of the last lease and the equal split (loans dropped)."""
    return Lease(
        floors={t: a.min(equal.floors.get(t, Amount())) for t, a in last.floors.items()},
        shared=last.shared.min(equal.shared),
        loans={},
        tenants={t: min(v, equal.tenants.get(t, 0)) for t, v in last.tenants.items()},
    )


def tenant_shares_in_mode(
    mode: LeaseMode,
    leased: Mapping[str, int],
    limits: Mapping[str, int],
    members: int,
    *,
    failing: bool,
) -> dict[str, int]:
    """This replica's part of each limited tenant's ``maxConcurrency`` in ``mode``:
    ``leased`` is its last lease's part (tenants it holds), ``limits`` every limited
    tenant's whole limit, ``members`` the last known membership, ``failing`` whether
    renewals fail (Redis unreachable). The equal split is computed only when it is used.

    >>> limits = {"a": 4, "b": 4}
    >>> tenant_shares_in_mode(LeaseMode.LEASED, {"a": 3}, limits, 2, failing=False)
    {'a': 3}
    >>> tenant_shares_in_mode(LeaseMode.LEASED, {"a": 3}, limits, 2, failing=True)
    {'a': 3, 'b': 2}
    >>> tenant_shares_in_mode(LeaseMode.SHRUNK, {"a": 3}, limits, 2, failing=True)
    {'a': 2, 'b': 2}
    >>> tenant_shares_in_mode(LeaseMode.EXPIRED, {"a": 3}, limits, 2, failing=False)
    {}
    """
    if mode is LeaseMode.LEASED and not failing:
        return dict(leased)
    if mode in (LeaseMode.EXPIRED, LeaseMode.NONE):
        return {}
    equal = equal_tenant_parts(limits, members)
    if mode is LeaseMode.LEASED:
        return {**equal, **leased}
    if mode is LeaseMode.SHRUNK:
        return {t: min(part, leased.get(t, part)) for t, part in equal.items()}
    return equal
