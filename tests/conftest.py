"""Shared fixtures for the real parts: tiny model, vLLM engines, Prometheus, Redis, and
the gateway (as a process or in-process) with a fake engine.

Why here: the operator and gateway integration tests and the benchmarks all need the same
real servers, started the same way and always stopped. The helpers live in
tests/support/ (usable outside pytest too); these fixtures add scoping, clean-up, markers
and the missing-dependency policy.

Fixtures:

- ``tiny_model`` (session): ``Path`` of the tiny Llama (generated once, cached in .cache/).
- ``tiny_tokenizer_json`` (session): its ``tokenizer.json`` (for ``tokenizers.Tokenizer``).
- ``vllm_engine`` / ``vllm_engine_module``: factories; ``vllm_engine(kv_cache_memory_bytes=2**20,
  block_size=32, scheduling_policy="priority", extra_args=(...))`` starts an engine on the
  tiny model (keyword arguments are ``EngineConfig`` fields; ``model_dir`` defaults to the
  tiny model) and returns a healthy ``VllmEngine``. All are stopped at the end of the test
  (``vllm_engine``) or of the module (``vllm_engine_module``, to share one ~15 s start).
- ``tiny_engine`` (module): one engine serving ``tiny`` as the gateway tests use it (2 MiB
  of KV cache = 2,048 tokens, block 32, 8 sequences, priority scheduling); pair it with
  ``tests.builders.tiny_engine_admission_config``.
- ``prometheus_server``: factory ``prometheus_server(targets={"vllm": [engine.target]})``.
- ``redis_server`` / ``redis_server_module``: factory ``redis_server(port=None)``.
- ``gateway_process``: factory of ``kvpool gateway`` processes
  (:class:`tests.support.gateway.GatewayProcess`): ``gateway_process(config,
  redis_url=None, extra_args=())`` with ``config`` an ``AdmissionConfigBuilder`` (written
  to a file of the test's own), a config file ``Path``, or ``None`` with
  ``configmap=(namespace, api_url)`` to follow the operator's ConfigMap. Returns it
  started (``/readyz`` answers); in a coroutine use ``await gateway_process.started(...)``
  (starting off the event loop, so a FakeEngine on that loop keeps answering). Each test
  gets its own processes (own ports, log files), stopped at teardown; their log tails go
  into failure reports.
- ``fake_engine``: a started :class:`tests.support.gateway.FakeEngine` (an in-process
  OpenAI-compatible upstream recording what it receives), stopped after the test.
- ``gateway_client``: factory of in-process gateways behind aiohttp's test server:
  ``client, gateway = await gateway_client(config, store=None, metrics=..., wall_clock=...,
  tokenizers=..., upstream=..., capacity=..., **settings)``; ``config`` is an
  ``AdmissionConfig`` or builder, ``store`` a budget store (default: in memory),
  ``upstream`` a fake one (``tests.support.upstream.FakeUpstream``; default: the real one),
  ``capacity`` a ``CapacityShare`` (default: the static ``plan_share_percent``),
  ``settings`` ``GatewaySettings`` fields (default: no access log, ``/metrics`` on the API
  port). Closed at teardown.

Markers: a test using an engine fixture gets ``engine``, Prometheus ``prometheus``, Redis
``redis`` added automatically (so ``-m "not engine"`` deselects it); mark them explicitly
too, for the reader.

Missing dependencies (vLLM venv, prometheus, redis-server): with ``CI`` set (``CI=true``)
the test FAILS, since CI must have installed them; otherwise it is skipped with the
command that installs them (``make deps``).

When a test fails, the tail of every running server's log is added to its report.

Waiting: no test sleeps a guessed time. Code that reads a clock gets a
``tests.support.waiting.ManualClock``; waits for another process use ``wait_until`` /
``wait_until_async`` from the same module. Objects come from ``tests.builders``.
"""

from __future__ import annotations

import os
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, Protocol

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvpool.adapters.budget import BudgetStore, InMemoryBudgetStore
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import AdmissionConfig
from kvpool.gateway.capacity import CapacityShare
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.server import Gateway
from kvpool.gateway.settings import GatewaySettings
from kvpool.gateway.upstream import Upstream
from tests.builders import AdmissionConfigBuilder
from tests.support.engine import EngineConfig, EngineFactory, VllmEngine
from tests.support.gateway import FakeEngine, GatewayClientFactory, GatewayProcesses
from tests.support.prometheus import PrometheusFactory, PrometheusServer, prometheus_binary
from tests.support.redis_server import RedisFactory, RedisServer, redis_binary
from tests.support.tiny_model import tiny_model_dir, vllm_python

INSTALL_HINT = "run `make deps` (apt: prometheus redis-server; vLLM: scripts/ensure-vllm.sh)"

_FIXTURE_MARKERS = {
    "vllm_engine": "engine",
    "vllm_engine_module": "engine",
    "tiny_engine": "engine",
    "prometheus_server": "prometheus",
    "redis_server": "redis",
    "redis_server_module": "redis",
}


class _Server(Protocol):
    def stop(self) -> None: ...
    def log_tail(self, lines: int = 80) -> str: ...


# Servers started by the fixtures and not yet stopped: their logs go into failure reports.
_LIVE: dict[int, tuple[str, Callable[[], str]]] = {}


def missing(what: str) -> None:
    """Fail (under CI) or skip (locally) because ``what`` is not installed."""
    message = f"{what} is not installed: {INSTALL_HINT}"
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"CI: {message}", pytrace=False)
    pytest.skip(message)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in _FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()) and not item.get_closest_marker(marker):
                item.add_marker(getattr(pytest.mark, marker))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for name, tail in list(_LIVE.values()):
            report.sections.append((f"log tail: {name}", tail()))
    return report


# --- tiny model --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random-weight Llama (HF format), generated once and cached under .cache/."""
    try:
        return tiny_model_dir()
    except FileNotFoundError:
        missing("the vLLM venv (needed to generate the tiny model)")
        raise  # unreachable: missing() raises


@pytest.fixture(scope="session")
def tiny_tokenizer_json(tiny_model: Path) -> Path:
    """``tokenizer.json`` of the tiny model, for ``tokenizers.Tokenizer.from_file``."""
    return tiny_model / "tokenizer.json"


# --- factories ---------------------------------------------------------------------------


class _Started:
    """Keeps what a factory started, stops it all (last first) at teardown."""

    def __init__(self) -> None:
        self.servers: list[_Server] = []

    def add(self, name: str, server: _Server) -> None:
        self.servers.append(server)
        _LIVE[id(server)] = (name, server.log_tail)

    def stop_all(self) -> None:
        errors = []
        for server in reversed(self.servers):
            try:
                server.stop()
            except Exception as exc:  # stop every server even if one fails
                errors.append(exc)
            finally:
                _LIVE.pop(id(server), None)
        if errors:
            raise errors[0]


def _engine_factory(tiny_model: Path, tmp_dir: Path) -> Iterator[EngineFactory]:
    if not vllm_python().exists():
        missing(f"the vLLM venv ({vllm_python()})")
    started = _Started()

    def start(**fields: Any) -> VllmEngine:
        fields.setdefault("model_dir", tiny_model)
        index = len(started.servers)
        engine = VllmEngine(EngineConfig(**fields), log_path=tmp_dir / f"vllm-{index}.log")
        started.add(f"vllm engine {index} ({engine.base_url})", engine)
        return engine.start()

    try:
        yield start
    finally:
        started.stop_all()


@pytest.fixture
def vllm_engine(tiny_model: Path, tmp_path: Path) -> Iterator[EngineFactory]:
    """Factory: start a vLLM engine (``EngineConfig`` fields as keywords); stopped after it."""
    yield from _engine_factory(tiny_model, tmp_path)


@pytest.fixture(scope="module")
def vllm_engine_module(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineFactory]:
    """Factory like ``vllm_engine`` whose engines live until the end of the module."""
    yield from _engine_factory(tiny_model, tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="module")
def tiny_engine(vllm_engine_module: EngineFactory) -> VllmEngine:
    """The gateway tests' engine (see the module docstring), shared by a module."""
    return vllm_engine_module(
        served_model_name="tiny",
        kv_cache_memory_bytes=2 * 1024 * 1024,
        block_size=32,
        max_num_seqs=8,
        scheduling_policy="priority",
    )


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[PrometheusFactory]:
    """Factory: ``prometheus_server(targets={"job": ["127.0.0.1:PORT"]})`` -> ready server."""
    if prometheus_binary() is None:
        missing("prometheus")
    started = _Started()

    def start(
        targets: Mapping[str, Sequence[str]] | None = None, **kwargs: Any
    ) -> PrometheusServer:
        index = len(started.servers)
        server = PrometheusServer(tmp_path / f"prometheus-{index}", targets=targets, **kwargs)
        started.add(f"prometheus {index} ({server.url})", server)
        return server.start()

    try:
        yield start
    finally:
        started.stop_all()


def _redis_factory(tmp_dir: Path) -> Iterator[RedisFactory]:
    if redis_binary() is None:
        missing("redis-server")
    started = _Started()

    def start(port: int | None = None) -> RedisServer:
        index = len(started.servers)
        server = RedisServer(tmp_dir / f"redis-{index}", port=port)
        started.add(f"redis {index} (port {server.port})", server)
        return server.start()

    try:
        yield start
    finally:
        started.stop_all()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisFactory]:
    """Factory: ``redis_server()`` -> a running RedisServer (kill()/start() to crash/restart)."""
    yield from _redis_factory(tmp_path)


@pytest.fixture(scope="module")
def redis_server_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisFactory]:
    """Factory like ``redis_server`` whose servers live until the end of the module."""
    yield from _redis_factory(tmp_path_factory.mktemp("redis"))


# --- the gateway -------------------------------------------------------------------------


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[GatewayProcesses]:
    """Factory of ``kvpool gateway`` processes, stopped after the test."""
    started = _Started()
    try:
        yield GatewayProcesses(tmp_path, started.add)
    finally:
        started.stop_all()


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    """A started fake engine on the test's event loop, stopped after the test."""
    engine = await FakeEngine().start()
    try:
        yield engine
    finally:
        await engine.stop()


@pytest.fixture
async def gateway_client() -> AsyncIterator[GatewayClientFactory]:
    """Factory of in-process gateways behind aiohttp's test server, closed after the test."""
    clients: list[TestClient[Any, Any]] = []

    async def start(
        config: AdmissionConfig | AdmissionConfigBuilder,
        store: BudgetStore | None = None,
        *,
        metrics: GatewayMetrics | None = None,
        tokenizers: TokenizerCache | None = None,
        wall_clock: Callable[[], float] = time.time,
        upstream: Upstream | None = None,
        capacity: CapacityShare | None = None,
        **settings: Any,
    ) -> tuple[TestClient[Any, Any], Gateway]:
        settings = {"access_log": False, "metrics_on_api_port": True} | settings
        gateway = Gateway(
            config.obj() if isinstance(config, AdmissionConfigBuilder) else config,
            store or InMemoryBudgetStore(),
            settings=GatewaySettings(**settings),
            metrics=metrics,
            tokenizers=tokenizers,
            wall_clock=wall_clock,
            upstream=upstream,
            capacity=capacity,
        )
        client = TestClient(TestServer(gateway.app()))
        await client.start_server()
        clients.append(client)
        return client, gateway

    try:
        yield start
    finally:
        for client in clients:
            await client.close()
