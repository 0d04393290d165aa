"""Turn what the demo observed into per-tier figures, a compact table and a JSON document.

Why this module exists: the demo's claim ("interactive keeps its latency while batch floods
the pool") must rest on numbers measured in three places that disagree on format - the
client (TTFT per request), the gateway's ``/metrics`` (queue-time histogram and admission
decisions by tier) and the engines' ``/metrics`` (preemptions, tokens). Everything here is
pure: the harness fetches the texts, these functions compute, so the arithmetic is tested
on its own (e2e/test_report.py) without starting anything.

Worked example (queue-time quantile from cumulative buckets, as PromQL's
``histogram_quantile`` does it)::

    buckets  le=0.01: 6, le=0.1: 8, le=1.0: 10, +Inf: 10       (10 observations)
    p50 -> rank 5.0 falls in (0, 0.01]     -> 0 + 0.01 * 5/6          = 0.00833
    p95 -> rank 9.5 falls in (0.1, 1.0]    -> 0.1 + 0.9 * (9.5-8)/2   = 0.775
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

QUEUE_HISTOGRAM = "kvpool_gateway_queue_seconds"
DECISIONS_COUNTER = "kvpool_gateway_admission_decisions_total"
ENGINE_PREEMPTIONS = "vllm:num_preemptions_total"
ENGINE_GENERATION_TOKENS = "vllm:generation_tokens_total"
ENGINE_PROMPT_TOKENS = "vllm:prompt_tokens_total"

Bucket = tuple[float, float]  # (upper bound "le", cumulative count)
Sample = tuple[str, dict[str, str], float]  # (sample name, labels, value)


@dataclass(frozen=True)
class RequestRecord:
    """One request the load generator sent, as the client saw it."""

    tier: str  # the tier the demo's traffic class is meant to land in
    status: int  # HTTP status (0: no answer at all, e.g. connection error)
    ttft: float | None  # seconds to the first streamed token (None if none arrived)
    latency: float  # seconds from send to the end of the answer
    output_tokens: int  # completion tokens (usage chunk, else content chunks)
    error: str | None = None  # error code of a refusal, or the exception name


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation between order statistics.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.5
    >>> percentile([], 0.95) is None
    True
    """
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def histogram_quantile(buckets: Sequence[Bucket], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram, interpolated inside its bucket.

    Follows PromQL's ``histogram_quantile``: the lower edge of the first bucket is 0; a
    rank that lands in the ``+Inf`` bucket answers the largest finite bound; no
    observations answer None. See the module docstring for a worked example.
    """
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return previous_bound
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (
                count - previous_count
            )
        previous_bound, previous_count = bound, count
    return previous_bound


def parse_samples(metrics_text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition as (name, labels, value)."""
    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
    ]


def sum_samples(samples: Iterable[Sample], name: str, **match: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``match``."""
    return sum(
        value
        for sample_name, labels, value in samples
        if sample_name == name and all(labels.get(k) == v for k, v in match.items())
    )


def histogram_buckets(samples: Iterable[Sample], name: str, **match: str) -> list[Bucket]:
    """The cumulative buckets of histogram ``name`` (summed over label sets that match)."""
    totals: dict[float, float] = {}
    for sample_name, labels, value in samples:
        if sample_name != f"{name}_bucket":
            continue
        if any(labels.get(k) != v for k, v in match.items()):
            continue
        bound = float(labels["le"])
        totals[bound] = totals.get(bound, 0.0) + value
    return sorted(totals.items())


def label_values(samples: Iterable[Sample], name: str, label: str) -> dict[str, float]:
    """Per value of ``label``, the sum of the samples called ``name``."""
    values: dict[str, float] = {}
    for sample_name, labels, value in samples:
        if sample_name == name and label in labels:
            values[labels[label]] = values.get(labels[label], 0.0) + value
    return values


@dataclass(frozen=True)
class TierResult:
    """What one tier got during the traffic phase."""

    tier: str
    requests: int  # requests sent
    admitted: int  # answered 200 (the gateway admitted and the engine served them)
    rejected: int  # refused by the gateway (429, 503, 413, ...)
    failed: int  # no answer or another error
    ttft_p50: float | None  # seconds, client-side, admitted streaming requests
    ttft_p95: float | None
    queue_p50: float | None  # seconds, the gateway's queue-time histogram for the tier
    queue_p95: float | None
    queue_observations: int  # admissions the histogram counted
    output_tokens: int  # completion tokens received
    tokens_per_second: float  # output_tokens / seconds from the first send to the last answer
    decisions: dict[str, int] = field(default_factory=dict)  # gateway outcome -> count
    refusals: dict[str, int] = field(default_factory=dict)  # client-seen error code -> count


def build_tier_result(
    tier: str,
    records: Sequence[RequestRecord],
    gateway_samples: Sequence[Sample],
    elapsed: float,
) -> TierResult:
    """Figures of one tier from the client's records and the gateway's metrics.

    ``elapsed``: seconds from the first request sent to the last answer (traffic + drain).
    """
    mine = [r for r in records if r.tier == tier]
    admitted = [r for r in mine if r.status == 200]
    rejected = [r for r in mine if 400 <= r.status < 600 and r.status != 200]
    refusals: dict[str, int] = {}
    for record in rejected:
        code = f"{record.status} {record.error or ''}".strip()
        refusals[code] = refusals.get(code, 0) + 1
    buckets = histogram_buckets(gateway_samples, QUEUE_HISTOGRAM, tier=tier)
    decisions = {
        outcome: int(count)
        for outcome, count in sorted(
            label_values(
                [s for s in gateway_samples if s[1].get("tier") == tier],
                DECISIONS_COUNTER,
                "outcome",
            ).items()
        )
        if count
    }
    ttfts = [r.ttft for r in admitted if r.ttft is not None]
    output_tokens = sum(r.output_tokens for r in admitted)
    return TierResult(
        tier=tier,
        requests=len(mine),
        admitted=len(admitted),
        rejected=len(rejected),
        failed=len(mine) - len(admitted) - len(rejected),
        ttft_p50=percentile(ttfts, 0.50),
        ttft_p95=percentile(ttfts, 0.95),
        queue_p50=histogram_quantile(buckets, 0.50),
        queue_p95=histogram_quantile(buckets, 0.95),
        queue_observations=int(buckets[-1][1]) if buckets else 0,
        output_tokens=output_tokens,
        tokens_per_second=round(output_tokens / elapsed, 1) if elapsed > 0 else 0.0,
        decisions=decisions,
        refusals=refusals,
    )


@dataclass(frozen=True)
class EngineDelta:
    """Engine counters over the traffic phase, summed over engines."""

    preemptions: int
    prompt_tokens: int
    generation_tokens: int


def build_engine_delta(
    before: Sequence[Sequence[Sample]], after: Sequence[Sequence[Sample]]
) -> EngineDelta:
    """Counter increases between two scrapes of each engine (same order in both lists)."""

    def total(scrapes: Sequence[Sequence[Sample]], name: str) -> float:
        return sum(sum_samples(samples, name) for samples in scrapes)

    return EngineDelta(
        preemptions=int(total(after, ENGINE_PREEMPTIONS) - total(before, ENGINE_PREEMPTIONS)),
        prompt_tokens=int(total(after, ENGINE_PROMPT_TOKENS) - total(before, ENGINE_PROMPT_TOKENS)),
        generation_tokens=int(
            total(after, ENGINE_GENERATION_TOKENS) - total(before, ENGINE_GENERATION_TOKENS)
        ),
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def format_table(tiers: Sequence[TierResult], engine: EngineDelta) -> str:
    """The compact per-tier table the demo prints at the end."""
    header = (
        f"{'TIER':<12} {'REQUESTS':>8} {'ADMITTED':>8} {'REJECTED':>8} {'FAILED':>6} "
        f"{'TTFT p50':>9} {'TTFT p95':>9} {'QUEUE p50':>9} {'QUEUE p95':>9} {'OUT TOK/S':>9}"
    )
    lines = [header]
    for t in tiers:
        lines.append(
            f"{t.tier:<12} {t.requests:>8} {t.admitted:>8} {t.rejected:>8} {t.failed:>6} "
            f"{_ms(t.ttft_p50):>9} {_ms(t.ttft_p95):>9} {_ms(t.queue_p50):>9} "
            f"{_ms(t.queue_p95):>9} {t.tokens_per_second:>9.1f}"
        )
    lines.append(
        f"engines: {engine.preemptions} preemptions, {engine.prompt_tokens} prompt tokens, "
        f"{engine.generation_tokens} generated tokens during the traffic phase"
    )
    for t in tiers:
        if t.decisions or t.refusals:
            decided = ", ".join(f"{k} {v}" for k, v in t.decisions.items()) or "-"
            refused = ", ".join(f"{k}: {v}" for k, v in t.refusals.items()) or "none"
            lines.append(f"{t.tier}: gateway decisions [{decided}]; refusals [{refused}]")
    return "\n".join(lines)


def build_results_document(
    tiers: Sequence[TierResult], engine: EngineDelta, context: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON document written to bench/results/local_demo.json."""
    return {
        **context,
        "tiers": {t.tier: asdict(t) for t in tiers},
        "engine": asdict(engine),
    }


BUDGET_OVERLAP = "kvpool_gateway_budget_overlap_total"


def describe_budget_overlap(samples: Iterable[Sample]) -> str:
    """How the gateway's budget charges met their engine requests, in one sentence."""
    counts = label_values(samples, BUDGET_OVERLAP, "result")
    ahead = counts.pop("overlap", 0.0)
    refused = counts.pop("refused", 0.0)
    ended = counts.pop("ended", 0.0)
    waited = ", ".join(f"{reason} {count:.0f}" for reason, count in sorted(counts.items()))
    return (
        f"budget charges: {ahead:.0f} streams went to their engine ahead of their verdict "
        f"(the Redis round trip under the prefill), {sum(counts.values()):.0f} waited for it"
        + (f" ({waited})" if waited else "")
        + f", {refused:.0f} refused after going ahead, {ended:.0f} ended before the verdict"
        " was needed"
    )
