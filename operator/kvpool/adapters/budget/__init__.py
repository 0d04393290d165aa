"""Where tenant budgets live: this process (``memory``) or Redis (``redis``) behind a
failover wrapper (``failover``) that owns the circuit breaker; ``protocol`` is the contract.
"""

from kvpool.adapters.budget.failover import FailoverBudgetStore, FailoverPolicy
from kvpool.adapters.budget.memory import InMemoryBudgetStore
from kvpool.adapters.budget.protocol import (
    BudgetStore,
    BudgetStoreError,
    BudgetUnavailable,
    StoreVerdict,
    UnavailableMode,
    budget_subject,
)
from kvpool.adapters.budget.redis import RedisBudgetStore

__all__ = [
    "BudgetStore",
    "BudgetStoreError",
    "BudgetUnavailable",
    "FailoverBudgetStore",
    "FailoverPolicy",
    "InMemoryBudgetStore",
    "RedisBudgetStore",
    "StoreVerdict",
    "UnavailableMode",
    "budget_subject",
]
