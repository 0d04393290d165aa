"""Assessing KV-capacity measurements: which figure the planner gets, and what changed.

Why it exists: the plan is only as good as its capacity figure. Engines report their KV
cache size in tokens (``vllm:cache_config_info``); this module turns the readings of one
pool's engines into one figure and the facts a human should see, without I/O:

- replicas of one revision run the same configuration, so they should agree; when they
  do not (different GPUs, a fragmenting allocator), plan with the **minimum** (the
  guarantee must hold on every replica) and say so (``disagree``);
- a change of more than 10% against the last measurement is worth an Event;
- when metrics vanish (Prometheus down or no series), keep the last measurement
  (fail-static) instead of falling back to the declared figure: a vanished metric is not
  evidence that capacity changed;
- until any measurement exists, the declared ``capacity.kvTokensPerReplica`` is used, and
  the status says so.

Worked example::

    >>> r = [ReplicaReading("a", 4096, 32), ReplicaReading("b", 2048, 32)]
    >>> a = assess_capacity(r, METRICS_OK, None, "rev1", 1000, "t0")
    >>> a.kv_tokens, a.source, a.disagree
    (2048, 'Measured', True)
    >>> b = assess_capacity([], PROMETHEUS_DOWN, a.to_status(), "rev1", 1000, "t1")
    >>> b.kv_tokens, b.source, b.reason
    (2048, 'Measured', 'KeptLastMeasurement')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvpool.api.modelpool import MeasuredCapacity, ModelPool, ModelPoolStatus
from kvpool.domain import conditions as c
from kvpool.domain.planner import PlanError, PoolPlan

MetricsState = Literal["ok", "unreachable", "no-data", "disabled"]
METRICS_OK: MetricsState = "ok"
PROMETHEUS_DOWN: MetricsState = "unreachable"
NO_DATA: MetricsState = "no-data"
METRICS_OFF: MetricsState = "disabled"

CHANGE_EVENT_THRESHOLD = 0.10  # relative change that deserves a Kubernetes Event


@dataclass(frozen=True)
class ReplicaReading:
    """What one engine replica reported."""

    replica: str  # pod name (or Prometheus instance) that reported
    kv_tokens: int  # kv_cache_size_tokens, or num_gpu_blocks * block_size
    block_size: int | None  # KV block size in tokens, when reported


@dataclass(frozen=True)
class CapacityAssessment:
    """The capacity figure to plan with and how it was arrived at."""

    kv_tokens: int | None  # the measured figure for the planner; None: use the declared one
    declared_kv_tokens: int | None  # the spec's figure (shown in status until measured)
    source: Literal["Measured", "Declared", "None"]  # as in status.capacity.source
    reason: str  # CapacityMeasured condition reason (Measured, KeptLastMeasurement, ...)
    block_size: int | None  # engine KV block size in tokens
    revision: str | None  # revision the figure was measured on
    replicas_measured: int  # replicas that reported this round (0 when kept or declared)
    measured_at: str | None  # when the figure was first seen (kept while unchanged)
    disagree: bool  # replicas of the revision reported different sizes
    spread: tuple[int, int] | None  # (min, max) over replicas when they disagree
    previous_kv_tokens: int | None  # the last measured figure, for change events
    change_ratio: float | None  # (new - previous) / previous when both are measured

    @property
    def changed_significantly(self) -> bool:
        """Whether the figure moved by more than 10% against the last measurement."""
        return self.change_ratio is not None and abs(self.change_ratio) > CHANGE_EVENT_THRESHOLD

    def to_status(self) -> MeasuredCapacity:
        """The assessment as ``status.capacity``."""
        return MeasuredCapacity(
            kv_tokens_per_replica=(
                self.kv_tokens if self.kv_tokens is not None else self.declared_kv_tokens
            ),
            block_size=self.block_size,
            source=self.source,
            revision=self.revision,
            replicas_measured=self.replicas_measured,
            measured_at=self.measured_at,
        )


def assess_capacity(
    readings: Sequence[ReplicaReading],
    metrics: MetricsState,
    previous: MeasuredCapacity | None,
    revision: str,
    declared: int | None,
    now: str,
) -> CapacityAssessment:
    """Assess the readings of the current revision's replicas against the last figure.

    ``previous`` is the last ``status.capacity``; ``declared`` the spec's figure.
    """
    last = previous if previous is not None and previous.source == "Measured" else None
    last_kv = last.kv_tokens_per_replica if last is not None else None
    if readings:
        sizes = [r.kv_tokens for r in readings]
        low, high = min(sizes), max(sizes)
        blocks = {r.block_size for r in readings if r.block_size is not None}
        unchanged = last is not None and last_kv == low and last.revision == revision
        return CapacityAssessment(
            kv_tokens=low,
            declared_kv_tokens=declared,
            source="Measured",
            reason=c.MEASURED,
            block_size=min(blocks) if blocks else None,
            revision=revision,
            replicas_measured=len(readings),
            measured_at=last.measured_at if unchanged and last is not None else now,
            disagree=low != high,
            spread=(low, high) if low != high else None,
            previous_kv_tokens=last_kv,
            change_ratio=(low - last_kv) / last_kv if last_kv else None,
        )
    keep = last is not None and (metrics != METRICS_OK or last.revision == revision)
    if keep and last is not None:
        return CapacityAssessment(
            kv_tokens=last_kv,
            declared_kv_tokens=declared,
            source="Measured",
            reason=c.KEPT_LAST_MEASUREMENT,
            block_size=last.block_size,
            revision=last.revision,
            replicas_measured=0,
            measured_at=last.measured_at,
            disagree=False,
            spread=None,
            previous_kv_tokens=last_kv,
            change_ratio=None,
        )
    return CapacityAssessment(
        kv_tokens=None,
        declared_kv_tokens=declared,
        source="Declared" if declared is not None else "None",
        reason=c.DECLARED if declared is not None else c.NO_CAPACITY,
        block_size=None,
        revision=None,
        replicas_measured=0,
        measured_at=None,
        disagree=False,
        spread=None,
        previous_kv_tokens=last_kv,
        change_ratio=None,
    )


def decide_warm_replicas(
    planned: int, last_warm: int | None, metrics: MetricsState, spec_changed: bool
) -> int:
    """Warm replicas to run: the plan's, but never fewer than before because metrics vanished.

    >>> decide_warm_replicas(2, 3, PROMETHEUS_DOWN, spec_changed=False)
    3
    >>> decide_warm_replicas(2, 3, METRICS_OK, spec_changed=False)
    2
    >>> decide_warm_replicas(2, 3, PROMETHEUS_DOWN, spec_changed=True)
    2
    """
    metrics_vanished = metrics in (PROMETHEUS_DOWN, NO_DATA)
    if metrics_vanished and not spec_changed and last_warm is not None:
        return max(planned, last_warm)
    return planned


def decide_pool_warm_replicas(
    pool: ModelPool,
    plan: PoolPlan | PlanError,
    prior: ModelPoolStatus | None,
    metrics: MetricsState,
) -> int:
    """The warm replicas of a pool: the plan's (fail-static guarded, at most maxReplicas);
    without a plan, keep what runs so the engines can be measured (at least minReplicas,
    at least one).

    Worked example: a plan for 2 replicas while Prometheus is down and 3 ran before, spec
    unchanged -> 3 (a vanished metric is not evidence that capacity changed); a plan
    error with nothing running before and ``minReplicas: 0`` -> 1.
    """
    capacity = pool.spec.capacity
    last = prior.replicas.desired if prior is not None and prior.replicas is not None else None
    if isinstance(plan, PlanError):
        wanted = last if last else max(capacity.min_replicas, 1)
        return min(wanted, capacity.max_replicas)
    spec_changed = prior is None or prior.observed_generation != pool.metadata.generation
    warm = decide_warm_replicas(plan.replicas, last, metrics, spec_changed)
    return min(warm, capacity.max_replicas)
