"""The grant: what a replica may take of what it asked for, so that no capacity is promised twice.

Why this module exists: every replica computes its *desired* lease from the table of
reports its last renewal returned (:func:`~kvpool.domain.lease.allocation.plan_leases`),
and tables differ by a renewal or two between replicas. So a desired lease is only a
wish: the grant, executed atomically in Redis with the claims of every live replica
(adapters/lease/renew.lua does exactly this; this function is its reference model, and a
test runs both on the same random inputs), gives each component at most what the other
replicas do not claim:

    grant_c = min(desired_c, max(0, capacity_g - sum of the others' claims in group g
                                               - the caller's claims before c in g))
    claim_c = max(grant_c, held_c)

where ``g`` is the constraint group of component ``c`` (:meth:`LeasePlan.groups`: most
groups are one component; a ``Wait`` tier's floor and the loans of its idle floor share
one).

``held_c`` is what the caller still holds of the component: what its requests in flight
use, or its current lease where that is larger, *after* the caller shrank its lease to
what it desires (the shrink takes effect locally before the renewal is sent, so capacity
it gives up is free the moment the script runs; growth takes effect when the answer
arrives). A claim is therefore never below what is really in use: a replica whose
in-flight requests outlast a smaller lease keeps claiming them until they end, and nobody
is granted capacity before it is released.

While Redis has just started with no state (it restarted, or it was flushed), the
replicas' claims are unknown until each has renewed once: for one member TTL from then
(``warming``), a grant never exceeds what the caller holds, so a replica that arrives
first cannot take what another still admits against.

Invariant (checked by tests/unit/test_lease_properties.py over random demands, renewal
orders and membership changes): for every group, the sum over live replicas of their
claims never exceeds its capacity, except by in-flight reservations of a replica whose
claim expired while it was stopped (it then claims what it holds, and nobody grows until
that is released).

>>> groups = {"shared.slots": (4, ("shared.slots",))}
>>> g = decide_grant(groups, {"shared.slots": 3}, {"shared.slots": 4}, {})
>>> g.granted, g.claim
({'shared.slots': 1}, {'shared.slots': 1})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Grant:
    """The result of one renewal for the caller."""

    granted: dict[str, int]  # component -> the caller's new lease (zeros left out)
    claim: dict[str, int]  # component -> what the caller claims from now on (zeros left out)


def decide_grant(
    groups: Mapping[str, tuple[int, Sequence[str]]],
    others: Mapping[str, int],
    desired: Mapping[str, int],
    held: Mapping[str, int],
    *,
    warming: bool = False,
) -> Grant:
    """The caller's grant and claim (see the module docstring).

    ``groups``: constraint name -> (capacity, its components) (:meth:`LeasePlan.groups`);
    ``others``: the other live replicas' claims summed per component. Within a group the
    caller's components are granted in the group's order, each from what is left. A
    component in no group (a tenant that left the config) is granted nothing; what the
    caller still holds of it stays claimed."""
    granted: dict[str, int] = {}
    claim: dict[str, int] = {}
    grouped: set[str] = set()
    for capacity, members in groups.values():
        free = capacity - sum(others.get(c, 0) for c in members)
        for name in members:
            grouped.add(name)
            keep = max(0, held.get(name, 0))
            give = max(0, min(desired.get(name, 0), free))
            if warming:
                give = min(give, keep)
            free -= max(give, keep)
            if give:
                granted[name] = give
            if mine := max(give, keep):
                claim[name] = mine
    for name, value in held.items():
        if name not in grouped and value > 0:
            claim[name] = value
    return Grant(granted=granted, claim=claim)
