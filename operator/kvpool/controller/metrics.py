"""The operator's own Prometheus metrics (reconciles, plans, measurements, config publishes).

Why it exists: an operator on call must see whether the operator itself keeps up - how
often it reconciles, how long that takes, what fails, how old the capacity measurements
are - next to the engines' metrics. One registry per process, served on ``--metrics-port``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kvpool.api.rollout import RolloutPhase
from kvpool.domain.conditions import MODELPOOL_CONDITION_TYPES
from kvpool.domain.rollout.gates import GateName


@dataclass
class OperatorMetrics:
    """All series of the operator, registered on their own registry."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter(
            "kvpool_operator_reconciles", "Pool reconciles by result.", ["result"], registry=r
        )
        self.reconcile_seconds = Histogram(
            "kvpool_operator_reconcile_duration_seconds",
            "Duration of one pool reconcile.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.errors = Counter("kvpool_operator_errors", "Errors by stage.", ["stage"], registry=r)
        self.plans = Counter(
            "kvpool_operator_plans", "Plans made by outcome (reason).", ["outcome"], registry=r
        )
        self.measurement_age = Gauge(
            "kvpool_operator_measurement_age_seconds",
            "Seconds since the last successful Prometheus snapshot.",
            registry=r,
        )
        self.publishes = Counter(
            "kvpool_operator_config_publishes",
            "Admission ConfigMap writes by action (created, updated, unchanged).",
            ["action"],
            registry=r,
        )
        self.config_largest_object = Gauge(
            "kvpool_operator_admission_config_largest_object_bytes",
            "Bytes of data in the largest ConfigMap of the namespace's published admission "
            "config (the API server refuses more than 1048576).",
            ["namespace"],
            registry=r,
        )
        self.warm_replicas = Gauge(
            "kvpool_operator_warm_replicas",
            "Warm replicas planned per pool.",
            ["namespace", "pool"],
            registry=r,
        )
        self.pool_condition = Gauge(
            "kvpool_operator_pool_condition",
            "ModelPool status conditions as last written: 1 when status is True, else 0.",
            ["namespace", "pool", "condition"],
            registry=r,
        )
        self.leader = Gauge(
            "kvpool_operator_leader",
            "1 while this replica holds the leader Lease (acts), 0 while it stands by.",
            registry=r,
        )
        self.rollout_phase = Gauge(
            "kvpool_rollout_phase",
            "1 for the current rollout phase of a pool (Idle, Progressing, Paused, Promoted, "
            "Aborted), 0 for the others.",
            ["namespace", "pool", "phase"],
            registry=r,
        )
        self.rollout_gate_value = Gauge(
            "kvpool_rollout_gate_value",
            "The last figure a rollout gate compared, per track (kvCapacity: KV tokens per "
            "replica; ttftP95: seconds; preemptionsPerRequest).",
            ["namespace", "pool", "gate", "track"],
            registry=r,
        )

    def record_conditions(
        self, namespace: str, pool: str, conditions: Iterable[tuple[str, str]]
    ) -> None:
        """Export a pool's conditions, given as (type, status) pairs (alerts read them)."""
        for type_, status in conditions:
            self.pool_condition.labels(namespace, pool, type_).set(1 if status == "True" else 0)

    def forget_pool(self, namespace: str, pool: str) -> None:
        """Drop a deleted pool's per-pool series (no alert on a pool that is gone)."""
        children: list[tuple[Gauge, tuple[str, ...]]] = [(self.warm_replicas, (namespace, pool))]
        children += [
            (self.pool_condition, (namespace, pool, type_)) for type_ in MODELPOOL_CONDITION_TYPES
        ]
        # a pool deleted mid-rollout must not keep KvpoolRolloutPaused firing
        children += [
            (self.rollout_phase, (namespace, pool, phase)) for phase in get_args(RolloutPhase)
        ]
        children += [
            (self.rollout_gate_value, (namespace, pool, gate, track))
            for gate in get_args(GateName)
            for track in ("stable", "canary")
        ]
        for gauge, labels in children:
            with contextlib.suppress(KeyError):  # never set for this pool
                gauge.remove(*labels)

    def serve(self, port: int, host: str) -> None:
        """Serve /metrics in a background thread."""
        start_http_server(port, addr=host, registry=self.registry)
