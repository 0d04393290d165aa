"""Leader election over a coordination.k8s.io/v1 Lease: who may act, decided without I/O.

Why it exists: the chart runs two operator replicas for availability; two replicas acting
at once would reconcile every pool twice and race on every write. One Lease per
installation names the leader (``spec.holderIdentity``) and when it last renewed
(``spec.renewTime``). Every replica reads it every ``retry`` seconds and hands it here:

- no Lease, an empty holder, or the holder's lease expired (``renewTime +
  leaseDurationSeconds`` has passed) -> :class:`Acquire` (a new transition);
- the holder is this replica -> :class:`Renew` (it keeps leading);
- another live holder -> :class:`Follow` (do nothing; try again after ``retry``).

Expiry is judged by the reader's clock against the writer's ``renewTime``: with clock
skew s, a standby may take over s seconds early or late - keep ``leaseDurationSeconds``
well above the skew (Kubernetes' own controllers use 15 s). Writes are guarded by the
Lease's resourceVersion (409 = another replica won), so two replicas can never both
acquire from the same observation.

A leader that cannot renew within ``renew_deadline`` must stop acting before its lease
expires and a standby takes over: :func:`still_leading`.

Worked example (duration 15 s): a Lease held by ``a``, renewed at t=100, read by ``b`` at
t=110 -> ``Follow("a", 5.0)``; at t=116 -> ``Acquire(transitions=1)``; read by ``a`` at
t=110 -> ``Renew()``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseRecord:
    """What the decision needs of a Lease."""

    holder: str | None  # spec.holderIdentity ("" or None: released)
    duration: float  # spec.leaseDurationSeconds
    renewed_at: float | None  # spec.renewTime as epoch seconds
    transitions: int  # spec.leaseTransitions


@dataclass(frozen=True)
class Acquire:
    """Take the lease (create it, or overwrite an expired or released holder)."""

    transitions: int  # leaseTransitions to write


@dataclass(frozen=True)
class Renew:
    """This replica holds the lease: write a new renewTime."""


@dataclass(frozen=True)
class Follow:
    """Another replica holds a live lease: do nothing."""

    holder: str  # who leads
    expires_in: float  # seconds until its lease expires unless renewed


LeaseVerdict = Acquire | Renew | Follow


def decide_lease(record: LeaseRecord | None, me: str, now: float) -> LeaseVerdict:
    """What this replica (``me``) does with the Lease it just read at time ``now``.

    >>> decide_lease(None, "b", 0.0)
    Acquire(transitions=0)
    >>> held = LeaseRecord("a", 15.0, 100.0, 0)
    >>> decide_lease(held, "b", 110.0), decide_lease(held, "b", 116.0), decide_lease(held, "a", 110)
    (Follow(holder='a', expires_in=5.0), Acquire(transitions=1), Renew())
    """
    if record is None:
        return Acquire(transitions=0)
    if record.holder == me:
        return Renew()
    if not record.holder or record.renewed_at is None:
        return Acquire(transitions=record.transitions + 1)
    expires_in = record.renewed_at + record.duration - now
    if expires_in < 0:
        return Acquire(transitions=record.transitions + 1)
    return Follow(holder=record.holder, expires_in=expires_in)


def still_leading(last_renewed: float | None, now: float, renew_deadline: float) -> bool:
    """Whether a leader whose last successful renew was at ``last_renewed`` may still act.

    It must stop before a standby could take over: ``renew_deadline`` is below the lease
    duration (two thirds of it by default), so the gap covers a slow last write.

    >>> still_leading(100.0, 109.0, 10.0), still_leading(100.0, 111.0, 10.0)
    (True, False)
    """
    return last_renewed is not None and now - last_renewed < renew_deadline
