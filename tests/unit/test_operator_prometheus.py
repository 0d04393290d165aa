"""The Prometheus adapter: parsing capacity series, and telling 'unreachable' from 'no data'.

Prometheus itself is faked at the HTTP boundary (a tiny server answering /api/v1/query);
the real-parts test (tests/integration/test_operator_real_parts.py) runs the real one.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_api_client import PrometheusConnect

from kvpool.adapters.prometheus import (
    LOAD_QUERIES,
    QUERY_CACHE_INFO,
    MetricsSnapshot,
    PrometheusUnavailable,
    connect,
    fetch_snapshot,
    parse_cache_info,
)
from kvpool.domain.measurement import ReplicaReading


def _series(value: str = "1", **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [0, value]}


POOL = {"namespace": "ns", "kvpool_pool": "chat", "kvpool_revision": "r1"}


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        (
            [
                _series(
                    **POOL,
                    pod="p-1",
                    kv_cache_size_tokens="4096",
                    block_size="32",
                    num_gpu_blocks="64",
                )
            ],
            {("ns", "chat", "r1"): (ReplicaReading("p-1", 4096, 32),)},
        ),
        (
            [_series(**POOL, pod="p-1", block_size="32", num_gpu_blocks="64")],
            {("ns", "chat", "r1"): (ReplicaReading("p-1", 2048, 32),)},
        ),
        (
            [
                _series(
                    **POOL,
                    instance="127.0.0.1:8001",
                    kv_cache_size_tokens="2048.0",
                    block_size="16",
                )
            ],
            {("ns", "chat", "r1"): (ReplicaReading("127.0.0.1:8001", 2048, 16),)},
        ),
        ([_series(namespace="ns", kv_cache_size_tokens="4096")], {}),
        ([_series(**POOL, pod="p", kv_cache_size_tokens="None", block_size="32")], {}),
        (
            [
                _series(**POOL, pod="p-2", kv_cache_size_tokens="2048", block_size="32"),
                _series(**POOL, pod="p-1", kv_cache_size_tokens="4096", block_size="32"),
            ],
            {
                ("ns", "chat", "r1"): (
                    ReplicaReading("p-1", 4096, 32),
                    ReplicaReading("p-2", 2048, 32),
                )
            },
        ),
    ],
    ids=[
        "kv-cache-size-tokens-wins",
        "fallback-blocks-times-block-size",
        "instance-when-no-pod-label",
        "no-pool-label-ignored",
        "unparseable-ignored",
        "two-replicas-sorted",
    ],
)
def test_parse_cache_info(series: list[dict[str, Any]], expected: dict[Any, Any]) -> None:
    assert parse_cache_info(series) == expected


class FakePrometheus(http.server.ThreadingHTTPServer):
    """Answers /api/v1/query from a dict of query -> result list (or an HTTP status)."""

    answers: dict[str, Any]
    status: int = 200


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakePrometheus

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        body = json.dumps(
            {
                "status": "success",
                "data": {"resultType": "vector", "result": self.server.answers.get(query, [])},
            }
        )
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_prometheus() -> Iterator[FakePrometheus]:
    server = FakePrometheus(("127.0.0.1", 0), _Handler)
    server.answers = {}
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _client(server: FakePrometheus) -> PrometheusConnect:
    return connect(f"http://127.0.0.1:{server.server_address[1]}")


def test_snapshot_reads_capacity_and_load(fake_prometheus: FakePrometheus) -> None:
    fake_prometheus.answers = {
        QUERY_CACHE_INFO: [
            _series(**POOL, pod="p-1", kv_cache_size_tokens="4096", block_size="32")
        ],
        LOAD_QUERIES["kv_usage"]: [_series("0.25", namespace="ns", kvpool_pool="chat")],
        LOAD_QUERIES["running"]: [_series("3", namespace="ns", kvpool_pool="chat")],
        LOAD_QUERIES["waiting"]: [_series("1", namespace="ns", kvpool_pool="chat")],
        LOAD_QUERIES["preemptions"]: [_series("0.5", namespace="ns", kvpool_pool="chat")],
        LOAD_QUERIES["ttft_p95"]: [_series("NaN", namespace="ns", kvpool_pool="chat")],
    }
    snapshot = fetch_snapshot(_client(fake_prometheus))
    assert isinstance(snapshot, MetricsSnapshot)
    assert snapshot.readings_for("ns", "chat", "r1") == (ReplicaReading("p-1", 4096, 32),)
    load = snapshot.load[("ns", "chat")]
    assert (load.kv_usage_percent, load.running, load.waiting, load.preemptions_per_second) == (
        25.0,
        3,
        1,
        0.5,
    )
    assert load.ttft_p95_seconds is None  # NaN: no requests in the window


def test_empty_answers_are_no_data_not_unavailable(fake_prometheus: FakePrometheus) -> None:
    snapshot = fetch_snapshot(_client(fake_prometheus))
    assert isinstance(snapshot, MetricsSnapshot)
    assert snapshot.readings_for("ns", "chat", "r1") == ()
    assert not snapshot.has_pool("ns", "chat")


def test_http_error_is_unavailable(fake_prometheus: FakePrometheus) -> None:
    fake_prometheus.status = 503
    result = fetch_snapshot(_client(fake_prometheus))
    assert isinstance(result, PrometheusUnavailable) and "503" in result.message


def test_connection_refused_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        result = fetch_snapshot(connect(f"http://127.0.0.1:{port}"), timeout=2)
    assert isinstance(result, PrometheusUnavailable)
    assert "unreachable" in result.message
