"""kvpool's alerts: promtool-tested, one firing and one silent case each, a runbook each,
only real metric names, and shipped by the chart as they are tested.

The rules live in one plain file (charts/kvpool/files/alerts.yaml) that the chart embeds
in a PrometheusRule, so ``promtool test rules`` tests exactly what users install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.promql import (
    VLLM_METRICS,
    kvpool_exported_names,
    metric_names,
    unknown_names,
)
from tests.unit.test_helm_chart import by_kind, render

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "kvpool" / "files" / "alerts.yaml"
PROMTOOL_TESTS = ROOT / "tests" / "promtool" / "alerts_test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/kvpool/kvpool/blob/main/docs/runbook.md"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


ALERTS = [r["alert"] for r in rules()]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail("promtool missing: make system-deps installs prometheus (with promtool)")
        pytest.skip("promtool not installed (make system-deps)")
    return path


def test_rules_file_passes_promtool_check() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(PROMTOOL_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def promtool_cases() -> dict[str, dict[str, int]]:
    """alert -> {"firing": n, "silent": n} over every evaluation in the fixtures."""
    cases: dict[str, dict[str, int]] = {a: {"firing": 0, "silent": 0} for a in ALERTS}
    tests = yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
    for group in tests:
        for check in group.get("alert_rule_test", []):
            kind = "firing" if check.get("exp_alerts") else "silent"
            cases.setdefault(check["alertname"], {"firing": 0, "silent": 0})[kind] += 1
    return cases


def test_fixtures_test_the_rules_file_the_chart_ships() -> None:
    fixtures = yaml.safe_load(PROMTOOL_TESTS.read_text())
    files = [(PROMTOOL_TESTS.parent / f).resolve() for f in fixtures["rule_files"]]
    assert files == [RULES.resolve()]


@pytest.mark.parametrize("alert", ALERTS)
def test_every_alert_has_a_firing_and_a_silent_case(alert: str) -> None:
    counts = promtool_cases()[alert]
    assert counts["firing"] >= 1, f"{alert}: no promtool case where it fires"
    assert counts["silent"] >= 1, f"{alert}: no promtool case where it stays silent"


def test_fixtures_name_no_alert_that_does_not_exist() -> None:
    assert set(promtool_cases()) == set(ALERTS)


def runbook_sections() -> dict[str, str]:
    text = RUNBOOK.read_text()
    parts = re.split(r"^### (\S+)\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("rule", rules(), ids=ALERTS)
def test_every_alert_links_to_its_runbook_paragraph(rule: dict[str, Any]) -> None:
    alert = rule["alert"]
    annotations = rule["annotations"]

    assert annotations["runbook_url"] == f"{RUNBOOK_URL}#{alert.lower()}"
    assert annotations["summary"] and annotations["description"]
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    section = runbook_sections().get(alert)
    assert section is not None, f"docs/runbook.md has no '### {alert}' section"
    for part in ("**Means:**", "**First checks:**", "**Mitigate:**"):
        assert part in section, f"{alert}: runbook section lacks {part}"


def test_runbook_has_no_section_without_an_alert() -> None:
    assert set(runbook_sections()) == set(ALERTS)


def test_alerts_use_only_exported_or_engine_metric_names() -> None:
    known = kvpool_exported_names() | VLLM_METRICS

    assert unknown_names([r["expr"] for r in rules()], known) == {}


def test_every_alert_selects_some_metric() -> None:
    for rule in rules():
        assert metric_names(rule["expr"]), rule["alert"]


# --- the chart's PrometheusRule -------------------------------------------------------------


def test_no_prometheus_rule_by_default() -> None:
    assert by_kind(render(), "PrometheusRule") == []


def test_chart_ships_the_tested_rules_with_its_runbook_links_and_monitor_labels() -> None:
    docs = render(
        {
            "monitoring": {
                "rules": {"enabled": True, "runbookBaseUrl": "https://wiki.example.com/kvpool"}
            }
        }
    )

    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    expected = yaml.safe_load(
        RULES.read_text().replace(RUNBOOK_URL, "https://wiki.example.com/kvpool")
    )
    assert rule["spec"] == expected
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all(u.startswith("https://wiki.example.com/kvpool#") for u in urls)


def shipped_alerts(values: dict[str, Any]) -> list[str]:
    (rule,) = by_kind(render(values), "PrometheusRule")
    return [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]


def test_disabled_alerts_are_left_out() -> None:
    alerts = shipped_alerts(
        {
            "monitoring": {
                "rules": {
                    "enabled": True,
                    "disabled": ["KvpoolTenantBudgetNearlyExhausted", "KvpoolEnginePreemptions"],
                }
            }
        }
    )

    assert alerts == [
        a
        for a in ALERTS
        if a not in {"KvpoolTenantBudgetNearlyExhausted", "KvpoolEnginePreemptions"}
    ]


def test_no_gateway_absent_alert_when_the_chart_runs_no_gateway() -> None:
    alerts = shipped_alerts(
        {"monitoring": {"rules": {"enabled": True}}, "gateway": {"enabled": False}}
    )

    assert "KvpoolGatewayAbsent" not in alerts
    assert len(alerts) == len(ALERTS) - 1


def test_a_group_whose_alerts_are_all_disabled_is_left_out() -> None:
    (rule,) = by_kind(
        render(
            {"monitoring": {"rules": {"enabled": True, "disabled": ["KvpoolEnginePreemptions"]}}}
        ),
        "PrometheusRule",
    )

    assert "kvpool-engines" not in [g["name"] for g in rule["spec"]["groups"]]
    assert all(g["rules"] for g in rule["spec"]["groups"])
