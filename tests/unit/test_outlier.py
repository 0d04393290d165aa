"""Outlier ejection decisions (kvpool.domain.outlier): scripts of events and the verdicts."""

from __future__ import annotations

import pytest

from kvpool.domain.outlier import (
    Eject,
    OutlierPolicy,
    ReplicaHealth,
    Restore,
    Stay,
    decide_failure,
    decide_success,
)

POLICY = OutlierPolicy(base_seconds=2.0, max_seconds=10.0, forget_seconds=60.0, health_misses=2)

# (time, event) -> expected verdict; event: "refused", "timeout", "health" (failures) or "ok"
CASES: dict[str, list[tuple[float, str, object]]] = {
    "one-failure-ejects-at-once": [(0.0, "timeout", Eject(2.0, 2.0, "timeout"))],
    "refused-ejects": [(5.0, "refused", Eject(7.0, 2.0, "refused"))],
    # a probe answered late once (a loaded machine) is no evidence of a hung engine: ejecting
    # would end every request in flight on the replica with 504
    "one-missed-probe-does-not-eject": [
        (0.0, "health", Stay()),
        (0.5, "ok", Stay()),
        (1.0, "health", Stay()),
    ],
    "the-second-missed-probe-in-a-row-ejects": [
        (0.0, "health", Stay()),
        (1.5, "health", Eject(3.5, 2.0, "health")),
    ],
    "a-request-failure-ejects-between-missed-probes": [
        (0.0, "health", Stay()),
        (0.5, "refused", Eject(2.5, 2.0, "refused")),
    ],
    "failures-while-out-change-nothing": [
        (0.0, "health", Stay()),
        (0.0, "health", Eject(2.0, 2.0, "health")),
        (1.0, "health", Stay()),
        (1.5, "timeout", Stay()),
    ],
    "success-before-the-time-is-over-stays-out": [
        (0.0, "timeout", Eject(2.0, 2.0, "timeout")),
        (1.0, "ok", Stay()),
    ],
    "probe-after-the-time-restores": [
        (0.0, "timeout", Eject(2.0, 2.0, "timeout")),
        (2.0, "ok", Restore()),
        (2.5, "ok", Stay()),
    ],
    # once out, the first missed probe after the ejection time ejects again (still hung)
    "ejection-time-grows-and-is-capped": [
        (0.0, "timeout", Eject(2.0, 2.0, "timeout")),
        (2.0, "health", Eject(6.0, 4.0, "health")),
        (6.0, "health", Eject(14.0, 8.0, "health")),
        (14.0, "health", Eject(24.0, 10.0, "health")),
    ],
    "misses-counted-again-after-a-return": [
        (0.0, "timeout", Eject(2.0, 2.0, "timeout")),
        (2.0, "ok", Restore()),
        (3.0, "health", Stay()),
        (3.5, "health", Eject(7.5, 4.0, "health")),
    ],
    "count-kept-after-a-short-return": [
        (0.0, "timeout", Eject(2.0, 2.0, "timeout")),
        (2.0, "ok", Restore()),
        (10.0, "ok", Stay()),
        (11.0, "timeout", Eject(15.0, 4.0, "timeout")),
    ],
    "count-forgotten-after-a-long-healthy-spell": [
        (0.0, "timeout", Eject(2.0, 2.0, "timeout")),
        (2.0, "ok", Restore()),
        (62.0, "ok", Stay()),
        (63.0, "timeout", Eject(65.0, 2.0, "timeout")),
    ],
}


@pytest.mark.parametrize("script", list(CASES.values()), ids=list(CASES))
def test_outlier_decisions(script: list[tuple[float, str, object]]) -> None:
    state = ReplicaHealth()
    for now, event, expected in script:
        if event == "ok":
            state, verdict = decide_success(state, now, POLICY)
        else:
            state, verdict = decide_failure(state, event, now, POLICY)  # type: ignore[arg-type]
        assert verdict == expected, (now, event)
        assert state.ejected == (state.ejected_until is not None)
