"""Prefill holds: a replica takes no lower-tier request while a protected request prefills.

Why this module exists: a tier with a ``ttftP95Target`` promises a fast first token, and
on an engine a request's first token comes after one step that runs its prefill together
with whatever else the engine scheduled: a lower tier's long prompt sent in the same
moment makes that step (and the first token) several times slower. So from admitting
such a request until its first token (``AdmissionController.first_token``), or for at
most the target, its replica takes no request of a lower tier (they start elsewhere or a
little later; capacity and floors are unaffected, only the moment they start moves).

Holds chained back to back (protected requests arriving one after the other) never keep
lower tiers off a replica longer than the longest target at a time: the chain's start
(``ReplicaState.held_since``) opens a *gate* ``held_since + longest``; past it lower
tiers go through, and the next protected start holds again.

Worked example (target 0.5 s, one replica): hi admitted at t=0 -> lo offered at 0.1
queues; hi's first token at 0.2 -> lo starts at 0.2. With hi requests admitted at 0, 0.3
and 0.6, each holding until its first token 0.4 s later, lo waits until the chain's gate
at 0.5 and starts then; its start re-arms the gate (``held_since`` 0.5), so the next lo
request waits for the hi holds still running, or until 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kvpool.domain.admission.ledger import ReplicaState, TierState


class PrefillHolds:
    """The holds of one pool's replicas (the records live on each :class:`ReplicaState`)."""

    def __init__(self) -> None:
        self.longest = 0.0  # the longest prefill hold of any tier (seconds)
        self.checked_at = -math.inf  # the last end_expired(): gates up to it were seen

    def configure(self, order: Iterable[TierState]) -> None:
        """A new plan: the longest hold of its tiers."""
        self.longest = max((t.prefill_hold for t in order), default=0.0)

    def gate(self, replica: ReplicaState) -> float | None:
        """When the chain of holds on ``replica`` lets lower tiers through (None: no chain
        is running)."""
        return None if replica.held_since is None else replica.held_since + self.longest

    def blocks(self, replica: ReplicaState, rank: int, now: float) -> bool:
        """Whether a request of ``rank`` must not start on ``replica`` now: a request of
        a higher tier is in its prefill and the chain's gate is not open yet."""
        if not any(r < rank for r, _ in replica.holds.values()):
            return False
        gate = self.gate(replica)
        return gate is None or now < gate

    @staticmethod
    def started(replica: ReplicaState, tier: TierState, request_id: str, now: float) -> None:
        """A request of ``tier`` started on ``replica``: it may hold the replica."""
        if any(rank < tier.rank for rank, _ in replica.holds.values()):
            replica.held_since = now  # let through past a chain of holds: hold again
        if tier.prefill_hold > 0:
            if not replica.holds:
                replica.held_since = now
            replica.holds[request_id] = (tier.rank, now + tier.prefill_hold)

    @staticmethod
    def drop(replica: ReplicaState, request_id: str) -> None:
        """The request's hold ends (first token, release); the chain ends with the last."""
        if replica.holds.pop(request_id, None) is not None and not replica.holds:
            replica.held_since = None

    def end_expired(self, replicas: Iterable[ReplicaState], now: float) -> bool:
        """Drop holds whose time ran out; True if any did, or if a chain of holds has now
        kept lower tiers off a replica for ``longest`` (its gate opened)."""
        changed = False
        for replica in replicas:
            for rid in [rid for rid, (_, until) in replica.holds.items() if until <= now]:
                self.drop(replica, rid)
                changed = True
            gate = self.gate(replica) if replica.holds else None
            if gate is not None:
                changed |= self.checked_at < gate <= now
        self.checked_at = now
        return changed

    def next_change(self, replicas: Iterable[ReplicaState]) -> float | None:
        """When the first hold runs out, or a chain's gate opens (each gate is returned
        until :meth:`end_expired` saw it: if nothing lower could start then, it is not a
        deadline any more)."""
        times: list[float] = []
        for replica in replicas:
            if replica.holds:
                times.extend(until for _, until in replica.holds.values())
                gate = self.gate(replica)
                if gate is not None and gate > self.checked_at:
                    times.append(gate)
        return min(times, default=None)
