"""Outlier ejection: when a replica stops serving, route around it at once, then probe it back.

Why this module exists: a hung engine (SIGSTOP, a wedged GPU, a full disk) still accepts
TCP connections, so nothing else notices it. Without ejection every new request is routed
to it and waits out the upstream timeout while holding its KV reservation. The gateway
reports three kinds of failure for a replica:

- ``refused``: the connection was refused (the engine is gone);
- ``timeout``: no first token / no stream progress within the upstream timeouts;
- ``health``: the replica's ``/health`` did not answer (in time) or answered 5xx.

A ``refused`` or ``timeout`` failure ejects the replica *at once* (one hung request is
enough evidence: a healthy vLLM streams tokens continuously). A ``health`` failure ejects
a replica in routing only when it repeats: ``health_misses`` (2) probes in a row. One probe
answered late is no evidence of a hung engine - a loaded machine stalls for a second now
and then - and ejecting ends every request in flight on the replica with 504, so a single
late answer would turn a hiccup into an outage.

The ejection lasts ``base_seconds * 2 ** (ejections - 1)`` (capped at ``max_seconds``): a
replica that keeps failing stays out longer each time, like Envoy's outlier detection,
whose ejection time also grows with the number of ejections. When the time is over the
replica returns only after a health probe succeeds (until then one failure ejects it
again); a replica healthy for ``forget_seconds`` since its last return has its ejection
count reset.

Worked example (base 2 s, max 60 s, 2 misses)::

    t=0    health probe times out     -> nothing (1 miss)
    t=1.5  the next probe times out   -> Eject for 2 s  (ejections 1, until 3.5)
    t=2.5  probe fails                -> nothing (already out)
    t=4    probe fails                -> Eject for 4 s  (ejections 2, until 8; still out, so
                                         one miss is enough)
    t=8.5  probe succeeds             -> Restore        (ejections stay 2)
    t=200  probe succeeds             -> count forgotten (ejections 0)

Everything here is pure: the caller passes ``now`` and keeps the returned state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

FailureKind = Literal["refused", "timeout", "health"]


@dataclass(frozen=True)
class OutlierPolicy:
    """How long replicas stay out (seconds)."""

    base_seconds: float = 2.0  # first ejection
    max_seconds: float = 60.0  # cap of the growing ejection time
    forget_seconds: float = 60.0  # healthy this long after a return: count reset
    health_misses: int = 2  # health failures in a row that eject a replica in routing


@dataclass(frozen=True)
class ReplicaHealth:
    """What the gateway remembers about one replica."""

    ejections: int = 0  # ejections in a row (drives the growing ejection time)
    ejected_until: float | None = None  # None: in routing
    health_misses: int = 0  # health failures in a row while in routing
    returned_at: float | None = None  # last time it came back into routing

    @property
    def ejected(self) -> bool:
        return self.ejected_until is not None


@dataclass(frozen=True)
class Eject:
    """Take the replica out of routing until ``until``."""

    until: float
    seconds: float
    reason: FailureKind


@dataclass(frozen=True)
class Restore:
    """Put the replica back into routing."""


@dataclass(frozen=True)
class Stay:
    """Nothing to change."""


OutlierVerdict = Eject | Restore | Stay


def ejection_seconds(ejections: int, policy: OutlierPolicy) -> float:
    """The length of the ``ejections``-th ejection in a row.

    >>> [ejection_seconds(n, OutlierPolicy()) for n in (1, 2, 3, 6, 7)]
    [2.0, 4.0, 8.0, 60.0, 60.0]
    """
    return min(policy.max_seconds, policy.base_seconds * float(2 ** max(0, ejections - 1)))


def decide_failure(
    state: ReplicaHealth, kind: FailureKind, now: float, policy: OutlierPolicy
) -> tuple[ReplicaHealth, OutlierVerdict]:
    """A failure of ``kind`` was seen: eject (again) unless it is already out, or unless it
    is the first of ``health_misses`` health failures in a row of a replica in routing.

    >>> state, verdict = decide_failure(ReplicaHealth(), "health", 0.0, OutlierPolicy())
    >>> verdict
    Stay()
    >>> state, verdict = decide_failure(state, "health", 1.5, OutlierPolicy())
    >>> verdict
    Eject(until=3.5, seconds=2.0, reason='health')
    >>> decide_failure(state, "health", 2.5, OutlierPolicy())[1]
    Stay()
    """
    if state.ejected_until is not None and now < state.ejected_until:
        return state, Stay()
    if kind == "health" and state.ejected_until is None:
        misses = state.health_misses + 1
        if misses < policy.health_misses:
            return replace(state, health_misses=misses), Stay()
    count = state.ejections + 1
    seconds = ejection_seconds(count, policy)
    until = now + seconds
    ejected = replace(state, ejections=count, ejected_until=until, health_misses=0)
    return ejected, Eject(until, seconds, kind)


def decide_success(
    state: ReplicaHealth, now: float, policy: OutlierPolicy
) -> tuple[ReplicaHealth, OutlierVerdict]:
    """A health probe (or a request) succeeded: restore once the ejection time is over.

    >>> out = ReplicaHealth(ejections=1, ejected_until=2.0)
    >>> decide_success(out, 1.0, OutlierPolicy())[1], decide_success(out, 2.0, OutlierPolicy())[1]
    (Stay(), Restore())
    """
    if state.health_misses:
        state = replace(state, health_misses=0)
    if state.ejected_until is not None:
        if now < state.ejected_until:
            return state, Stay()
        return replace(state, ejected_until=None, returned_at=now), Restore()
    if state.ejections and (
        state.returned_at is None or now - state.returned_at >= policy.forget_seconds
    ):
        return replace(state, ejections=0), Stay()
    return state, Stay()
