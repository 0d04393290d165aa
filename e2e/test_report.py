"""The demo's arithmetic and manifest filling, tested alone (pure functions, no processes).

The local demo's claims rest on these numbers: quantiles of client TTFTs, quantiles of the
gateway's queue-time histogram (as PromQL computes them), counter deltas of the engines,
and the per-tier split of what the client saw. Each table below states inputs and the
expected figure worked out by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from e2e.cluster_view import (
    STATIC_ENDPOINTS,
    build_local_manifests,
    build_scrape_targets,
    load_manifests,
)
from e2e.report import (
    RequestRecord,
    build_engine_delta,
    build_tier_result,
    describe_budget_overlap,
    histogram_quantile,
    parse_samples,
    percentile,
)
from kvpool.adapters.prometheus import LABEL_NAMESPACE, LABEL_POOL, LABEL_REPLICA, LABEL_REVISION


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([], 0.5, None, id="no-values"),
        pytest.param([3.0], 0.95, 3.0, id="one-value"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 0.5, 2.5, id="median-between-two"),
        pytest.param([4.0, 1.0, 3.0, 2.0], 0.5, 2.5, id="unsorted-input"),
        pytest.param([float(i) for i in range(1, 101)], 0.95, 95.05, id="p95-of-1-to-100"),
        pytest.param([1.0, 2.0], 1.0, 2.0, id="max"),
    ],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    result = percentile(values, q)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


INF = math.inf


@pytest.mark.parametrize(
    ("buckets", "q", "expected"),
    [
        pytest.param([], 0.5, None, id="no-buckets"),
        pytest.param([(0.1, 0.0), (INF, 0.0)], 0.5, None, id="no-observations"),
        pytest.param(
            [(0.01, 6.0), (0.1, 8.0), (1.0, 10.0), (INF, 10.0)],
            0.5,
            0.01 * 5 / 6,
            id="docstring-p50-first-bucket",
        ),
        pytest.param(
            [(0.01, 6.0), (0.1, 8.0), (1.0, 10.0), (INF, 10.0)],
            0.95,
            0.1 + 0.9 * 1.5 / 2,
            id="docstring-p95-interpolated",
        ),
        pytest.param([(1.0, 4.0), (2.0, 4.0), (INF, 10.0)], 0.95, 2.0, id="rank-in-inf-bucket"),
        pytest.param(
            [(INF, 10.0), (1.0, 10.0), (0.5, 5.0)], 0.5, 0.5, id="unsorted-buckets-sorted-first"
        ),
    ],
)
def test_histogram_quantile(
    buckets: list[tuple[float, float]], q: float, expected: float | None
) -> None:
    result = histogram_quantile(buckets, q)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


def gateway_metrics(*, interactive: tuple[int, int], batch: tuple[int, int]) -> str:
    """A gateway exposition: per tier (admissions within 10 ms, admissions within 1 s)."""
    lines = [
        "# HELP kvpool_gateway_queue_seconds Time from arrival to admission.",
        "# TYPE kvpool_gateway_queue_seconds histogram",
    ]
    for tier, (fast, slow) in (("interactive", interactive), ("batch", batch)):
        labels = f'pool="tiny",tier="{tier}"'
        lines += [
            f'kvpool_gateway_queue_seconds_bucket{{{labels},le="0.01"}} {fast}',
            f'kvpool_gateway_queue_seconds_bucket{{{labels},le="1.0"}} {fast + slow}',
            f'kvpool_gateway_queue_seconds_bucket{{{labels},le="+Inf"}} {fast + slow}',
            f"kvpool_gateway_queue_seconds_count{{{labels}}} {fast + slow}",
            f"kvpool_gateway_queue_seconds_sum{{{labels}}} 0.0",
        ]
    lines += [
        "# HELP kvpool_gateway_admission_decisions Admission decisions.",
        "# TYPE kvpool_gateway_admission_decisions counter",
        'kvpool_gateway_admission_decisions_total{pool="tiny",tier="batch",outcome="queued"} 5.0',
        'kvpool_gateway_admission_decisions_total{pool="tiny",tier="batch",'
        'outcome="rejected-deadline"} 2.0',
        'kvpool_gateway_admission_decisions_total{pool="tiny",tier="interactive",'
        'outcome="admitted"} 3.0',
    ]
    return "\n".join(lines) + "\n"


def record(
    tier: str,
    status: int = 200,
    ttft: float | None = 0.05,
    tokens: int = 10,
    error: str | None = None,
) -> RequestRecord:
    """A client-side record (latency 1 s)."""
    return RequestRecord(tier, status, ttft, 1.0, tokens, error)


@pytest.mark.parametrize(
    ("records", "tier", "expected"),
    [
        pytest.param(
            [record("interactive", ttft=0.01), record("interactive", ttft=0.03)],
            "interactive",
            {"requests": 2, "admitted": 2, "rejected": 0, "failed": 0, "ttft_p50": 0.02},
            id="all-served",
        ),
        pytest.param(
            [
                record("batch", tokens=200),
                record("batch", status=503, ttft=None, tokens=0, error="queue_wait_exceeded"),
                record("batch", status=0, ttft=None, tokens=0, error="ClientError"),
                record("interactive"),
            ],
            "batch",
            {
                "requests": 3,
                "admitted": 1,
                "rejected": 1,
                "failed": 1,
                "output_tokens": 200,
                "tokens_per_second": 20.0,
                "refusals": {"503 queue_wait_exceeded": 1},
                "decisions": {"queued": 5, "rejected-deadline": 2},
            },
            id="served-refused-failed-split",
        ),
        pytest.param(
            [], "interactive", {"requests": 0, "ttft_p50": None, "admitted": 0}, id="no-traffic"
        ),
    ],
)
def test_build_tier_result_splits_what_the_client_saw(
    records: list[RequestRecord], tier: str, expected: dict[str, object]
) -> None:
    samples = parse_samples(gateway_metrics(interactive=(3, 0), batch=(1, 3)))
    result = build_tier_result(tier, records, samples, elapsed=10.0)
    for field, value in expected.items():
        actual = getattr(result, field)
        assert actual == (pytest.approx(value) if isinstance(value, float) else value), field


@pytest.mark.parametrize(
    ("tier", "observations", "p50_at_most", "p95_at_least"),
    [
        pytest.param("interactive", 3, 0.01, 0.0, id="interactive-all-fast"),
        pytest.param("batch", 4, 1.0, 0.01, id="batch-mostly-slow"),
    ],
)
def test_queue_quantiles_are_per_tier(
    tier: str, observations: int, p50_at_most: float, p95_at_least: float
) -> None:
    samples = parse_samples(gateway_metrics(interactive=(3, 0), batch=(1, 3)))
    result = build_tier_result(tier, [], samples, elapsed=10.0)
    assert result.queue_observations == observations
    assert result.queue_p50 is not None
    assert result.queue_p95 is not None
    assert result.queue_p50 <= p50_at_most
    assert result.queue_p95 >= p95_at_least


def engine_metrics(preemptions: float, generated: float) -> str:
    return (
        "# TYPE vllm:num_preemptions counter\n"
        f'vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preemptions}\n'
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {generated}\n'
    )


@pytest.mark.parametrize(
    ("before", "after", "preemptions", "generated"),
    [
        pytest.param([(0, 8)], [(3, 1008)], 3, 1000, id="one-engine"),
        pytest.param([(1, 0), (2, 0)], [(1, 50), (7, 70)], 5, 120, id="two-engines-summed"),
    ],
)
def test_engine_delta_sums_counter_increases(
    before: list[tuple[float, float]],
    after: list[tuple[float, float]],
    preemptions: int,
    generated: int,
) -> None:
    delta = build_engine_delta(
        [parse_samples(engine_metrics(*b)) for b in before],
        [parse_samples(engine_metrics(*a)) for a in after],
    )
    assert (delta.preemptions, delta.generation_tokens) == (preemptions, generated)


@pytest.mark.parametrize(
    ("ports", "annotation"),
    [
        pytest.param([25001], "engine-0=http://127.0.0.1:25001", id="one-engine"),
        pytest.param(
            [25001, 25002],
            "engine-0=http://127.0.0.1:25001,engine-1=http://127.0.0.1:25002",
            id="two-engines",
        ),
    ],
)
def test_local_manifests_point_the_pool_at_the_engines(ports: list[int], annotation: str) -> None:
    docs = load_manifests()
    rendered = build_local_manifests(docs, Path("/m/tiny"), ports)
    pool = next(d for d in rendered if d["kind"] == "ModelPool")
    assert pool["metadata"]["annotations"][STATIC_ENDPOINTS] == annotation
    assert pool["spec"]["model"]["tokenizerPath"] == "/m/tiny/tokenizer.json"
    assert pool["spec"]["capacity"]["minReplicas"] == len(ports)
    assert [d["kind"] for d in rendered] == [d["kind"] for d in docs]
    assert docs != rendered  # the originals are left alone


def test_scrape_targets_carry_the_labels_the_operator_queries_by() -> None:
    """The label names are the operator's own (kvpool.adapters.prometheus), not copies."""
    pod_labels = {
        "kvpool.dev/pool": "tiny",
        "kvpool.dev/revision": "abc123",
        "kvpool.dev/track": "stable",
        "app.kubernetes.io/managed-by": "kvpool",
    }
    targets = build_scrape_targets(["127.0.0.1:1", "127.0.0.1:2"], pod_labels)
    assert [t.address for t in targets] == ["127.0.0.1:1", "127.0.0.1:2"]
    assert dict(targets[1].labels) == {
        LABEL_POOL: "tiny",
        LABEL_REVISION: "abc123",
        "kvpool_track": "stable",
        LABEL_NAMESPACE: "kvpool-demo",
        LABEL_REPLICA: "engine-1",
    }


def test_describe_budget_overlap_counts_ahead_waited_and_refused() -> None:
    name = "kvpool_gateway_budget_overlap_total"
    samples = [
        (name, {"result": "overlap"}, 40.0),
        (name, {"result": "no-view"}, 2.0),
        (name, {"result": "stale"}, 1.0),
        (name, {"result": "refused"}, 1.0),
        (name, {"result": "ended"}, 5.0),
        ("kvpool_gateway_other_total", {"result": "overlap"}, 9.0),
    ]
    assert describe_budget_overlap(samples) == (
        "budget charges: 40 streams went to their engine ahead of their verdict (the Redis "
        "round trip under the prefill), 3 waited for it (no-view 2, stale 1), 1 refused "
        "after going ahead, 5 ended before the verdict was needed"
    )
    assert describe_budget_overlap([]).startswith("budget charges: 0 streams")
