"""``kubectl kvpool rollout``: what a human reads (render_status and render_list are pure),
which namespace it means, and the usage it refuses. Against an API server:
tests/integration/test_operator_rollout.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpool.commands.rollout import main, render_list, render_status, resolve_namespace


def pool(
    rollout: dict[str, Any] | None, steps: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec = {"rollout": {"steps": steps}} if steps else {}
    return {
        "metadata": {"name": "chat", "namespace": "llm"},
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
                "paused because: TTFTRegressed - act with `kubectl kvpool rollout "
                "resume|promote|abort chat -n llm`",
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


def test_render_list_with_and_without_namespaces() -> None:
    pools = [
        {"metadata": {"name": "chat", "namespace": "llm"}, "status": {}},
        pool({"phase": "Progressing", "stage": "Analyzing", "step": 1, "steps": 2, "weight": 50}),
    ]

    assert render_list(pools, all_namespaces=True).splitlines() == [
        "NAMESPACE  NAME  PHASE        STAGE      STEP  WEIGHT  STABLE  CANARY  REASON",
        "llm        chat  -            -          -     0%      -       -       -",
        "llm        chat  Progressing  Analyzing  2/2   50%     -       -       -",
    ]
    assert render_list(pools[:1], all_namespaces=False).splitlines()[0].startswith("NAME  ")


def kubeconfig(path: Path, current: str, namespaces: dict[str, str | None]) -> Path:
    contexts = [
        {"name": name, "context": {"cluster": "c", "user": "u"} | ({"namespace": ns} if ns else {})}
        for name, ns in namespaces.items()
    ]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": contexts,
                "current-context": current,
            }
        )
    )
    return path


NAMESPACES = {
    "flag-wins": ("team-b", None, "team-b"),
    "current-context": (None, None, "team-a"),
    "named-context": (None, "other", "team-c"),
    "context-without-namespace": (None, "bare", "default"),
}


@pytest.mark.parametrize(
    ("flag", "context", "expected"), NAMESPACES.values(), ids=NAMESPACES.keys()
)
def test_the_namespace_is_the_flag_else_the_kubeconfig_context(
    tmp_path: Path, flag: str | None, context: str | None, expected: str
) -> None:
    path = kubeconfig(
        tmp_path / "config", "main", {"main": "team-a", "other": "team-c", "bare": None}
    )

    assert resolve_namespace(flag, str(path), context) == expected


def test_without_a_kubeconfig_the_namespace_is_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)

    assert resolve_namespace(None) == "default"


USAGE = {
    "status-without-name": (["rollout", "status"], "rollout status needs a ModelPool NAME"),
    "list-with-name": (["rollout", "list", "chat"], "rollout list takes no NAME"),
    "watch-an-action": (
        ["rollout", "abort", "chat", "--watch"],
        "--watch goes with rollout status",
    ),
    "all-namespaces-status": (["rollout", "status", "chat", "-A"], "-A goes with rollout list"),
}


@pytest.mark.parametrize(("argv", "expected"), USAGE.values(), ids=USAGE.keys())
def test_usage_errors_exit_2_before_any_api_call(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert expected in capsys.readouterr().err
