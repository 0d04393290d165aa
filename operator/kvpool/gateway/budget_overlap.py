"""This replica's view of each tenant's budget, for sending requests ahead of their verdict.

Why this module exists: the decision (:mod:`kvpool.domain.budget_overlap`) is pure; it
needs the latest usage a verdict reported for the tenant and what this replica has sent
ahead without a verdict yet. This holds both, per budget subject, and nothing else.

Per-process state, and what it means with several replicas: each replica keeps its own
views, from its own verdicts (the counters themselves are only in Redis). A view misses
what the other replicas charged since it was taken; ``max_age`` and the margin bound how
far that can go, and a refusal (a verdict that comes back over the limit) costs only an
aborted engine request, never an uncharged answer. A replica that is killed loses its
views, and a new one starts without any (its first request of each tenant waits for its
verdict). With Redis gone, the failover store answers from its local allowance at once
(no round trip to hide); its verdicts say nothing of the shared usage, so they feed no
view, and once Redis answers again the first verdicts from it make new ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import PRIMARY_ORIGIN, BudgetAllow, BudgetDeny, BudgetVerdict
from kvpool.domain.budget_overlap import (
    DEFAULT_MARGIN,
    DEFAULT_MAX_AGE,
    Ahead,
    OverlapDecision,
    UsageView,
    decide_overlap,
)


class BudgetOverlap:
    """Views of the tenants' usage and what was sent ahead, per budget subject."""

    def __init__(self, margin: float = DEFAULT_MARGIN, max_age: float = DEFAULT_MAX_AGE) -> None:
        self.margin = margin
        self.max_age = max_age
        self._views: dict[str, UsageView] = {}
        self._ahead: dict[str, Ahead] = {}

    def decide(
        self, subject: str, limits: Sequence[BudgetWindow], tokens: int, now: float
    ) -> OverlapDecision:
        """Whether a request of ``subject`` charging ``tokens`` may go ahead of its verdict."""
        return decide_overlap(
            self._views.get(subject),
            limits,
            tokens,
            self._ahead.get(subject, Ahead()),
            now,
            margin=self.margin,
            max_age=self.max_age,
        )

    def sent_ahead(self, subject: str, tokens: int) -> None:
        """A request of ``subject`` went ahead of its verdict."""
        ahead = self._ahead.get(subject, Ahead())
        self._ahead[subject] = Ahead(ahead.tokens + tokens, ahead.requests + 1)

    def verdict_in(self, subject: str, tokens: int) -> None:
        """The verdict of a request sent ahead came in (whatever it said)."""
        ahead = self._ahead.get(subject, Ahead())
        left = Ahead(max(0, ahead.tokens - tokens), max(0, ahead.requests - 1))
        if left.requests:
            self._ahead[subject] = left
        else:
            self._ahead.pop(subject, None)

    def seen(self, subject: str, tokens: int, verdict: BudgetVerdict, now: float) -> None:
        """Learn from a verdict on a charge of ``tokens``: an allowed one reports the usage
        before it; a refusal leaves no view until an allowed charge shows room again. A
        verdict of the failover store's local allowance (Redis down) says nothing of the
        shared usage and teaches nothing."""
        if isinstance(verdict, BudgetAllow):
            if verdict.charge.origin != PRIMARY_ORIGIN:
                return
            current = self._views.get(subject)
            if current is not None and current.at > now:
                return  # a later charge's verdict came in first: it saw more
            windows = tuple(
                (u.window.window_seconds, u.tokens + tokens, u.requests + 1) for u in verdict.usage
            )
            self._views[subject] = UsageView(at=now, windows=windows)
        elif isinstance(verdict, BudgetDeny):
            self._views.pop(subject, None)
