"""What every budget store offers, and the names shared by the stores and the gateway.

Why this module exists: the gateway charges and settles budgets through one interface,
whatever holds the counters (this process, or Redis shared by every gateway replica, with
a failover wrapper in front). The stores implement the algorithm of
:mod:`kvpool.domain.budget`; this module holds only the contract.

Keys are scoped by namespace: a budget's *subject* is ``"<namespace>/<tenant>"``
(:func:`budget_subject`), so tenant ``shared`` of ``team-a`` and tenant ``shared`` of
``team-b`` never share counters, in memory or in Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import BudgetCharge, BudgetVerdict, WindowUsage

UnavailableMode = Literal["Allow", "Reject"]
"""What a tier gets while the shared store cannot be consulted (TierPolicy
``budgetUnavailable``): Allow = a local allowance, Reject = 503."""


def budget_subject(namespace: str, tenant: str) -> str:
    """The budget's identity: the tenant qualified by its namespace.

    >>> budget_subject("team-a", "shared")
    'team-a/shared'
    """
    return f"{namespace}/{tenant}"


@dataclass(frozen=True)
class BudgetUnavailable:
    """The shared budget cannot be consulted and the tier fails closed: answer 503."""

    retry_after: float
    reason: str


StoreVerdict = BudgetVerdict | BudgetUnavailable


class BudgetStoreError(Exception):
    """The store could not answer (connection refused, timeout, script error)."""


class BudgetStore(Protocol):
    """Charges reservations against tenant limits and settles them with the real usage."""

    remote: bool  # True when calls leave the process (settle in the background then)

    async def reserve(
        self,
        subject: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
        when_unavailable: UnavailableMode | None = None,
    ) -> StoreVerdict:
        """Charge ``tokens`` (and one request) if every window allows it.

        ``tier``/``when_unavailable`` only matter to a store that can be unavailable:
        ``None`` leaves the store's default."""
        ...

    async def settle(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        """Correct a charge to the tokens finally charged (see ``decide_settlement``)."""
        ...

    async def usage(
        self, subject: str, limits: Sequence[BudgetWindow], now: float
    ) -> list[WindowUsage]:
        """What the subject has used in each window (for metrics and tests)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
