"""``kubectl kvpool rollout status``: what a human reads (render_status is pure)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.commands.rollout import main, render_status


def pool(
    rollout: dict[str, Any] | None, steps: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec = {"rollout": {"steps": steps}} if steps else {}
    return {
        "metadata": {"name": "chat"},
        "spec": spec,
        "status": {"rollout": rollout} if rollout else {},
    }


TTFT = {
    "gate": "ttftP95",
    "verdict": "Failed",
    "reason": "TTFTRegressed",
    "stable": 0.5,
    "canary": 1.5,
    "ratio": 3.0,
    "threshold": 1.2,
    "stableSamples": 400,
    "canarySamples": 150,
    "failures": 2,
    "message": "TTFT p95 (s): canary 1.5 vs stable 0.5",
}


@pytest.mark.parametrize(
    ("rollout", "expected"),
    [
        pytest.param(None, ["no rollout recorded yet"], id="never-reconciled"),
        pytest.param(
            {"phase": "Idle", "stableRevision": "aaa", "weight": 0},
            ["ModelPool chat: Idle", "stable revision: aaa", "canary revision: -"],
            id="idle",
        ),
        pytest.param(
            {
                "phase": "Paused",
                "stage": "Analyzing",
                "reason": "TTFTRegressed",
                "step": 1,
                "weight": 0,
                "gates": [TTFT],
            },
            [
                "ModelPool chat: Paused/Analyzing (TTFTRegressed)",
                "paused because: TTFTRegressed",
                "-> 2. weight 50% for 10m",
                "ttftP95",
                "400/150",
                "TTFT p95 (s): canary 1.5 vs stable 0.5",
            ],
            id="paused-with-gate-figures",
        ),
        pytest.param(
            {
                "phase": "Progressing",
                "stage": "Analyzing",
                "step": 0,
                "weight": 10,
                "replicasAfterPromotion": 6,
                "capacityShortAfterPromotion": True,
            },
            ["canary weight:   10%", "after promotion: 6 warm replicas needed (capacity short"],
            id="promotion-cost",
        ),
    ],
)
def test_render_status(rollout: dict[str, Any] | None, expected: list[str]) -> None:
    text = render_status(pool(rollout))
    for line in expected:
        assert line in text, text


def test_unknown_verb_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["rollout", "explode", "chat"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
