"""Parsing an engine's /metrics: the exposition shapes vLLM and the parser produce."""

from __future__ import annotations

import pytest

from kvpool.adapters.engine_metrics import EngineLoad, parse_engine_metrics

LABELS = '{engine="0",model_name="tiny"}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{LABELS} 0.42\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{LABELS} 3.0\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{LABELS} 2.0\n"
            "# TYPE vllm:num_preemptions counter\n"
            f"vllm:num_preemptions_total{LABELS} 7.0\n",
            EngineLoad(0.42, 3, 2, 7),
        ),
        (
            f"# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{LABELS} 5.0\n",
            EngineLoad(0.0, 0, 0, 5),
        ),
        (
            'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.9\n'
            'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_running{engine="1"} 2\n',
            EngineLoad(0.9, 3, 0, 0),
        ),
        ("", EngineLoad(0.0, 0, 0, 0)),
        (
            # longer names sharing a prefix, the counter's _created sample, a timestamp, a
            # label value with spaces and a brace
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 4.0\n'
            "vllm:num_preemptions_created 1.79e9\n"
            'vllm:num_requests_waiting{model_name="a {b} c"} 2.0 1796139025000\n'
            "vllm:num_preemptions_total 3\n",
            EngineLoad(0.0, 0, 2, 3),
        ),
    ],
    ids=[
        "counter-typed-without-total",
        "counter-typed-with-total",
        "two-engines-untyped",
        "empty",
        "look-alikes-timestamps-odd-labels",
    ],
)
def test_parse_engine_metrics(text: str, expected: EngineLoad) -> None:
    assert parse_engine_metrics(text) == expected


@pytest.mark.parametrize(
    "line",
    [
        'vllm:kv_cache_usage_perc{engine="0"} high',
        "vllm:num_requests_running",
        'vllm:num_requests_waiting{x="1" 2',
    ],
)
def test_a_wanted_sample_that_is_not_a_number_is_an_error(line: str) -> None:
    """The poll keeps its last view on ValueError rather than read a broken sample as 0."""
    with pytest.raises(ValueError):
        parse_engine_metrics(line + "\n")
