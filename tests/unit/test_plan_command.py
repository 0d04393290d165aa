"""``kvpool plan``: the report document, its table rendering, and the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvpool.cli import main
from kvpool.commands.plan import build_plan_report, render_table
from tests.builders import modelpool_manifest, standard_tierpolicy_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_report_of_the_worked_example() -> None:
    pool = (
        modelpool_manifest("llama-8b").replicas(1, 8).peak(interactive=60, batch=40, eval=8).obj()
    )

    report = build_plan_report([pool], [standard_tierpolicy_manifest().obj()], 200_000)

    (entry,) = report["pools"]
    assert report["formatVersion"] == 1
    assert entry["ok"] is True
    assert (entry["replicas"], entry["kvSource"]) == (3, "Override")
    assert (entry["liveSequencesPerReplica"], entry["slotsPerReplica"]) == (58, 256)
    assert (entry["sharedTokens"], entry["sharedSlots"]) == (54_000, 78)
    assert [(t["name"], t["floorTokens"], t["floorSlots"]) for t in entry["tiers"]] == [
        ("interactive", 270_000, 384),
        ("batch", 162_000, 230),
        ("eval", 54_000, 76),
    ]


def test_unplannable_pool_is_reported_not_guessed() -> None:
    report = build_plan_report(
        [modelpool_manifest().obj()], [standard_tierpolicy_manifest().obj()], None
    )

    (entry,) = report["pools"]
    assert entry["ok"] is False
    assert entry["error"]["reason"] == "CapacityUnknown"
    assert entry["replicas"] is None
    assert "NO PLAN (CapacityUnknown)" in render_table(report)


def test_table_shows_floors_shared_and_warnings() -> None:
    pool = modelpool_manifest("tight").replicas(1, 2).peak(interactive=500).obj()

    table = render_table(build_plan_report([pool], [standard_tierpolicy_manifest().obj()], 200_000))

    assert "ModelPool default/tight  (TierPolicy tiers)" in table
    assert "warm replicas 2" in table
    assert "180,000" in table  # usable tokens per replica, thousands separated
    lines = table.splitlines()
    interactive = next(line for line in lines if line.strip().startswith("interactive"))
    assert interactive.split()[:4] == ["interactive", "50", "180,000", "256"]
    assert "live p95 sequences/replica 58 (sizing)" in table
    assert "admission slots/replica 256 (maxNumSeqs)" in table
    assert any(line.strip().startswith("(shared)") for line in lines)
    assert any("capacity short for tier 'interactive'" in line for line in lines)


@pytest.mark.parametrize("output", ["json", "yaml", "table"])
def test_cli_plans_the_examples(output: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "-f", str(EXAMPLES), "--kv-tokens-per-replica", "200000", "-o", output])

    out = capsys.readouterr().out
    assert code == 0
    if output == "table":
        assert "ModelPool llm/llama-8b" in out
        assert "ModelPool llm/llama-70b" in out
        return
    report = json.loads(out) if output == "json" else yaml.safe_load(out)
    by_name = {p["name"]: p for p in report["pools"]}
    assert set(by_name) == {"llama-8b", "llama-70b"}
    assert by_name["llama-8b"]["replicas"] == 7
    assert by_name["llama-8b"]["liveSequencesPerReplica"] == 47
    assert by_name["llama-70b"]["replicas"] == 6
    assert all(p["kvSource"] == "Override" for p in report["pools"])


def test_cli_without_override_uses_declared_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(EXAMPLES), "-o", "json"]) == 0

    report = json.loads(capsys.readouterr().out)
    assert {p["name"]: p["kvTokensPerReplica"] for p in report["pools"]} == {
        "llama-8b": 400_000,
        "llama-70b": 380_000,
    }
    assert {p["kvSource"] for p in report["pools"]} == {"Declared"}


def test_cli_refuses_invalid_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = modelpool_manifest("orphan").policy("missing").dict()
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(broken))

    code = main(["plan", "-f", str(tmp_path)])

    err = capsys.readouterr().err
    assert code == 1
    assert "ModelPool/orphan" in err
    assert "spec.tierPolicyRef" in err
    assert "no plan" in err


def test_json_output_is_a_document_even_when_validation_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = modelpool_manifest("orphan").policy("missing").dict()
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(broken))

    code = main(["plan", "-f", str(tmp_path), "-o", "json"])

    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (report["formatVersion"], report["ok"], report["pools"]) == (1, False, [])
    (problem,) = report["problems"]
    assert (problem["kind"], problem["name"], problem["path"]) == (
        "ModelPool",
        "orphan",
        "spec.tierPolicyRef.name",
    )
    assert problem["line"].startswith(f"{tmp_path / 'pool.yaml'}: ModelPool/orphan: ")


def test_an_unplannable_pool_has_the_same_keys_with_null_figures() -> None:
    policy = standard_tierpolicy_manifest().obj()
    planned = build_plan_report([modelpool_manifest("a").obj()], [policy], 200_000)
    unplanned = build_plan_report([modelpool_manifest("b").obj()], [policy], None)

    (ok,) = planned["pools"]
    (failed,) = unplanned["pools"]
    assert set(failed) == set(ok)
    figures = {k for k, v in ok.items() if isinstance(v, int) and not isinstance(v, bool)}
    assert figures and all(failed[k] is None for k in figures)
    assert (unplanned["ok"], planned["ok"]) == (False, True)


@pytest.mark.parametrize(
    ("strict", "expected"),
    [pytest.param(False, 0, id="lenient"), pytest.param(True, 1, id="strict")],
)
def test_strict_fails_on_a_capacity_short_tier(
    strict: bool, expected: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = modelpool_manifest("tight").replicas(1, 2).peak(interactive=500).dict()
    (tmp_path / "set.yaml").write_text(
        yaml.safe_dump_all([standard_tierpolicy_manifest().dict(), short])
    )
    argv = ["plan", "-f", str(tmp_path), "--kv-tokens-per-replica", "200000", "-o", "json"]

    code = main(argv + (["--strict"] if strict else []))

    out, err = capsys.readouterr()
    assert code == expected, err
    assert json.loads(out)["pools"][0]["capacityShort"] is True
    if strict:
        assert "--strict: capacity-short: default/tight" in err


def test_cli_rejects_a_non_positive_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(EXAMPLES), "--kv-tokens-per-replica", "0"]) == 2
    assert "positive" in capsys.readouterr().err


def test_table_warns_when_a_floor_holds_less_than_one_request() -> None:
    pool = (
        modelpool_manifest("small")
        .engine(maxNumSeqs=8, maxModelLen=512)
        .lengths((64, 128), (32, 64))
        .replicas(1, 1)
        .obj()
    )

    report = build_plan_report([pool], [standard_tierpolicy_manifest().obj()], 2048)
    table = render_table(report)

    (entry,) = report["pools"]
    assert [(t["name"], t["floorSlots"]) for t in entry["tiers"]][-1] == ("eval", 1)
    assert "floor of tier 'eval' (10% = 184 tokens, 0 slots)" in table
