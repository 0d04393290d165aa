"""Rollout gates: is the canary at least as good as stable, measured over the same window?

Why it exists: promoting a new engine revision on missing or thin data is how a bad
revision reaches every tenant. Each gate is a pure function that compares the canary with
the stable baseline *measured over the same window* and returns an explicit verdict with
the figures it used, so the state machine (:mod:`kvpool.domain.rollout.machine`) and a
human reading ``status.rollout.gates[]`` see the same thing:

- :class:`Successful` - the canary is within the threshold;
- :class:`Failed` - it is not, with enough data on both tracks to say so
  (reason ``KVCapacityShrunk``, ``TTFTRegressed`` or ``PreemptionsRegressed``);
- :class:`Inconclusive` - no verdict: fewer than ``minSamples`` requests on either track,
  an empty or NaN result (reason ``Inconclusive``), or Prometheus could not be asked
  (reason ``MetricsUnavailable``). Missing data is never a success.

Thresholds are inclusive: a ratio exactly at the threshold passes.

Worked example (minSamples 100, maxTTFTP95Ratio 1.2)::

    stable p95 0.50 s over 400 requests, canary 0.58 s over 120 -> ratio 1.16 -> Successful
    stable p95 0.50 s over 400 requests, canary 0.65 s over 120 -> ratio 1.30 -> Failed
    stable p95 0.50 s over 400 requests, canary 0.65 s over  80 -> Inconclusive (80 < 100)

The KV gate compares measured KV tokens per replica (no request samples involved):
stable 2,048, canary 1,024, minKVCapacityRatio 0.9 -> ratio 0.50 -> Failed KVCapacityShrunk.

Preemptions are compared per request. A stable track with no preemptions makes any ratio
infinite, so a preemption rate below :data:`PREEMPTION_RATE_FLOOR` (one preemption per 100
requests) on the canary always passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

GateName = Literal["kvCapacity", "ttftP95", "preemptionsPerRequest"]
GATE_KV: GateName = "kvCapacity"
GATE_TTFT: GateName = "ttftP95"
GATE_PREEMPTIONS: GateName = "preemptionsPerRequest"
GATES: tuple[GateName, ...] = (GATE_KV, GATE_TTFT, GATE_PREEMPTIONS)

# reasons (CamelCase constants, also status.rollout.reason)
KV_CAPACITY_SHRUNK = "KVCapacityShrunk"
TTFT_REGRESSED = "TTFTRegressed"
PREEMPTIONS_REGRESSED = "PreemptionsRegressed"
INCONCLUSIVE = "Inconclusive"
METRICS_UNAVAILABLE = "MetricsUnavailable"

PREEMPTION_RATE_FLOOR = 0.01  # preemptions per request below which the canary always passes


@dataclass(frozen=True)
class TrackSample:
    """One track's figure over the analysis window, and the requests behind it."""

    value: float | None  # None: no series (empty result)
    samples: int  # requests the figure is computed from (0 when unknown)


@dataclass(frozen=True)
class Measured:
    """What a gate compared: both tracks, the ratio and the threshold."""

    gate: GateName
    stable: float | None  # stable's figure (None: not available)
    canary: float | None  # canary's figure
    ratio: float | None  # canary / stable (None when not computable)
    threshold: float  # minKVCapacityRatio, maxTTFTP95Ratio or maxPreemptionRateRatio
    stable_samples: int | None  # requests behind stable's figure (None for the KV gate)
    canary_samples: int | None  # requests behind canary's figure


@dataclass(frozen=True)
class Successful:
    """The canary is within the threshold."""

    measured: Measured
    message: str
    verdict: Literal["Successful"] = "Successful"
    reason: str = "Successful"


@dataclass(frozen=True)
class Failed:
    """The canary is beyond the threshold, with enough data on both tracks."""

    measured: Measured
    reason: str  # KVCapacityShrunk, TTFTRegressed or PreemptionsRegressed
    message: str
    verdict: Literal["Failed"] = "Failed"


@dataclass(frozen=True)
class Inconclusive:
    """No verdict: too few samples, no data, NaN, or Prometheus unavailable."""

    measured: Measured
    reason: str  # Inconclusive or MetricsUnavailable
    message: str
    verdict: Literal["Inconclusive"] = "Inconclusive"


GateVerdict = Successful | Failed | Inconclusive


def _usable(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value >= 0


def assess_kv_capacity(
    stable_kv: int | None, canary_kv: int | None, min_ratio: float
) -> GateVerdict:
    """Canary KV tokens per replica against stable's (both measured by the engines).

    >>> assess_kv_capacity(2048, 1024, 0.9).reason
    'KVCapacityShrunk'
    >>> assess_kv_capacity(2048, 2048, 0.9).verdict
    'Successful'
    >>> assess_kv_capacity(2048, None, 0.9).message
    'canary KV capacity not measured yet'
    """
    ratio = canary_kv / stable_kv if stable_kv and canary_kv is not None else None
    measured = Measured(GATE_KV, stable_kv, canary_kv, ratio, min_ratio, None, None)
    if canary_kv is None:
        return Inconclusive(measured, INCONCLUSIVE, "canary KV capacity not measured yet")
    if not stable_kv:
        return Inconclusive(measured, INCONCLUSIVE, "stable KV capacity not measured")
    assert ratio is not None
    figures = (
        f"canary {canary_kv} KV tokens per replica vs stable {stable_kv} "
        f"(ratio {ratio:.2f}, minimum {min_ratio:g})"
    )
    if ratio < min_ratio:
        return Failed(measured, KV_CAPACITY_SHRUNK, f"KV capacity shrunk: {figures}")
    return Successful(measured, figures)


def _assess_ratio(
    gate: GateName,
    stable: TrackSample,
    canary: TrackSample,
    max_ratio: float,
    min_samples: int,
    error: str | None,
    failed_reason: str,
    what: str,
    floor: float = 0.0,
) -> GateVerdict:
    ratio: float | None = None
    if _usable(stable.value) and _usable(canary.value):
        assert stable.value is not None and canary.value is not None
        if stable.value > 0:
            ratio = canary.value / stable.value
        elif canary.value == 0:
            ratio = 1.0
        else:
            ratio = math.inf
    measured = Measured(
        gate, stable.value, canary.value, ratio, max_ratio, stable.samples, canary.samples
    )
    if error is not None:
        return Inconclusive(measured, METRICS_UNAVAILABLE, f"{what}: {error}")
    if stable.samples < min_samples or canary.samples < min_samples:
        return Inconclusive(
            measured,
            INCONCLUSIVE,
            f"{what}: too few requests (stable {stable.samples}, canary {canary.samples}, "
            f"minimum {min_samples} on each)",
        )
    if ratio is None:
        return Inconclusive(
            measured,
            INCONCLUSIVE,
            f"{what}: no usable value (stable {stable.value}, canary {canary.value})",
        )
    assert stable.value is not None and canary.value is not None
    figures = (
        f"{what}: canary {canary.value:.4g} vs stable {stable.value:.4g} "
        f"(ratio {ratio:.2f}, maximum {max_ratio:g}; {canary.samples}/{stable.samples} requests)"
    )
    if ratio > max_ratio and canary.value >= floor:
        return Failed(measured, failed_reason, figures)
    return Successful(measured, figures)


def assess_ttft(
    stable: TrackSample,
    canary: TrackSample,
    max_ratio: float,
    min_samples: int,
    error: str | None = None,
) -> GateVerdict:
    """p95 time to first token of the canary against stable's, same window.

    >>> assess_ttft(TrackSample(0.5, 400), TrackSample(0.65, 120), 1.2, 100).reason
    'TTFTRegressed'
    >>> assess_ttft(TrackSample(0.5, 400), TrackSample(0.65, 80), 1.2, 100).reason
    'Inconclusive'
    """
    return _assess_ratio(
        GATE_TTFT, stable, canary, max_ratio, min_samples, error, TTFT_REGRESSED, "TTFT p95 (s)"
    )


def assess_preemptions(
    stable: TrackSample,
    canary: TrackSample,
    max_ratio: float,
    min_samples: int,
    error: str | None = None,
) -> GateVerdict:
    """Preemptions per request of the canary against stable's, same window.

    >>> assess_preemptions(TrackSample(0.02, 500), TrackSample(0.1, 200), 1.5, 100).reason
    'PreemptionsRegressed'
    >>> assess_preemptions(TrackSample(0.0, 500), TrackSample(0.005, 200), 1.5, 100).verdict
    'Successful'
    """
    return _assess_ratio(
        GATE_PREEMPTIONS,
        stable,
        canary,
        max_ratio,
        min_samples,
        error,
        PREEMPTIONS_REGRESSED,
        "preemptions per request",
        floor=PREEMPTION_RATE_FLOOR,
    )
