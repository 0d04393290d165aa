"""How a gate verdict is recorded in ``status.rollout.gates[]``.

Why it exists: a verdict (:mod:`kvpool.domain.rollout.gates`) is one measurement; the
status keeps one record per gate across reconciles, and that record is what counts
towards ``failureLimit`` and what a human reads with ``kubectl get mp -o yaml``. Turning
the one into the other has rules of its own, kept here so the state machine
(:mod:`kvpool.domain.rollout.machine`) only says *when* a failure counts:

- a record carries the failures counted before it, plus one for a counted failure; a
  failure that is not counted (the window still holds the samples of the last counted
  one) says so in its message;
- figures that are not finite (an infinite ratio over a stable track at zero) are
  recorded as absent, the rest rounded to 6 decimals;
- the records keep a fixed order (KV, TTFT, preemptions) whichever were measured last.

>>> from kvpool.domain.rollout.gates import assess_kv_capacity
>>> record = gate_record(assess_kv_capacity(2048, 1024, 0.9), [], "2026-01-01T00:00:00Z", True)
>>> record.verdict, record.ratio, record.failures
('Failed', 0.5, 1)
"""

from __future__ import annotations

import math

from kvpool.api.rollout import GateStatus, RolloutStatus
from kvpool.domain.rollout.gates import Failed, GateVerdict


def gate_record(
    verdict: GateVerdict, prior: list[GateStatus], now: str, count_failure: bool
) -> GateStatus:
    """The record of ``verdict`` measured at ``now``, following its record in ``prior``
    (``count_failure``: a failure adds to the gate's count)."""
    m = verdict.measured
    old = next((g for g in prior if g.gate == m.gate), None)
    failed = isinstance(verdict, Failed)
    failures = (old.failures if old else 0) + (1 if count_failure and failed else 0)
    message = verdict.message
    if failed and not count_failure:
        message += " (the window still holds the samples of the last counted failure: not counted)"

    def finite(x: float | None) -> float | None:
        return round(x, 6) if x is not None and math.isfinite(x) else None

    return GateStatus(
        gate=m.gate,
        verdict=verdict.verdict,
        reason=verdict.reason,
        stable=finite(m.stable),
        canary=finite(m.canary),
        ratio=finite(m.ratio),
        threshold=m.threshold,
        stable_samples=m.stable_samples,
        canary_samples=m.canary_samples,
        failures=failures,
        message=message,
        measured_at=now,
    )


def with_gates(status: RolloutStatus, gates: list[GateStatus]) -> RolloutStatus:
    """``status`` with ``gates`` replacing the records of the same gates, in fixed order."""
    by_name = {g.gate: g for g in status.gates} | {g.gate: g for g in gates}
    order = ("kvCapacity", "ttftP95", "preemptionsPerRequest")
    return status.model_copy(update={"gates": [by_name[n] for n in order if n in by_name]})
