"""Pin the facts about the real parts that the operator, gateway and benchmarks rely on.

Given the tiny model served by a real vLLM CPU engine, a real Prometheus and a real Redis:
the OpenAI endpoints answer (plain and streaming), the engine publishes its KV capacity in
``vllm:cache_config_info`` exactly as ``--kv-cache-memory-bytes / 1024`` tokens (rounded
down to whole blocks), Prometheus' query API returns that series, and Redis survives a kill
and a restart on the same port.

Runtime: ~1 min on an idle machine (two engine starts of ~15 s and one failing start of
~12 s, one after the other; the main engine is shared by the module).
Figures (start time, RSS) are printed: run with ``-rP`` or ``-s`` to see them.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from kvpool.adapters.engine_metrics import parse_engine_metrics
from tests.support.engine import (
    EngineFactory,
    EngineStartError,
    VllmEngine,
    parse_cache_config_info,
)
from tests.support.prometheus import PrometheusFactory
from tests.support.redis_server import RedisFactory, ping
from tests.support.tiny_model import DEFAULT_SPEC, KV_BYTES_PER_TOKEN, generation_seconds
from tests.support.waiting import wait_until

MIB = 1024 * 1024
USABLE_TOKENS_2MIB = (16 - 1) * 128  # 16 blocks of 128 tokens, less the null block
PROMPT = "Hello world, the pool admits tokens for the tenant budget."


@pytest.fixture(scope="module")
def engine(vllm_engine_module: EngineFactory) -> VllmEngine:
    """The module's shared engine: 2 MiB of KV (16 blocks of 128), one sequence at a time.

    ``max_model_len`` 1920 is the longest that fits: 15 of the 16 blocks (one is vLLM's null
    block). One sequence at a time makes the priority queue observable.
    """
    started = vllm_engine_module(
        kv_cache_memory_bytes=2 * MIB,
        max_model_len=USABLE_TOKENS_2MIB,
        max_num_seqs=1,
        scheduling_policy="priority",
        extra_args=("--enable-per-request-metrics",),  # response "metrics": queue_time_ms
    )
    print(
        f"figures: engine start {started.start_seconds:.1f} s, "
        f"RSS {started.rss_bytes() / MIB:.0f} MiB (server + EngineCore)"
    )
    return started


def test_tiny_model_kv_cost_and_generation_time(tiny_model: Path) -> None:
    assert DEFAULT_SPEC.kv_bytes_per_token == KV_BYTES_PER_TOKEN == 1024
    assert (tiny_model / "model.safetensors").stat().st_size > 0
    assert "chat_template" in (tiny_model / "tokenizer_config.json").read_text()
    seconds = generation_seconds(tiny_model)
    assert seconds is not None
    print(f"figures: tiny model generated in {seconds:.1f} s (cached at {tiny_model})")


def _exposition(**labels: str) -> str:
    rendered = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f"vllm:cache_config_info{{{rendered}}} 1.0\n"
    )


@pytest.mark.parametrize(
    ("labels", "capacity"),
    [
        ({"block_size": "128", "num_gpu_blocks": "16", "kv_cache_size_tokens": "2048"}, 2048),
        ({"block_size": "32", "num_gpu_blocks": "30"}, 960),
        ({"block_size": "16", "num_gpu_blocks": "10", "kv_cache_size_tokens": "None"}, 160),
        # A hybrid model: the published token figure wins over blocks * block size.
        ({"block_size": "16", "num_gpu_blocks": "100", "kv_cache_size_tokens": "800"}, 800),
    ],
    ids=["size-label", "no-size-label-falls-back", "size-label-none-falls-back", "hybrid"],
)
def test_parse_cache_config_info(labels: dict[str, str], capacity: int) -> None:
    info = parse_cache_config_info(_exposition(engine="0", **labels))
    assert info.capacity_tokens == capacity
    assert info.labels["engine"] == "0"


def test_parse_cache_config_info_without_the_metric() -> None:
    with pytest.raises(LookupError):
        parse_cache_config_info("# TYPE vllm:num_requests_running gauge\n")


@pytest.mark.engine
def test_engine_lists_the_served_model(engine: VllmEngine) -> None:
    models = engine.get_json("/v1/models")
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == USABLE_TOKENS_2MIB


@pytest.mark.engine
def test_completion_counts_prompt_tokens_like_the_tokenizer(
    engine: VllmEngine, tiny_tokenizer_json: Path
) -> None:
    answer = engine.post_json(
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "priority": 3},
    )
    expected_prompt_tokens = len(Tokenizer.from_file(str(tiny_tokenizer_json)).encode(PROMPT).ids)
    assert answer["usage"]["prompt_tokens"] == expected_prompt_tokens
    assert answer["usage"]["completion_tokens"] == 6
    assert answer["choices"][0]["finish_reason"] == "length"


@pytest.mark.engine
def test_chat_completion_uses_the_chat_template(engine: VllmEngine) -> None:
    answer = engine.post_json(
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "ignore_eos": True,
        },
    )
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] == 4
    # <|user|> \n hi </s> \n <|assistant|> \n: the template added the role markers.
    assert answer["usage"]["prompt_tokens"] > 3


def _text_of(event: dict[str, Any]) -> str:
    choice = event["choices"][0]
    return str(choice.get("text") or choice.get("delta", {}).get("content") or "")


@pytest.mark.engine
@pytest.mark.parametrize(
    ("path", "request_body"),
    [
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
    ],
    ids=["completions", "chat"],
)
def test_streaming_ends_with_usage(
    engine: VllmEngine, path: str, request_body: dict[str, Any]
) -> None:
    events = list(
        engine.stream_events(
            path,
            {
                "model": "tiny",
                "max_tokens": 5,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
                **request_body,
            },
        )
    )
    # Usually one event a token, but a lagging API server merges deltas into fewer events:
    # count tokens from the final usage event, never from the number of events.
    content_events = [e for e in events if e["choices"]]
    assert len(content_events) >= 1
    assert "".join(_text_of(e) for e in content_events)
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.engine
def test_metrics_publish_capacity_in_tokens(engine: VllmEngine) -> None:
    info = engine.fetch_cache_config()
    assert info.block_size == 128  # the CPU backend's default
    assert info.kv_cache_size_tokens == 2 * MIB // KV_BYTES_PER_TOKEN == 2048
    assert info.num_gpu_blocks * info.block_size == info.kv_cache_size_tokens
    assert info.labels["kv_cache_memory_bytes"] == str(2 * MIB)
    text = engine.fetch_metrics_text()
    for metric in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert f"\n{metric}{{" in text, metric


@pytest.mark.engine
@pytest.mark.parametrize(
    ("kv_bytes", "block_size", "blocks", "tokens"),
    [
        # Not a whole number of 32 KiB blocks: rounded down. (Halving the bytes at the same
        # block size halves the blocks exactly: the same formula; one engine start less.)
        (1_000_000, 32, 30, 960),
    ],
    ids=["block-size-32-rounded-down-to-whole-blocks"],
)
def test_capacity_follows_kv_cache_memory_bytes(
    engine: VllmEngine,
    vllm_engine: EngineFactory,
    kv_bytes: int,
    block_size: int | None,
    blocks: int,
    tokens: int,
) -> None:
    shared = engine.fetch_cache_config()
    other = vllm_engine(kv_cache_memory_bytes=kv_bytes, block_size=block_size)
    info = other.fetch_cache_config()
    block = block_size or shared.block_size
    assert (info.num_gpu_blocks, info.block_size, info.capacity_tokens) == (blocks, block, tokens)
    assert info.capacity_tokens == kv_bytes // (block * KV_BYTES_PER_TOKEN) * block
    assert info.capacity_tokens < shared.capacity_tokens
    print(f"figures: engine start {other.start_seconds:.1f} s ({kv_bytes} bytes of KV)")


@pytest.mark.engine
def test_max_model_len_must_fit_in_all_blocks_but_one(vllm_engine: EngineFactory) -> None:
    # kv_cache_size_tokens says 2048, but one block is vLLM's null block: 2048 cannot start.
    with pytest.raises(EngineStartError, match="estimated maximum model length is 1920"):
        vllm_engine(kv_cache_memory_bytes=2 * MIB, max_model_len=2048)


@pytest.mark.engine
def test_priority_orders_the_waiting_queue(engine: VllmEngine) -> None:
    # Given the only sequence slot taken by a long request,
    # when three requests queue up in the order low (10), mid (5), high (header 0),
    # then the engine schedules high, mid, low: their queue times grow in that order.
    # (Response arrival order is no evidence: under load the API server delivers late.)
    # high's body says 10 too: the X-Vllm-Priority header overrides the body field.
    queue_ms: dict[str, float] = {}
    blocker_running = threading.Event()

    def block() -> None:
        body = {"model": "tiny", "prompt": "blocker", "max_tokens": USABLE_TOKENS_2MIB - 20}
        for _ in engine.stream_events("/v1/completions", {**body, "ignore_eos": True}, 120):
            blocker_running.set()  # its first token: it holds the only slot

    def complete(name: str, priority: int, headers: dict[str, str]) -> None:
        body = {"model": "tiny", "prompt": name, "max_tokens": 400, "ignore_eos": True}
        answer = engine.post_json(
            "/v1/completions", {**body, "priority": priority}, timeout=120, headers=headers
        )
        queue_ms[name] = answer["metrics"]["queue_time_ms"]

    with ThreadPoolExecutor(max_workers=4) as pool:
        blocker = pool.submit(block)
        assert blocker_running.wait(timeout=60)
        queued = []
        for name, priority, headers in [
            ("low", 10, {}),
            ("mid", 5, {}),
            ("high", 10, {"X-Vllm-Priority": "0"}),
        ]:
            queued.append(pool.submit(complete, name, priority, headers))
            # the engine orders arrivals by its own clock: the next one comes once this one
            # waits in the engine's queue
            wait_until(
                lambda: parse_engine_metrics(engine.fetch_metrics_text()).waiting >= len(queued),
                60,
                f"{name} waiting in the engine",
                interval=0.02,
            )
        for future in [blocker, *queued]:
            future.result()
    assert sorted(queue_ms, key=queue_ms.__getitem__) == ["high", "mid", "low"], queue_ms


@pytest.mark.engine
@pytest.mark.prometheus
def test_prometheus_scrapes_the_engine_capacity(
    engine: VllmEngine, prometheus_server: PrometheusFactory
) -> None:
    started = time.monotonic()
    prom = prometheus_server()  # no targets yet: added by a reload, as the operator would see
    prom.add_target("vllm", engine.target)
    series = prom.wait_for("vllm:cache_config_info", lambda result: len(result) == 1, timeout=30)
    labels = series[0]["metric"]
    assert labels["kv_cache_size_tokens"] == "2048"
    assert labels["instance"] == engine.target
    assert labels["job"] == "vllm"
    # No model_name on this series (other vllm:* series have one): join on instance/job.
    assert "model_name" not in labels
    print(
        f"figures: prometheus start + reload + first series in {time.monotonic() - started:.1f} s"
    )


@pytest.mark.redis
def test_redis_answers_and_restarts_on_the_same_port(redis_server: RedisFactory) -> None:
    server = redis_server()
    port = server.port
    with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
        client.sendall(b"SET k 1\r\n")
        assert client.recv(16) == b"+OK\r\n"
        server.kill()
        try:
            client.sendall(b"GET k\r\n")
            reply = client.recv(16)
        except ConnectionError:
            reply = b""
        assert reply == b""  # the connection died with the server
    assert not ping(port)
    started = time.monotonic()
    server.start()
    restart_ms = (time.monotonic() - started) * 1000
    assert (server.port, server.starts) == (port, 2)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
        client.sendall(b"GET k\r\n")
        assert client.recv(16) == b"$-1\r\n"  # persistence is off: the data is gone
    print(f"figures: redis restart to PING in {restart_ms:.0f} ms")
