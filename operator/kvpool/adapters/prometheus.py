"""Reading engine capacity and load from Prometheus.

Why it exists: the operator plans with the KV capacity the engines *report*, not with a
declared figure, and Prometheus is where every engine's ``/metrics`` already lands. One
snapshot answers for every pool at once (six queries grouped by pool and revision, not six
per pool), and the reconcile of each pool reads its part of the latest snapshot.

Series must carry the pool's identity as labels. In a cluster the scrape config copies
them from the pod labels (relabeling ``__meta_kubernetes_pod_label_kvpool_dev_pool`` to
``kvpool_pool``, ``..._revision`` to ``kvpool_revision``, the namespace to ``namespace``
and the pod name to ``pod``); in local mode the static targets carry the same labels.

What is read (vLLM v1 metric names):

- capacity per replica: ``vllm:cache_config_info`` label ``kv_cache_size_tokens``, else
  ``num_gpu_blocks * block_size`` (older engines);
- load per pool: mean ``vllm:kv_cache_usage_perc`` (x100), summed
  ``vllm:num_requests_running`` and ``..._waiting``, the preemption rate over 1m, and the
  p95 of ``vllm:time_to_first_token_seconds`` over 5m.

Two failures are kept apart on purpose: :class:`PrometheusUnavailable` (connection
error, timeout, HTTP error: we know nothing) versus a snapshot without the pool's series
(Prometheus answers, the engines do not report: no data).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from kvpool.api.modelpool import LoadStatus
from kvpool.domain.measurement import ReplicaReading

log = logging.getLogger(__name__)

LABEL_NAMESPACE = "namespace"
LABEL_POOL = "kvpool_pool"
LABEL_REVISION = "kvpool_revision"
LABEL_REPLICA = "pod"
LABEL_TRACK = "kvpool_track"

_BY = f"{LABEL_NAMESPACE}, {LABEL_POOL}"
_SEL = f'{{{LABEL_POOL}!=""}}'
QUERY_CACHE_INFO = f"vllm:cache_config_info{_SEL}"
LOAD_QUERIES = {
    "kv_usage": f"avg by ({_BY}) (vllm:kv_cache_usage_perc{_SEL})",
    "running": f"sum by ({_BY}) (vllm:num_requests_running{_SEL})",
    "waiting": f"sum by ({_BY}) (vllm:num_requests_waiting{_SEL})",
    "preemptions": f"sum by ({_BY}) (rate(vllm:num_preemptions_total{_SEL}[1m]))",
    "ttft_p95": (
        f"histogram_quantile(0.95, sum by ({_BY}, le) "
        f"(rate(vllm:time_to_first_token_seconds_bucket{_SEL}[5m])))"
    ),
}

PoolKey = tuple[str, str]  # (namespace, pool)
RevisionKey = tuple[str, str, str]  # (namespace, pool, revision)


@dataclass(frozen=True)
class PrometheusUnavailable:
    """Prometheus could not be asked (connection error, timeout or HTTP error)."""

    message: str


@dataclass(frozen=True)
class PoolLoad:
    """Live signals of one pool (None when the series is absent)."""

    kv_usage_percent: float | None = None
    running: int | None = None
    waiting: int | None = None
    preemptions_per_second: float | None = None
    ttft_p95_seconds: float | None = None

    def to_status(self, observed_at: str) -> LoadStatus:
        return LoadStatus(
            kv_usage_percent=self.kv_usage_percent,
            running=self.running,
            waiting=self.waiting,
            preemptions_per_second=self.preemptions_per_second,
            ttft_p95_seconds=self.ttft_p95_seconds,
            observed_at=observed_at,
        )


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every pool's capacity readings (per revision) and load, from one round of queries."""

    readings: Mapping[RevisionKey, tuple[ReplicaReading, ...]] = field(default_factory=dict)
    load: Mapping[PoolKey, PoolLoad] = field(default_factory=dict)

    def readings_for(self, namespace: str, pool: str, revision: str) -> tuple[ReplicaReading, ...]:
        return tuple(self.readings.get((namespace, pool, revision), ()))

    def has_pool(self, namespace: str, pool: str) -> bool:
        return any(k[:2] == (namespace, pool) for k in self.readings) or (
            (namespace, pool) in self.load
        )


def _int_label(labels: Mapping[str, str], name: str) -> int | None:
    try:
        value = float(labels[name])
    except (KeyError, ValueError):
        return None
    return int(value) if math.isfinite(value) and value > 0 else None


def parse_cache_info(series: list[dict[str, Any]]) -> dict[RevisionKey, tuple[ReplicaReading, ...]]:
    """Capacity readings from ``vllm:cache_config_info`` series, grouped by revision.

    ``kv_cache_size_tokens`` wins; ``num_gpu_blocks * block_size`` is the fallback.
    """
    grouped: dict[RevisionKey, list[ReplicaReading]] = {}
    for item in series:
        labels = item.get("metric", {})
        block = _int_label(labels, "block_size")
        tokens = _int_label(labels, "kv_cache_size_tokens")
        if tokens is None:
            blocks = _int_label(labels, "num_gpu_blocks")
            tokens = blocks * block if blocks is not None and block is not None else None
        if tokens is None or LABEL_POOL not in labels:
            continue
        key = (labels.get(LABEL_NAMESPACE, ""), labels[LABEL_POOL], labels.get(LABEL_REVISION, ""))
        replica = labels.get(LABEL_REPLICA) or labels.get("instance", "?")
        grouped.setdefault(key, []).append(ReplicaReading(replica, tokens, block))
    return {k: tuple(sorted(v, key=lambda r: r.replica)) for k, v in grouped.items()}


def _values(series: list[dict[str, Any]]) -> dict[PoolKey, float]:
    values: dict[PoolKey, float] = {}
    for item in series:
        labels = item.get("metric", {})
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            values[(labels.get(LABEL_NAMESPACE, ""), labels.get(LABEL_POOL, ""))] = value
    return values


def fetch_snapshot(
    prom: PrometheusConnect, timeout: float = 5.0
) -> MetricsSnapshot | PrometheusUnavailable:
    """One round of queries (blocking; run it in a thread)."""
    try:
        readings = parse_cache_info(prom.custom_query(QUERY_CACHE_INFO, timeout=timeout))
        raw = {
            name: _values(prom.custom_query(q, timeout=timeout)) for name, q in LOAD_QUERIES.items()
        }
    except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
        return PrometheusUnavailable(f"Prometheus at {prom.url} unreachable: {exc}"[:500])
    pools = set().union(*(v.keys() for v in raw.values()))
    load = {
        key: PoolLoad(
            kv_usage_percent=(
                round(raw["kv_usage"][key] * 100, 2) if key in raw["kv_usage"] else None
            ),
            running=int(raw["running"][key]) if key in raw["running"] else None,
            waiting=int(raw["waiting"][key]) if key in raw["waiting"] else None,
            preemptions_per_second=(
                round(raw["preemptions"][key], 4) if key in raw["preemptions"] else None
            ),
            ttft_p95_seconds=round(raw["ttft_p95"][key], 4) if key in raw["ttft_p95"] else None,
        )
        for key in pools
    }
    return MetricsSnapshot(readings=readings, load=load)


def connect(url: str, timeout: float = 5.0) -> PrometheusConnect:
    """A client that retries once, quickly: an outage must be reported within seconds."""
    retry = Retry(total=1, backoff_factor=0.1, status_forcelist=[502, 503, 504])
    return PrometheusConnect(url=url, disable_ssl=True, timeout=timeout, retry=retry)


class SnapshotCache:
    """The latest snapshot, refreshed at most every ``max_age`` seconds, shared by all pools."""

    def __init__(self, url: str | None, max_age: float, timeout: float = 5.0) -> None:
        self.url = url
        self.max_age = max_age
        self.timeout = timeout
        self._prom = connect(url, timeout) if url else None
        self._lock = asyncio.Lock()
        self._value: MetricsSnapshot | PrometheusUnavailable | None = None
        self._fetched = -math.inf
        self.last_success: float | None = None  # wall time of the last good snapshot

    @property
    def prom(self) -> PrometheusConnect | None:
        """The client (None when the operator runs without Prometheus)."""
        return self._prom

    async def get(
        self, max_age: float | None = None
    ) -> MetricsSnapshot | PrometheusUnavailable | None:
        """The current snapshot (None when the operator runs without Prometheus);
        ``max_age`` overrides the cache's own (a rollout waiting for a canary's first
        measurement asks for one at most a second old)."""
        if self._prom is None:
            return None
        limit = self.max_age if max_age is None else max_age
        async with self._lock:
            if time.monotonic() - self._fetched >= limit or self._value is None:
                self._value = await asyncio.to_thread(fetch_snapshot, self._prom, self.timeout)
                self._fetched = time.monotonic()
                if isinstance(self._value, MetricsSnapshot):
                    self.last_success = time.time()
                else:
                    log.warning("%s", self._value.message)
            return self._value


# --- rollout analysis: per-revision figures over one window --------------------------------

MIN_WINDOW_SECONDS = 30  # increase() needs two scrapes in the window, even at 15 s scrapes


def analysis_window_seconds(wanted_seconds: float) -> int:
    """The window an analysis actually queries: what was asked, at least MIN_WINDOW_SECONDS.

    >>> analysis_window_seconds(12.7), analysis_window_seconds(95.2)
    (30, 95)
    """
    return max(int(wanted_seconds), MIN_WINDOW_SECONDS)


@dataclass(frozen=True)
class TrackWindow:
    """One revision's figures over the analysis window (None: no series)."""

    ttft_p95_seconds: float | None  # p95 of vllm:time_to_first_token_seconds
    ttft_count: float  # requests with a first token in the window
    requests: float  # finished requests (vllm:e2e_request_latency_seconds_count)
    preemptions: float | None  # vllm:num_preemptions_total increase
    in_flight: float | None  # running + waiting now


def build_window_queries(
    namespace: str, pool: str, revisions: tuple[str, ...], window_seconds: int
) -> dict[str, str]:
    """The PromQL of one analysis, grouped by revision so both tracks share the window.

    >>> q = build_window_queries("ns", "chat", ("a", "b"), 60)
    >>> q["ttft_p95"].startswith("histogram_quantile(0.95, sum by (kvpool_revision, le)")
    True
    """
    sel = (
        f'{{{LABEL_NAMESPACE}="{namespace}",{LABEL_POOL}="{pool}",'
        f'{LABEL_REVISION}=~"{"|".join(revisions)}"}}'
    )
    w = f"[{analysis_window_seconds(window_seconds)}s]"
    by = f"sum by ({LABEL_REVISION})"
    return {
        "ttft_p95": (
            f"histogram_quantile(0.95, sum by ({LABEL_REVISION}, le) "
            f"(increase(vllm:time_to_first_token_seconds_bucket{sel}{w})))"
        ),
        "ttft_count": f"{by} (increase(vllm:time_to_first_token_seconds_count{sel}{w}))",
        "requests": f"{by} (increase(vllm:e2e_request_latency_seconds_count{sel}{w}))",
        "preemptions": f"{by} (increase(vllm:num_preemptions_total{sel}{w}))",
        "running": f"{by} (vllm:num_requests_running{sel})",
        "waiting": f"{by} (vllm:num_requests_waiting{sel})",
    }


def _by_revision(series: list[dict[str, Any]]) -> dict[str, float]:
    """Values by revision; NaN is kept (an empty histogram window gives NaN)."""
    values: dict[str, float] = {}
    for item in series:
        try:
            values[item.get("metric", {}).get(LABEL_REVISION, "")] = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return values


def fetch_track_windows(
    prom: PrometheusConnect,
    namespace: str,
    pool: str,
    revisions: tuple[str, ...],
    window_seconds: int,
    timeout: float = 5.0,
) -> dict[str, TrackWindow] | PrometheusUnavailable:
    """Each revision's window figures (blocking; run it in a thread)."""
    queries = build_window_queries(namespace, pool, revisions, window_seconds)
    try:
        raw = {k: _by_revision(prom.custom_query(q, timeout=timeout)) for k, q in queries.items()}
    except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
        return PrometheusUnavailable(f"Prometheus at {prom.url} unreachable: {exc}"[:500])
    result = {}
    for rev in revisions:
        running, waiting = raw["running"].get(rev), raw["waiting"].get(rev)
        result[rev] = TrackWindow(
            ttft_p95_seconds=raw["ttft_p95"].get(rev),
            ttft_count=raw["ttft_count"].get(rev, 0.0),
            requests=raw["requests"].get(rev, 0.0),
            preemptions=raw["preemptions"].get(rev),
            in_flight=(running or 0.0) + (waiting or 0.0)
            if running is not None or waiting is not None
            else None,
        )
    return result


def fetch_track_in_flight(
    prom: PrometheusConnect, namespace: str, pool: str, track: str, timeout: float = 5.0
) -> float | PrometheusUnavailable | None:
    """Requests running + waiting on a track's engines (``kvpool_track`` label); None when
    no engine of the track reports (blocking; run it in a thread)."""
    sel = f'{{{LABEL_NAMESPACE}="{namespace}",{LABEL_POOL}="{pool}",{LABEL_TRACK}="{track}"}}'
    total: float | None = None
    try:
        for metric in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            for item in prom.custom_query(f"sum({metric}{sel})", timeout=timeout):
                total = (total or 0.0) + float(item["value"][1])
    except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
        return PrometheusUnavailable(f"Prometheus at {prom.url} unreachable: {exc}"[:500])
    return total


async def fetch_track_windows_async(
    cache: SnapshotCache,
    namespace: str,
    pool: str,
    revisions: tuple[str, ...],
    window_seconds: int,
) -> dict[str, TrackWindow] | PrometheusUnavailable | None:
    """:func:`fetch_track_windows` through the cache's client (None: no Prometheus)."""
    if cache.prom is None:
        return None
    return await asyncio.to_thread(
        fetch_track_windows, cache.prom, namespace, pool, revisions, window_seconds, cache.timeout
    )


async def fetch_track_in_flight_async(
    cache: SnapshotCache, namespace: str, pool: str, track: str
) -> float | PrometheusUnavailable | None:
    """:func:`fetch_track_in_flight` through the cache's client (None: no Prometheus)."""
    if cache.prom is None:
        return None
    return await asyncio.to_thread(
        fetch_track_in_flight, cache.prom, namespace, pool, track, cache.timeout
    )
