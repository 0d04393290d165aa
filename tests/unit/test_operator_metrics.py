"""The operator exports pool conditions as a gauge the alerts read; it forgets deleted pools."""

from __future__ import annotations

from prometheus_client import generate_latest

from kvpool.controller.metrics import OperatorMetrics


def sample(metrics: OperatorMetrics, pool: str, condition: str) -> float | None:
    value = metrics.registry.get_sample_value(
        "kvpool_operator_pool_condition",
        {"namespace": "llm", "pool": pool, "condition": condition},
    )
    return value


def test_conditions_become_one_for_true_and_zero_otherwise() -> None:
    metrics = OperatorMetrics()

    metrics.record_conditions(
        "llm", "chat", [("Ready", "True"), ("CapacityShort", "False"), ("Degraded", "Unknown")]
    )

    assert sample(metrics, "chat", "Ready") == 1
    assert sample(metrics, "chat", "CapacityShort") == 0
    assert sample(metrics, "chat", "Degraded") == 0


def test_a_flip_overwrites_the_value() -> None:
    metrics = OperatorMetrics()
    metrics.record_conditions("llm", "chat", [("CapacityShort", "False")])

    metrics.record_conditions("llm", "chat", [("CapacityShort", "True")])

    assert sample(metrics, "chat", "CapacityShort") == 1


def test_forgetting_a_pool_removes_only_its_series() -> None:
    metrics = OperatorMetrics()
    metrics.record_conditions("llm", "chat", [("Ready", "True"), ("Degraded", "True")])
    metrics.record_conditions("llm", "code", [("Ready", "False")])
    metrics.warm_replicas.labels("llm", "chat").set(2)
    metrics.rollout_phase.labels("llm", "chat", "Paused").set(1)
    metrics.rollout_gate_value.labels("llm", "chat", "kvCapacity", "canary").set(1024)

    metrics.forget_pool("llm", "chat")
    metrics.forget_pool("llm", "never-seen")  # no error for a pool without series

    text = generate_latest(metrics.registry).decode()
    assert 'pool="chat"' not in text
    assert sample(metrics, "code", "Ready") == 0
