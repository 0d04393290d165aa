"""The Argo CD health check of docs/argocd-health.md, run in Lua 5.1 (Argo CD's dialect).

The ModelPool objects are built from kvpool's own status models and condition constants,
so a renamed field or reason breaks this test rather than the check in a user's cluster.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from lupa.lua51 import LuaRuntime

from kvpool.api.common import Condition
from kvpool.api.modelpool import ModelPoolStatus
from kvpool.api.rollout import RolloutStatus
from kvpool.domain import conditions as c
from kvpool.domain.planner import CAPACITY_UNKNOWN, REPLICA_TOO_SMALL

DOC = Path(__file__).resolve().parents[2] / "docs" / "argocd-health.md"


def health_script() -> str:
    (script,) = re.findall(r"```lua\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return script


def assess(obj: dict[str, Any]) -> dict[str, str]:
    """Run the documented check on ``obj`` the way Argo CD does (a global ``obj``)."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(health_script())
    return {"status": result["status"], "message": result["message"]}


def cond(type_: str, status: str, reason: str, message: str = "") -> Condition:
    return Condition(
        type=type_, status=status, reason=reason, message=message, last_transition_time="t0"
    )


def pool(
    *conditions: Condition,
    generation: int = 3,
    observed: int | None = 3,
    rollout: str | None = None,
    status: bool = True,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kvpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "chat", "namespace": "llm", "generation": generation},
        "spec": {},
    }
    if status:
        wire = ModelPoolStatus(
            observed_generation=observed,
            conditions=list(conditions),
            rollout=RolloutStatus(phase=rollout, message="gate ttftP95") if rollout else None,
        ).to_wire()
        obj["status"] = wire
    return obj


READY = cond(c.READY, "True", c.POOL_READY, "2/2 replicas ready")
CASES = {
    "no-status-yet": (pool(status=False), "Progressing", "Waiting for the kvpool operator"),
    "spec-not-observed-yet": (pool(READY, observed=2), "Progressing", "observe generation 3"),
    "ready": (pool(READY), "Healthy", "PoolReady: 2/2 replicas ready"),
    "ready-but-capacity-short": (
        pool(READY, cond(c.CAPACITY_SHORT, "True", c.MAX_REPLICAS_TOO_LOW, "needs 5 replicas")),
        "Healthy",
        "CapacityShort: needs 5 replicas",
    ),
    "replicas-starting": (
        pool(cond(c.READY, "False", c.REPLICAS_NOT_READY, "0/2 ready")),
        "Progressing",
        "ReplicasNotReady: 0/2 ready",
    ),
    "capacity-not-known-yet": (
        pool(cond(c.READY, "False", CAPACITY_UNKNOWN, "no measurement")),
        "Progressing",
        "CapacityUnknown",
    ),
    "policy-missing": (
        pool(cond(c.READY, "False", c.TIER_POLICY_NOT_FOUND, "no TierPolicy standard")),
        "Degraded",
        "TierPolicyNotFound: no TierPolicy standard",
    ),
    "replica-too-small": (
        pool(cond(c.READY, "False", REPLICA_TOO_SMALL, "floors exceed one replica")),
        "Degraded",
        "ReplicaTooSmall",
    ),
    "invalid-spec": (
        pool(cond(c.READY, "False", c.INVALID_SPEC, "bad")),
        "Degraded",
        "InvalidSpec",
    ),
    "replicas-disagree": (
        pool(READY, cond(c.DEGRADED, "True", c.REPLICAS_DISAGREE, "2048 vs 4096")),
        "Degraded",
        "ReplicasDisagree: 2048 vs 4096",
    ),
    "not-degraded": (pool(READY, cond(c.DEGRADED, "False", c.AS_EXPECTED)), "Healthy", "PoolReady"),
    "rollout-progressing": (
        pool(READY, rollout="Progressing"),
        "Progressing",
        "Rollout in progress",
    ),
    "rollout-paused": (pool(READY, rollout="Paused"), "Suspended", "Rollout paused: gate ttftP95"),
    "rollout-aborted": (pool(READY, rollout="Aborted"), "Degraded", "Rollout aborted"),
    "rollout-promoted": (pool(READY, rollout="Promoted"), "Healthy", "PoolReady"),
}


@pytest.mark.parametrize(("obj", "health", "message"), CASES.values(), ids=CASES.keys())
def test_health(obj: dict[str, Any], health: str, message: str) -> None:
    result = assess(obj)

    assert result["status"] == health
    assert message in result["message"]


def test_every_ready_reason_the_doc_calls_broken_exists() -> None:
    from kvpool.domain import planner

    broken = re.search(r"local broken = \{(.*?)\}", health_script(), flags=re.DOTALL)
    assert broken is not None
    names = set(re.findall(r"(\w+) = true", broken.group(1)))
    known = {c.INVALID_SPEC, c.TIER_POLICY_NOT_FOUND} | {
        getattr(planner, n) for n in ("REPLICA_TOO_SMALL", "ZERO_FLOOR_WITH_PEAK", "UNKNOWN_TIER")
    }
    assert names == known
