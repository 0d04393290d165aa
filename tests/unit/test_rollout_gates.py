"""Rollout gate verdicts as tables (kvpool.domain.rollout.gates)."""

from __future__ import annotations

import math

import pytest

from kvpool.domain.rollout.gates import (
    INCONCLUSIVE,
    KV_CAPACITY_SHRUNK,
    METRICS_UNAVAILABLE,
    PREEMPTIONS_REGRESSED,
    TTFT_REGRESSED,
    TrackSample,
    assess_kv_capacity,
    assess_preemptions,
    assess_ttft,
)

S = TrackSample


@pytest.mark.parametrize(
    ("stable", "canary", "ratio", "verdict", "reason"),
    [
        pytest.param(2048, 1024, 0.9, "Failed", KV_CAPACITY_SHRUNK, id="half-kv-fails"),
        pytest.param(2048, 2048, 0.9, "Successful", "Successful", id="equal-passes"),
        pytest.param(2000, 1800, 0.9, "Successful", "Successful", id="exactly-at-threshold"),
        pytest.param(2000, 1799, 0.9, "Failed", KV_CAPACITY_SHRUNK, id="just-below-threshold"),
        pytest.param(1024, 4096, 0.9, "Successful", "Successful", id="bigger-passes"),
        pytest.param(2048, None, 0.9, "Inconclusive", INCONCLUSIVE, id="canary-not-measured"),
        pytest.param(None, 1024, 0.9, "Inconclusive", INCONCLUSIVE, id="stable-not-measured"),
    ],
)
def test_kv_gate(
    stable: int | None, canary: int | None, ratio: float, verdict: str, reason: str
) -> None:
    result = assess_kv_capacity(stable, canary, ratio)
    assert (result.verdict, result.reason) == (verdict, reason)
    assert result.measured.stable == stable and result.measured.canary == canary
    if verdict == "Failed":
        assert str(stable) in result.message and str(canary) in result.message
        assert f"{canary / stable:.2f}" in result.message  # type: ignore[operator]


NAN = math.nan
TTFT_CASES = [
    pytest.param(S(0.5, 400), S(0.58, 120), None, "Successful", "Successful", id="within"),
    pytest.param(S(0.5, 400), S(0.65, 120), None, "Failed", TTFT_REGRESSED, id="regressed"),
    pytest.param(S(0.5, 400), S(0.6, 120), None, "Successful", "Successful", id="at-threshold"),
    pytest.param(S(0.5, 400), S(0.65, 99), None, "Inconclusive", INCONCLUSIVE, id="few-canary"),
    pytest.param(S(0.5, 99), S(0.65, 400), None, "Inconclusive", INCONCLUSIVE, id="few-stable"),
    pytest.param(S(0.5, 100), S(0.6, 100), None, "Successful", "Successful", id="exactly-min"),
    pytest.param(S(None, 0), S(None, 0), None, "Inconclusive", INCONCLUSIVE, id="no-data"),
    pytest.param(S(NAN, 400), S(0.5, 400), None, "Inconclusive", INCONCLUSIVE, id="nan-stable"),
    pytest.param(S(0.5, 400), S(NAN, 400), None, "Inconclusive", INCONCLUSIVE, id="nan-canary"),
    pytest.param(S(None, 400), S(0.5, 400), None, "Inconclusive", INCONCLUSIVE, id="empty"),
    pytest.param(
        S(0.5, 400),
        S(9.0, 400),
        "connection refused",
        "Inconclusive",
        METRICS_UNAVAILABLE,
        id="prometheus-down-never-fails-or-passes",
    ),
]


@pytest.mark.parametrize(("stable", "canary", "error", "verdict", "reason"), TTFT_CASES)
def test_ttft_gate(
    stable: TrackSample, canary: TrackSample, error: str | None, verdict: str, reason: str
) -> None:
    result = assess_ttft(stable, canary, 1.2, 100, error)
    assert (result.verdict, result.reason) == (verdict, reason)
    assert result.measured.stable_samples == stable.samples
    assert result.measured.canary_samples == canary.samples
    assert result.measured.threshold == 1.2


@pytest.mark.parametrize(
    ("stable", "canary", "verdict", "reason"),
    [
        pytest.param(S(0.02, 500), S(0.1, 200), "Failed", PREEMPTIONS_REGRESSED, id="regressed"),
        pytest.param(S(0.02, 500), S(0.03, 200), "Successful", "Successful", id="at-threshold"),
        pytest.param(S(0.0, 500), S(0.0, 200), "Successful", "Successful", id="none-on-both"),
        pytest.param(S(0.0, 500), S(0.005, 200), "Successful", "Successful", id="below-floor"),
        pytest.param(S(0.0, 500), S(0.2, 200), "Failed", PREEMPTIONS_REGRESSED, id="from-zero"),
        pytest.param(S(0.0, 50), S(0.2, 200), "Inconclusive", INCONCLUSIVE, id="few-stable"),
        pytest.param(S(NAN, 500), S(0.2, 200), "Inconclusive", INCONCLUSIVE, id="nan"),
    ],
)
def test_preemption_gate(
    stable: TrackSample, canary: TrackSample, verdict: str, reason: str
) -> None:
    result = assess_preemptions(stable, canary, 1.5, 100)
    assert (result.verdict, result.reason) == (verdict, reason)
