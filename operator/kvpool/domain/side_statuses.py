"""The statuses of TierPolicies and TenantBudgets, decided without I/O.

Why it exists: a TierPolicy says whether it is valid and which pools use it (and, being
deleted while in use, which pools its deletion waits for); a TenantBudget says whether its
API key resolved and whether it is published. The controller
(:mod:`kvpool.controller.side_statuses`) gathers the facts and writes what this returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.api.common import ConditionStatus
from kvpool.api.tenantbudget import API_KEY_SECRET_LABEL, TenantBudgetStatus
from kvpool.api.tierpolicy import TierPolicyStatus
from kvpool.domain import conditions as c
from kvpool.domain.validity import Verdict

# Held on a TierPolicy while ModelPools use it: deleting it waits until none does.
FINALIZER_IN_USE = "kvpool.dev/in-use"


def build_policy_status(
    prior: TierPolicyStatus | None,
    generation: int | None,
    pools: int,
    now: str,
    verdict: Verdict | None = None,
    waiting_for: Sequence[str] = (),
) -> TierPolicyStatus:
    """A TierPolicy's status: whether it is valid, how many pools use it, and - when it
    is being deleted while in use - which pools its deletion waits for.

    >>> build_policy_status(None, 1, 2, "t0").conditions[0].message
    'used by 2 ModelPools'
    >>> from kvpool.api.validation import Finding
    >>> bad = Verdict("InvalidSpec", (Finding("spec.tiers", "floors sum over 100"),))
    >>> build_policy_status(None, 1, 0, "t0", bad).conditions[0].reason
    'InvalidSpec'
    """
    ready: tuple[ConditionStatus, str, str]
    if verdict is not None and not verdict.valid:
        ready = (
            "False",
            verdict.reason,
            f"{verdict.message} (not published; the gateway keeps the last valid version "
            "of this policy, if one was published)",
        )
    elif waiting_for:
        ready = (
            "True",
            c.POLICY_IN_USE,
            f"deletion waits until no ModelPool uses it (finalizer {FINALIZER_IN_USE}): "
            + ", ".join(sorted(waiting_for)),
        )
    else:
        ready = ("True", c.POLICY_READY, f"used by {pools} ModelPools")
    conds = c.set_condition(
        (prior.conditions if prior else []), c.READY, ready[0], ready[1], ready[2], generation, now
    )
    return TierPolicyStatus(observed_generation=generation, pools=pools, conditions=conds)


@dataclass(frozen=True)
class KeyLookup:
    """One API key reference of a TenantBudget and whether the operator holds its digest."""

    secret: str  # Secret name
    key: str  # key in the Secret
    resolved: bool  # the labelled Secret exists and has the key

    def describe(self) -> str:
        return f"key {self.key!r} of Secret {self.secret!r}"


def _key_condition(keys: Sequence[KeyLookup]) -> tuple[ConditionStatus, str, str]:
    """KeyResolved: True while one key at least authenticates the tenant."""
    found = [k for k in keys if k.resolved]
    missing = [k for k in keys if not k.resolved]
    listed = ", ".join(k.describe() for k in missing)
    if not keys:
        return "False", c.SECRET_NOT_FOUND, "no API key referenced (its requests get 401)"
    if not found:
        return (
            "False",
            c.SECRET_NOT_FOUND,
            f"{listed} not found (Secrets labelled {API_KEY_SECRET_LABEL}): the tenant is "
            "left out of the admission config (its requests get 401)",
        )
    if missing:
        return (
            "True",
            c.SOME_SECRETS_NOT_FOUND,
            f"{len(found)} of {len(keys)} keys resolved; {listed} not found (Secrets "
            f"labelled {API_KEY_SECRET_LABEL}): requests with that key get 401",
        )
    if len(keys) == 1:
        return "True", c.SECRET_FOUND, f"{keys[0].describe()} resolved"
    return (
        "True",
        c.SECRET_FOUND,
        f"{len(keys)} keys resolved, each authenticates the tenant: "
        + ", ".join(k.describe() for k in keys),
    )


def build_budget_status(
    prior: TenantBudgetStatus | None,
    generation: int | None,
    keys: Sequence[KeyLookup],
    now: str,
    verdict: Verdict | None = None,
) -> TenantBudgetStatus:
    """A TenantBudget's status: whether its API keys could be read (without one the tenant
    is not served) and whether the budget is valid (an invalid one is not published).

    >>> s = build_budget_status(None, 1, [KeyLookup("acme-key", "api-key", False)], "t0")
    >>> [(x.type, x.status, x.reason) for x in s.conditions]
    [('KeyResolved', 'False', 'SecretKeyNotFound'), ('Ready', 'False', 'SecretKeyNotFound')]
    """
    status, reason, message = _key_condition(keys)
    resolved = status == "True"
    conds = c.set_condition(
        (prior.conditions if prior else []),
        c.KEY_RESOLVED,
        status,
        reason,
        message,
        generation,
        now,
    )
    if verdict is not None and verdict.reason in (c.INVALID_SPEC, c.DUPLICATE_API_KEY):
        status, reason = "False", verdict.reason
        message = f"{verdict.message} (not published: the tenant's requests get 401)"
    elif verdict is not None and not verdict.valid and resolved:
        status, reason = "False", verdict.reason
        message = (
            f"{verdict.message} (published against the last valid version of the policy, "
            "if one was published)"
        )
    conds = c.set_condition(conds, c.READY, status, reason, message, generation, now)
    return TenantBudgetStatus(observed_generation=generation, conditions=conds)
