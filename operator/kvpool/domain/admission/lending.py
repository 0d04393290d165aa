"""What may still be lent right now: the borrowing pause and the TTFT limiter's lent limits.

Why this module exists: two signals from outside the ledger hold borrowers back without
touching any floor. The engines' *measured* KV usage near full pauses all borrowing (the
ledger counts reservations, the engines what is really held), and a tier with a
``ttftP95Target`` may lower how many requests of the tiers *below* it run on borrowed
capacity (:mod:`.limiter` decides the number). This gate keeps both and counts the
in-flight borrowed requests per rank; :func:`LendingGate.blocked` is what the dispatcher
asks before a borrower starts. A request that fits in its own tier's floor never asks.

Lent limits are kept by rank: after a policy reload that re-ranks tiers, in-flight
borrowers are counted at the rank they started with until they finish.

Worked example: interactive (rank 0) limits what is lent below it to 2; batch (rank 1) has
2 borrowers in flight -> a third batch borrower is blocked; one ends -> it may start.
"""

from __future__ import annotations


class LendingGate:
    """The borrowing pause, the lent limits by protected rank, borrowers by rank."""

    __slots__ = ("borrowed_by_rank", "limits", "paused")

    def __init__(self) -> None:
        self.paused = False  # engines report their KV cache nearly full
        self.limits: dict[int, int] = {}  # protected rank -> borrowers allowed below it
        self.borrowed_by_rank: dict[int, int] = {}  # rank -> in-flight borrowed requests

    def blocked(self, rank: int) -> bool:
        """Whether a borrower of ``rank`` is held by the pause or a lent limit above it."""
        if self.paused:
            return True
        for protected, limit in self.limits.items():
            if protected < rank and self.borrowed_below(protected) >= limit:
                return True
        return False

    def set_limit(self, rank: int, limit: int | None) -> bool:
        """Set the limit below ``rank`` (None: no limit); True if it grew or was lifted."""
        before = self.limits.get(rank)
        if limit is None:
            self.limits.pop(rank, None)
        else:
            self.limits[rank] = max(0, limit)
        return before is not None and (limit is None or limit > before)

    def borrowed_below(self, rank: int) -> int:
        """In-flight borrowed requests of ranks below (numerically above) ``rank``."""
        return sum(n for r, n in self.borrowed_by_rank.items() if r > rank)

    def started(self, rank: int) -> None:
        """A borrower of ``rank`` started."""
        self.borrowed_by_rank[rank] = self.borrowed_by_rank.get(rank, 0) + 1

    def ended(self, rank: int) -> None:
        """A borrower of ``rank`` ended."""
        left = self.borrowed_by_rank.get(rank, 0) - 1
        if left > 0:
            self.borrowed_by_rank[rank] = left
        else:
            self.borrowed_by_rank.pop(rank, None)
