"""Whether a request may go to its engine before its budget verdict is back.

Why this module exists: a tenant's budget is charged by one atomic script in Redis, one
round trip per request before the request may start (:mod:`kvpool.domain.budget`). On a
busy gateway that round trip was most of the gateway's own time before the hand-over
(docs/0008). The gateway can instead send the request to its engine while the charge is
on its way and hold the answer until the verdict is in: no byte of output reaches a
client before its charge is made, the budget stays exactly as strict as before, and the
round trip hides under the engine's prefill. What it risks is the engine's work: a
request whose verdict refuses it is aborted after the engine started on it (or, for a
``Demote`` tenant, admitted again in its lower tier).

So the gateway overlaps only when its last view of the tenant's usage leaves a wide
margin, which this module decides, purely. The view is the usage the store reported at
this replica's latest verdict for the tenant (plus that verdict's own charge). It is
late by what other replicas charged since, so it must be recent (``max_age``), and the
usage it shows, plus what this replica has sent ahead without a verdict yet, plus the
request, must stay under ``margin`` of every window's limit. A tenant refused by its
budget has no usable view until an allowed charge shows room again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvpool.api.admission_config import BudgetWindow

OverlapDecision = Literal["overlap", "no-view", "stale", "near-limit"]
"""``overlap``: send now; otherwise why the request waits for its verdict first."""

DEFAULT_MARGIN = 0.8
"""Overlap while usage stays under 80 % of every limit: another replica would have to
spend a fifth of a window within ``max_age`` for an overlapped request to be refused."""

DEFAULT_MAX_AGE = 2.0
"""Seconds a view stays usable."""


@dataclass(frozen=True)
class UsageView:
    """A tenant's usage as one verdict reported it: per window (seconds), the tokens and
    requests counted after that verdict's charge."""

    at: float  # wall clock of the verdict
    windows: tuple[tuple[float, int, int], ...]  # (window seconds, tokens, requests)


@dataclass(frozen=True)
class Ahead:
    """What this replica has sent ahead of its verdicts for one tenant."""

    tokens: int = 0
    requests: int = 0


def decide_overlap(
    view: UsageView | None,
    limits: Sequence[BudgetWindow],
    tokens: int,
    ahead: Ahead,
    now: float,
    *,
    margin: float = DEFAULT_MARGIN,
    max_age: float = DEFAULT_MAX_AGE,
) -> OverlapDecision:
    """May a request charging ``tokens`` go to its engine before its verdict?

    >>> w = BudgetWindow(window_seconds=60, tokens=1000, requests=10)
    >>> view = UsageView(at=100.0, windows=((60.0, 500, 2),))
    >>> decide_overlap(view, [w], 200, Ahead(), now=100.5)
    'overlap'
    >>> decide_overlap(view, [w], 200, Ahead(tokens=200, requests=1), now=100.5)
    'near-limit'
    >>> decide_overlap(view, [w], 200, Ahead(), now=103.0)
    'stale'
    """
    if view is None or len(view.windows) != len(limits):
        return "no-view"
    if not 0 <= now - view.at <= max_age:
        return "stale"
    for window, (seconds, used_tokens, used_requests) in zip(limits, view.windows, strict=True):
        if seconds != window.window_seconds:
            return "no-view"  # the limits changed since (a config reload)
        if used_tokens + ahead.tokens + tokens > margin * window.tokens:
            return "near-limit"
        requests = used_requests + ahead.requests + 1
        if window.requests is not None and requests > margin * window.requests:
            return "near-limit"
    return "overlap"
