"""The gateway's Prometheus metrics (own registry, served on ``/metrics``).

Why this module exists: one place that names every series, so docs/0004-gateway.md, the
alerts and the dashboards agree with the code. The first-class metric is the queue time
by tier and pool: it is the latency the admission policy adds, and what a tier's
``maxQueueWait`` promises.

Series (all prefixed ``kvpool_gateway_``):

- ``queue_seconds{pool,tier}`` histogram: time from arrival to admission (0 if immediate);
- ``admission_decisions_total{pool,tier,outcome}``: admitted, borrowed, queued,
  rejected-deadline, rejected-capacity, rejected-budget, demoted, rejected-unavailable,
  rejected-estimate, forbidden;
- ``tier_tokens{pool,track,tier,kind}`` / ``tier_slots{pool,track,tier,kind}`` gauges, kind
  = in_use, floor, borrowed, lent, queued: in-use vs floor per tier and rollout track
  (refreshed on every scrape; ``queued_requests`` and ``pool_tokens`` carry ``track`` too);
- ``tenant_tokens_charged_total{tenant,window}``: tokens charged to budgets after settling;
- ``tenant_budget_used_tokens{tenant,window}`` gauge: usage seen at the last reservation;
- ``tenant_budget_limit_tokens{tenant,window}`` gauge: that window's limit (alerts divide);
- ``bound_tokens_total{pool}``: prompt + the engine's output bound (the budget charge) per
  completed request; ``actual_tokens_total`` never exceeds it;
- ``reserved_tokens_total{pool}`` / ``actual_tokens_total{pool}`` and
  ``estimate_error_tokens{pool}`` histogram (reserved - actual) per completed request;
- ``estimates_total{pool,method}``: prompt sizes by ``tokenizer`` (exact), ``bound`` (a
  long prompt's learned bound) or ``fallback`` (bytes);
- ``tokenizer_fallback{pool}`` gauge: 1 while the pool has no loadable tokenizer (no
  ``tokenizerPath``, or nothing readable there) and prompts are counted by the byte estimate;
- ``redis_errors_total{op}``: budget store calls that failed or timed out;
- ``budget_fallback_total{tier,result}``: budget verdicts made while Redis was down;
- ``budget_overlap_total{result}``: requests of tenants with budgets by how their charge
  met their engine request: ``overlap`` (sent ahead of the verdict, which allowed it),
  ``refused`` (sent ahead, then refused or demoted by the verdict: the engine request was
  aborted), ``ended`` (sent ahead, ended before its gate: refused by admission, the
  engine failed, the client left; settled when its verdict comes), or why it waited
  for the verdict first (``no-view``, ``stale``, ``near-limit``; ``waited``: not a
  stream, or admitted again after a demotion; ``off``: ``--no-budget-overlap``);
- ``upstream_errors_total{pool,kind}``: connect, timeout, status_5xx, stream_broken;
- ``requests_total{route,code}``, ``in_flight`` gauge, ``preempt_admissions_total{pool}``;
- ``config_reloads_total{result}`` and ``config_info{namespace,generated_at}``;
- ``tier_ttft_seconds{pool,tier}`` histogram: time to first token of streamed requests as
  the gateway sees it (arrival to the first content chunk, queueing included);
- ``tier_ttft_p95_seconds{pool,tier}`` / ``tier_ttft_target_seconds{pool,tier}``: the TTFT
  limiter's p95 at its last decision and the tier's ``ttftP95Target``;
- ``lent_limit{pool,tier}``: requests of lower tiers allowed on borrowed capacity (limiter);
- ``overcommit_ratio{pool,tier}``: fraction of its learned output a tier's request reserves
  (1 = no overcommit; the top tier is always 1);
- ``event_loop_lag_seconds`` histogram: how late the event loop ran a 50 ms timer; a
  stall here delays every request at once (kvpool.gateway.loop_lag);
- ``memory_trims_total``: heap trims after requests that ended other than ``ok``
  (kvpool.gateway.memory);
- ``engine_kv_usage{pool,replica}``, ``engine_preemptions_total{pool}``,
  ``borrowing_paused{pool}`` and ``engine_poll_errors_total{pool}``: what the engines'
  own ``/metrics`` said at the last poll, and whether borrowing is paused because of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvpool.domain.admission import AdmissionSnapshot

QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
ERROR_BUCKETS = (-1024, -256, -64, -16, 0, 16, 64, 256, 1024, 4096, 16384, 65536)


class _SnapshotCollector(Collector):
    """In-use vs floor per tier, read from the admission controllers at scrape time."""

    def __init__(self, snapshots: Callable[[], Iterable[tuple[str, AdmissionSnapshot]]]) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterable[GaugeMetricFamily]:
        tokens = GaugeMetricFamily(
            "kvpool_gateway_tier_tokens",
            "KV tokens per tier: in_use, floor, borrowed (above floor), lent, queued.",
            labels=["pool", "track", "tier", "kind"],
        )
        slots = GaugeMetricFamily(
            "kvpool_gateway_tier_slots",
            "Sequence slots per tier: in_use, floor, borrowed (above floor), lent.",
            labels=["pool", "track", "tier", "kind"],
        )
        queued = GaugeMetricFamily(
            "kvpool_gateway_queued_requests",
            "Requests waiting for admission.",
            labels=["pool", "track", "tier"],
        )
        pool_tokens = GaugeMetricFamily(
            "kvpool_gateway_pool_tokens",
            "KV tokens per pool: total (plan) and in_use.",
            labels=["pool", "track", "kind"],
        )
        for track, snap in self._snapshots():
            pool_tokens.add_metric([snap.pool, track, "total"], snap.total_tokens)
            pool_tokens.add_metric([snap.pool, track, "in_use"], snap.in_use_tokens)
            for t in snap.tiers:
                for kind, value in (
                    ("in_use", t.in_use_tokens),
                    ("floor", t.floor_tokens),
                    ("borrowed", t.borrowed_tokens),
                    ("lent", t.lent_tokens),
                    ("queued", t.queued_tokens),
                ):
                    tokens.add_metric([snap.pool, track, t.tier, kind], value)
                for kind, value in (
                    ("in_use", t.in_use_slots),
                    ("floor", t.floor_slots),
                    ("borrowed", t.borrowed_slots),
                    ("lent", t.lent_slots),
                ):
                    slots.add_metric([snap.pool, track, t.tier, kind], value)
                queued.add_metric([snap.pool, track, t.tier], t.queued_requests)
        yield tokens
        yield slots
        yield queued
        yield pool_tokens


class GatewayMetrics:
    """Every series of one gateway, in its own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "kvpool_gateway_"
        self.queue_seconds = Histogram(
            p + "queue_seconds",
            "Time from arrival to admission, by pool and tier.",
            ["pool", "tier"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            p + "admission_decisions",
            "Admission decisions by pool, tier and outcome.",
            ["pool", "tier", "outcome"],
            registry=r,
        )
        self.tokens_charged = Counter(
            p + "tenant_tokens_charged",
            "Tokens charged to tenant budgets (after settling), by window.",
            ["tenant", "window"],
            registry=r,
        )
        self.budget_used = Gauge(
            p + "tenant_budget_used_tokens",
            "Tokens of the window's budget in use at the tenant's last reservation.",
            ["tenant", "window"],
            registry=r,
        )
        self.budget_limit = Gauge(
            p + "tenant_budget_limit_tokens",
            "The token limit of the tenant's budget window (set with budget_used_tokens).",
            ["tenant", "window"],
            registry=r,
        )
        self.reserved_tokens = Counter(
            p + "reserved_tokens", "KV tokens reserved by completed requests.", ["pool"], registry=r
        )
        self.actual_tokens = Counter(
            p + "actual_tokens",
            "Tokens completed requests really used (prompt + output).",
            ["pool"],
            registry=r,
        )
        self.bound_tokens = Counter(
            p + "bound_tokens",
            "Prompt + the most the engine may generate (what budgets are charged at admission), "
            "of completed requests.",
            ["pool"],
            registry=r,
        )
        self.estimate_error = Histogram(
            p + "estimate_error_tokens",
            "Reserved minus actual tokens per completed request.",
            ["pool"],
            buckets=ERROR_BUCKETS,
            registry=r,
        )
        self.estimates = Counter(
            p + "estimates",
            "Prompt sizes by method: tokenizer (exact), bound (learned) or fallback (bytes).",
            ["pool", "method"],
            registry=r,
        )
        self.tokenizer_fallback = Gauge(
            p + "tokenizer_fallback",
            "1 while the pool has no loadable tokenizer (prompts use the byte estimate).",
            ["pool"],
            registry=r,
        )
        self.redis_errors = Counter(
            p + "redis_errors", "Budget store calls that failed or timed out.", ["op"], registry=r
        )
        self.budget_fallback = Counter(
            p + "budget_fallback",
            "Budget verdicts made while Redis was unavailable, by tier and result.",
            ["tier", "result"],
            registry=r,
        )
        self.budget_overlap = Counter(
            p + "budget_overlap",
            "Budget charges by how they met their engine request (overlap, refused, ended, or "
            "why the request waited for its verdict).",
            ["result"],
            registry=r,
        )
        self.upstream_errors = Counter(
            p + "upstream_errors",
            "Engine errors: connect, timeout, status_5xx, stream_broken.",
            ["pool", "kind"],
            registry=r,
        )
        self.requests = Counter(
            p + "requests",
            "Requests answered, by route and status code.",
            ["route", "code"],
            registry=r,
        )
        self.in_flight = Gauge(p + "in_flight", "Requests being served.", registry=r)
        self.preempt_admissions = Counter(
            p + "preempt_admissions",
            "Admissions that rely on the engine preempting borrowers (Reclaim: Preempt).",
            ["pool"],
            registry=r,
        )
        self.ttft = Histogram(
            p + "tier_ttft_seconds",
            "Time to first token of streamed requests, measured by the gateway.",
            ["pool", "tier"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.ttft_p95 = Gauge(
            p + "tier_ttft_p95_seconds",
            "The TTFT limiter's p95 at its last decision.",
            ["pool", "tier"],
            registry=r,
        )
        self.ttft_target = Gauge(
            p + "tier_ttft_target_seconds",
            "The tier's ttftP95Target.",
            ["pool", "tier"],
            registry=r,
        )
        self.lent_limit = Gauge(
            p + "lent_limit",
            "Requests of lower tiers allowed to run on borrowed capacity (TTFT limiter).",
            ["pool", "tier"],
            registry=r,
        )
        self.overcommit_ratio = Gauge(
            p + "overcommit_ratio",
            "Fraction of its learned output a request of the tier reserves (1: no overcommit).",
            ["pool", "tier"],
            registry=r,
        )
        self.loop_lag = Histogram(
            p + "event_loop_lag_seconds",
            "How late the event loop ran a timer (every 50 ms): a stalled loop delays all.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.memory_trims = Counter(
            p + "memory_trims",
            "Heap trims (malloc_trim) after requests that ended other than ok (cut, broken).",
            registry=r,
        )
        self.engine_kv_usage = Gauge(
            p + "engine_kv_usage",
            "vllm:kv_cache_usage_perc of each replica at the last poll (0..1).",
            ["pool", "replica"],
            registry=r,
        )
        self.engine_preemptions = Counter(
            p + "engine_preemptions",
            "Preemptions the engines reported (vllm:num_preemptions_total increases).",
            ["pool"],
            registry=r,
        )
        self.borrowing_paused = Gauge(
            p + "borrowing_paused",
            "1 while borrowing is paused because measured KV usage is near the target.",
            ["pool"],
            registry=r,
        )
        self.engine_poll_errors = Counter(
            p + "engine_poll_errors",
            "Engine /metrics polls that failed (no answer, not 200, unparsable).",
            ["pool"],
            registry=r,
        )
        self.config_reloads = Counter(
            p + "config_reloads",
            "Config loads by result (applied, rejected).",
            ["result"],
            registry=r,
        )
        self.config_info = Gauge(
            p + "config_info",
            "The config in force (value 1).",
            ["namespace", "generated_at"],
            registry=r,
        )

    def watch_snapshots(
        self, snapshots: Callable[[], Iterable[tuple[str, AdmissionSnapshot]]]
    ) -> None:
        """Export in-use vs floor gauges from the admission controllers at scrape time, one
        set per rollout track (``stable``, and ``canary`` while a canary has its own plan)."""
        self.registry.register(_SnapshotCollector(snapshots))

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
