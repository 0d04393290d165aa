"""The Grafana dashboard the chart ships: well-formed, laid out, and querying only real metrics.

Every PromQL expression of every panel (and of the template variables) may name only
series the gateway and the operator export (read from their registries) or the vLLM
engine series listed in tests/support/promql.py. tests/integration/test_observability.py
runs the same expressions against a real Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.support.promql import (
    VLLM_METRICS,
    kvpool_exported_names,
    metric_names,
    unknown_names,
)
from tests.unit.test_helm_chart import KUBE_VERSION, by_kind, render

DASHBOARDS = Path(__file__).resolve().parents[2] / "charts" / "kvpool" / "files" / "dashboards"


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and query variables."""
    exprs = [t["expr"] for p in graph_panels(dashboard) for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            inner = text.removeprefix("label_values(").rsplit(",", 1)[0]
            exprs.append(inner)
    return exprs


def test_there_is_a_dashboard() -> None:
    assert [p.name for p in dashboard_files()] == ["kvpool.json"]


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_dashboard_is_well_formed_and_laid_out(path: Path) -> None:
    dashboard = load(path)

    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cell = {
            (grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])
        }
        assert not cell & cells, f"{panel['title']} overlaps another panel"
        cells |= cell
    for panel in graph_panels(dashboard):
        assert panel["title"] and panel["description"], panel["id"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            assert target["expr"].strip() and metric_names(target["expr"]), panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "pool"} <= variables


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_dashboard_queries_only_exported_or_engine_metrics(path: Path) -> None:
    known = kvpool_exported_names() | VLLM_METRICS

    assert unknown_names(dashboard_exprs(load(path)), known) == {}


# What the dashboard must show (issue: per pool KV capacity and usage by replica, floors vs
# in-use per tier, lent/borrowed, queue time and TTFT by tier against target, admissions
# and refusals by reason, tenant budget usage, engine preemptions, rollout phase and gates).
REQUIRED = {
    "kv-usage-by-replica": "vllm:kv_cache_usage_perc",
    "kv-capacity-by-replica": "vllm:cache_config_info",
    "floors-vs-in-use": "kvpool_gateway_tier_tokens",
    "lent-limit": "kvpool_gateway_lent_limit",
    "queue-time-by-tier": "kvpool_gateway_queue_seconds_bucket",
    "ttft-by-tier": "kvpool_gateway_tier_ttft_seconds_bucket",
    "ttft-target": "kvpool_gateway_tier_ttft_target_seconds",
    "admissions-and-refusals": "kvpool_gateway_admission_decisions_total",
    "tenant-budget-usage": "kvpool_gateway_tenant_budget_used_tokens",
    "engine-preemptions": "vllm:num_preemptions_total",
    "rollout-phase": "kvpool_rollout_phase",
    "rollout-gates": "kvpool_rollout_gate_value",
    "pools-on-the-byte-estimate": "kvpool_gateway_tokenizer_fallback",
}


@pytest.mark.parametrize("metric", REQUIRED.values(), ids=REQUIRED.keys())
def test_dashboard_shows(metric: str) -> None:
    used = set().union(
        *(metric_names(e) for e in dashboard_exprs(load(DASHBOARDS / "kvpool.json")))
    )

    assert metric in used


def test_floors_in_use_lent_and_borrowed_are_all_plotted() -> None:
    exprs = " ".join(dashboard_exprs(load(DASHBOARDS / "kvpool.json")))

    assert 'kind=~"floor|in_use"' in exprs
    assert 'kind=~"lent|borrowed"' in exprs


# --- the chart's ConfigMap ------------------------------------------------------------------


def test_no_dashboard_config_map_by_default() -> None:
    assert by_kind(render(), "ConfigMap") == []


def test_chart_ships_the_dashboards_for_the_grafana_sidecar() -> None:
    docs = render({"monitoring": {"dashboards": {"enabled": True, "namespace": "monitoring"}}})

    (configmap,) = by_kind(docs, "ConfigMap")
    kubernetes_validate.validate(configmap, KUBE_VERSION, strict=True)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert set(configmap["data"]) == {p.name for p in dashboard_files()}
    for path in dashboard_files():
        assert json.loads(configmap["data"][path.name]) == load(path)
